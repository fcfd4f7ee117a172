"""OAuth for third-party HTTP MCP servers (device_agent/mcp_oauth.py): the `oauth` settings, the
private token file, refresh after a restart, and no secret in messages or to another origin.

The protocol itself (discovery, registration, PKCE, scopes) is proven end to end against the
official conformance suite's authorization servers (tests/conformance); here the token file and
the provider's first steps after a restart are checked by driving the SDK's auth flow directly."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from pathlib import Path

import httpx2
import pytest
from mcp.client.auth import OAuthFlowError
from mcp.shared.auth import OAuthMetadata, OAuthToken, ProtectedResourceMetadata
from pydantic import ValidationError

from device_agent.config import McpOAuthConfig, McpServerConfig
from device_agent.mcp_client import HttpTarget, OriginBoundHeaders
from device_agent.mcp_oauth import FileTokenStorage, HeadlessAuthorization, oauth_provider, token_path
from device_agent.policy import Policy
from device_agent.runner import mcp_host
from device_agent.toolsets.base import ToolsetContext
from tests.unit.device_agent.test_browser_profile import docs_toml

URL = "https://mcp.example.com/mcp"
AS = "https://auth.example.com"
SECRET = "s3cret-client-value"
ACCESS, REFRESH = "access-token-old-1234", "refresh-token-5678"


def credentials(**more: object) -> McpOAuthConfig:
    return McpOAuthConfig.model_validate({"client_id": "device-7", "client_secret": SECRET, **more})


# ---- settings


def test_client_credentials_need_the_client_id_and_exactly_one_of_secret_or_key() -> None:
    with pytest.raises(ValidationError, match="needs the device's client_id"):
        McpOAuthConfig.model_validate({"client_secret": SECRET})
    with pytest.raises(ValidationError, match="client_secret or private_key_file"):
        McpOAuthConfig.model_validate({"client_id": "device-7"})
    with pytest.raises(ValidationError, match="client_secret or private_key_file"):
        credentials(private_key_file="/etc/orrery/key.pem")
    with pytest.raises(ValidationError, match="absolute"):
        McpOAuthConfig.model_validate({"client_id": "device-7", "private_key_file": "key.pem"})


def test_the_authorization_code_grant_needs_no_client_but_a_secret_needs_its_id() -> None:
    assert McpOAuthConfig(grant="authorization_code").client_id is None
    with pytest.raises(ValidationError, match="needs the client_id"):
        McpOAuthConfig.model_validate({"grant": "authorization_code", "client_secret": SECRET})
    with pytest.raises(ValidationError, match="http"):
        McpOAuthConfig.model_validate({"grant": "authorization_code", "redirect_uri": "myapp:/cb"})


def test_oauth_is_for_an_http_server_and_replaces_a_static_bearer_token() -> None:
    with pytest.raises(ValidationError, match="oauth is for a server with a url"):
        McpServerConfig.model_validate(
            {"namespace": "t", "command": "x", "oauth": {"client_id": "a", "client_secret": "b"}}
        )
    for static in ({"bearer_token": "tok"}, {"headers": {"Authorization": "Bearer tok"}}):
        with pytest.raises(ValidationError, match="drop bearer_token"):
            McpServerConfig.model_validate(
                {"namespace": "t", "url": URL, "oauth": {"client_id": "a", "client_secret": "b"}, **static}
            )


def test_the_client_secret_is_in_no_repr_and_no_validation_error() -> None:
    server = McpServerConfig.model_validate(
        {"namespace": "t", "url": URL, "oauth": {"client_id": "a", "client_secret": SECRET}}
    )
    assert SECRET not in repr(server) and SECRET not in str(server.model_dump())
    with pytest.raises(ValidationError) as refused:
        McpOAuthConfig.model_validate({"client_id": "a", "client_secret": SECRET, "grant": "password"})
    assert SECRET not in str(refused.value)


# ---- the token file


async def test_tokens_are_kept_in_a_0600_file_in_a_0700_dir_and_survive_a_restart(tmp_path: Path) -> None:
    path = token_path(tmp_path, "tickets")
    await FileTokenStorage(path, URL).set_tokens(
        OAuthToken(access_token=ACCESS, refresh_token=REFRESH, expires_in=3600)
    )
    assert path == tmp_path / "oauth" / "tickets.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = FileTokenStorage(path, URL)  # a new process reads the same file
    tokens = await again.get_tokens()
    assert tokens is not None and (tokens.access_token, tokens.refresh_token) == (ACCESS, REFRESH)
    expires_at = again.expires_at()
    assert expires_at is not None and 3500 < expires_at - time.time() <= 3600


async def test_a_token_file_tightened_back_to_0600_when_rewritten(tmp_path: Path) -> None:
    path = token_path(tmp_path, "tickets")
    storage = FileTokenStorage(path, URL)
    await storage.set_tokens(OAuthToken(access_token=ACCESS))
    path.chmod(0o644)
    await storage.set_tokens(OAuthToken(access_token="newer-token"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_tokens_for_one_url_are_not_handed_to_another(tmp_path: Path) -> None:
    path = token_path(tmp_path, "tickets")
    await FileTokenStorage(path, URL).set_tokens(OAuthToken(access_token=ACCESS))
    assert await FileTokenStorage(path, "https://elsewhere.example.com/mcp").get_tokens() is None


# ---- refresh after a restart


def stored_expired_token(tmp_path: Path) -> FileTokenStorage:
    path = token_path(tmp_path, "tickets")
    metadata = OAuthMetadata.model_validate(
        {"issuer": AS, "authorization_endpoint": f"{AS}/authorize", "token_endpoint": f"{AS}/token"}
    )
    resource = ProtectedResourceMetadata.model_validate({"resource": URL, "authorization_servers": [AS]})
    state = {
        "server": URL,
        "tokens": {"access_token": ACCESS, "token_type": "Bearer", "refresh_token": REFRESH, "expires_in": 60},
        "expires_at": time.time() - 10,
        "authorization_server": metadata.model_dump(mode="json", exclude_none=True),
        "protected_resource": resource.model_dump(mode="json", exclude_none=True),
    }
    path.parent.mkdir(mode=0o700)
    path.write_text(json.dumps(state))
    return FileTokenStorage(path, URL)


async def test_an_expired_token_is_refreshed_at_the_authorization_server_before_use_and_stored(tmp_path: Path) -> None:
    storage = stored_expired_token(tmp_path)
    flow = oauth_provider(URL, credentials(issuer=AS), storage).async_auth_flow(httpx2.Request("POST", URL))
    refresh = await flow.__anext__()
    assert str(refresh.url) == f"{AS}/token"  # not the MCP server's own /token
    form = dict(httpx2.QueryParams(refresh.content.decode()))
    assert form["grant_type"] == "refresh_token" and form["refresh_token"] == REFRESH
    assert form["resource"] == URL
    assert refresh.headers["authorization"].startswith("Basic ")  # the client secret, to the AS only
    answer = {"access_token": "access-token-new-9999", "token_type": "Bearer", "expires_in": 3600}
    request = await flow.asend(httpx2.Response(200, json=answer, request=refresh))
    assert request.headers["authorization"] == "Bearer access-token-new-9999"
    await flow.aclose()
    tokens = await FileTokenStorage(storage.path, URL).get_tokens()
    assert tokens is not None and tokens.access_token == "access-token-new-9999"
    assert tokens.refresh_token == REFRESH  # kept when the server does not rotate it
    assert stat.S_IMODE(storage.path.stat().st_mode) == 0o600


async def test_without_the_authorization_servers_metadata_a_stored_refresh_token_is_not_sent_anywhere(
    tmp_path: Path,
) -> None:
    storage = stored_expired_token(tmp_path)
    state = json.loads(storage.path.read_text())
    del state["authorization_server"]
    storage.path.write_text(json.dumps(state))
    flow = oauth_provider(URL, credentials(), storage).async_auth_flow(httpx2.Request("POST", URL))
    first = await flow.__anext__()
    assert str(first.url) == URL and "authorization" not in first.headers  # no refresh guessed at the MCP origin
    await flow.aclose()


# ---- redaction and origins


async def test_a_stored_token_and_the_client_secret_are_redacted_from_error_text(tmp_path: Path) -> None:
    storage = stored_expired_token(tmp_path)
    ctx = ToolsetContext(workspace=tmp_path, policy=Policy(), data_dir=tmp_path)
    server = McpServerConfig.model_validate(
        {"namespace": "tickets", "url": URL, "oauth": {"client_id": "a", "client_secret": SECRET}}
    )
    target = mcp_host(server, ctx).target
    assert isinstance(target, HttpTarget) and target.auth is not None
    assert SECRET not in repr(target) and storage.path.exists()
    text = target.redact(f"server said: bad token {ACCESS}, refresh {REFRESH}, client {SECRET}")
    assert ACCESS not in text and REFRESH not in text and SECRET not in text
    assert text.count("[redacted]") == 3


async def test_a_bearer_token_never_goes_to_another_origin() -> None:
    bound = OriginBoundHeaders(URL, ())
    elsewhere = httpx2.Request("GET", "https://evil.example.net/x", headers={"Authorization": f"Bearer {ACCESS}"})
    await bound.on_request(elsewhere)
    assert "authorization" not in elsewhere.headers
    basic = httpx2.Request("POST", f"{AS}/token", headers={"Authorization": "Basic abc"})
    await bound.on_request(basic)  # client authentication at the authorization server stays
    assert basic.headers["authorization"] == "Basic abc"
    ours = httpx2.Request("POST", URL, headers={"Authorization": f"Bearer {ACCESS}"})
    await bound.on_request(ours)
    assert ours.headers["authorization"] == f"Bearer {ACCESS}"


async def answering(response: bytes) -> tuple[asyncio.Server, str]:
    """A loopback HTTP server answering every request with `response`: an authorization endpoint."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(response)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/authorize?state=st"


