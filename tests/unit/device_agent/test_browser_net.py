"""The browser profile's URL rules (device_agent.browser_net) and which browser calls are writes."""

from __future__ import annotations

import asyncio

import pytest

from device_agent.browser_net import parse_origins, url_refusal
from device_agent.policy import call_spec, writes_file
from protocol.messages import ToolAnnotations, ToolSpec

LISTED = parse_origins(["http://127.0.0.1:8080"])


def reason(url: str) -> str | None:
    refusal = asyncio.run(url_refusal(url, LISTED))
    return None if refusal is None else refusal.reason


@pytest.mark.parametrize(
    "url",
    [
        "view-source:file:///etc/passwd",
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "javascript:alert(1)",
        " JavaScript:alert(1)",
        "data:text/html,<h1>x</h1>",
        "chrome://version",
        "blob:http://example.com/x",
        "about:blank",
        "localhost:8080",  # a URL of scheme `localhost` to the browser
    ],
)
def test_only_http_and_https_are_navigation_targets(url: str) -> None:
    assert reason(url) == "url_scheme"


@pytest.mark.parametrize("url", ["java\tscript:alert(1)", "http://exa\nmple.com/", "http://127.0.0.1:8080/\x00"])
def test_control_characters_are_refused_rather_than_guessed_at(url: str) -> None:
    assert reason(url) == "url_invalid"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8081/",
        "https://127.0.0.1:8080/",  # another scheme is another origin
        "127.0.0.1:8080",  # Playwright MCP makes it https://
        "http://localhost:8080/",  # the host as written is what is listed
        "http://0x7f.1:8080/",
        "http://2130706433:8080/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://127.0.0.1:9\\@example.com/",  # the browser reads `\\` as `/`: host 127.0.0.1
    ],
)
def test_private_addresses_are_refused_unless_listed(url: str) -> None:
    assert reason(url) == "private_address"


def test_a_listed_origin_and_public_addresses_are_allowed() -> None:
    assert reason("http://127.0.0.1:8080/page?q=1") is None
    assert reason("http://93.184.216.34/") is None
    assert reason("https://93.184.216.34:8443/") is None


def test_a_host_that_does_not_resolve_is_refused() -> None:
    assert reason("http://127.0.0.%31/") == "host_unresolved"
    assert reason("http://no-such-host.invalid/") == "host_unresolved"


def test_a_browser_call_given_an_output_file_is_a_write() -> None:
    snapshot = ToolSpec(
        name="browser.browser_snapshot",
        namespace="browser",
        annotations=ToolAnnotations(read_only=True, idempotent=True),
        tool_type="data_collection",
    )
    assert call_spec(snapshot, {}) is snapshot
    assert call_spec(snapshot, {"filename": ""}) is snapshot
    written = call_spec(snapshot, {"filename": "page.md"})
    assert (written.annotations.read_only, written.annotations.destructive, written.tool_type) == (
        False,
        True,
        "action",
    )
    # Only the browser's output files: another namespace's `filename` is its own business, and
    # the tools that read the file they are given are not made writes by it.
    assert not writes_file("files.read", {"filename": "x"})
    assert not writes_file("browser.browser_run_code_unsafe", {"filename": "script.js"})
