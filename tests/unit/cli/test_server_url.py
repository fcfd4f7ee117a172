"""`--server` in the CLI takes what the agent's `--server` takes."""

from __future__ import annotations

import pytest

from orrery.sdk import Client, server_url


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:8765", "http://127.0.0.1:8765"),
        ("orchestrator:8765/", "http://orchestrator:8765"),
        ("http://127.0.0.1:8765/", "http://127.0.0.1:8765"),
        ("https://fleet.example:8443", "https://fleet.example:8443"),
        ("ws://127.0.0.1:8765/v1/agent", "http://127.0.0.1:8765"),
        ("wss://fleet.example/base/v1/agent", "https://fleet.example/base"),
        ("[::1]:8765", "http://[::1]:8765"),
    ],
)
def test_server_url(given: str, url: str) -> None:
    assert server_url(given) == url
    with Client(given, "orrk_x") as c:
        assert c.server == url