async def test_the_code_is_taken_from_the_authorization_endpoints_redirect_to_the_redirect_uri() -> None:
    found = b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1/callback?code=c0de&state=st\r\nContent-Length: 0\r\n\r\n"
    server, url = await answering(found)
    async with server:
        browser = HeadlessAuthorization("http://127.0.0.1/callback")
        await browser.redirect(url)
        result = await browser.callback()
    assert (result.code, result.state) == ("c0de", "st")


async def test_an_authorization_endpoint_that_wants_a_person_fails_with_a_reason_not_a_hang() -> None:
    page = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 7\r\n\r\nsign in"
    server, url = await answering(page)
    async with server:
        browser = HeadlessAuthorization("http://127.0.0.1/callback")
        with pytest.raises(OAuthFlowError, match="wants a person to sign in"):
            await browser.redirect(url)
    with pytest.raises(OAuthFlowError, match="no authorization code"):
        await browser.callback()


def test_the_docs_oauth_examples_are_valid_agent_settings(tmp_path: Path) -> None:
    blocks = docs_toml("[agent.mcp_servers.oauth]")
    assert len(blocks) >= 2  # the how-to and the configuration reference
    for block in blocks:
        agent = block["agent"]
        assert isinstance(agent, dict)
        servers = [McpServerConfig.model_validate(s) for s in agent["mcp_servers"]]
        oauth = [s.oauth for s in servers if s.oauth is not None]
        assert oauth and all(o.grant == "client_credentials" and o.issuer and o.client_secret for o in oauth)
