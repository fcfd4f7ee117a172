"""`python -m device_agent.conformance`, the client the MCP conformance suite runs (tests/conformance):
what it says when there is nothing to test."""

from __future__ import annotations

import stat
from pathlib import Path

from pytest import CaptureFixture

from device_agent import conformance
from tests.support import free_port


def test_without_a_url_it_prints_its_usage_and_exits_2(capsys: CaptureFixture[str]) -> None:
    assert conformance.main([]) == 2
    assert "usage: python -m device_agent.conformance URL" in capsys.readouterr().err


def test_a_server_that_is_not_there_is_a_failure_that_says_why(capsys: CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    assert conformance.main([url]) == 1
    err = capsys.readouterr().err
    assert "toolset 'conformance' failed to start" in err and "127.0.0.1" in err, err


def test_the_auth_scenarios_context_becomes_the_oauth_section_an_owner_would_write(tmp_path: Path) -> None:
    assert conformance.oauth_config("tools_call", {}, tmp_path) is None
    basic = conformance.oauth_config(
        "auth/client-credentials-basic", {"client_id": "c", "client_secret": "s"}, tmp_path
    )
    assert basic is not None and basic.grant == "client_credentials" and basic.client_secret is not None
    pem = {"client_id": "c", "private_key_pem": "-----BEGIN PRIVATE KEY-----", "signing_algorithm": "ES256"}
    jwt = conformance.oauth_config("auth/client-credentials-jwt", pem, tmp_path)
    assert jwt is not None and jwt.private_key_file is not None and jwt.signing_algorithm == "ES256"
    assert stat.S_IMODE(jwt.private_key_file.stat().st_mode) == 0o600  # kept as an owner keeps a key
    pre = conformance.oauth_config("auth/pre-registration", {"client_id": "c", "client_secret": "s"}, tmp_path)
    assert pre is not None and (pre.grant, pre.client_id) == ("authorization_code", "c")
    dynamic = conformance.oauth_config("auth/metadata-default", {}, tmp_path)
    assert dynamic is not None and dynamic.client_id is None
    assert dynamic.client_metadata_url == conformance.CLIENT_METADATA_URL
