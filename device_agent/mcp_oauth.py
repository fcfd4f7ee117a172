"""OAuth for the agent's HTTP MCP client: the MCP SDK's providers, fed from `[agent.mcp_servers.oauth]`,
with tokens kept in the agent's private data dir.

The SDK's `OAuthClientProvider` (and its client-credentials and private_key_jwt variants) does the
protocol: protected resource metadata (RFC 9728), authorization server metadata (RFC 8414, OIDC),
registration (pre-registered, client ID metadata document, dynamic), PKCE, scope selection and
step-up, resource indicators (RFC 8707), refresh. Its own requests (metadata, registration,
token) go where the metadata says; the bearer token goes only on the MCP requests it
authenticates, and the transport follows those within the server's origin only. What is ours:

- `FileTokenStorage`: the tokens and the registered client in `<data dir>/oauth/<namespace>.json`,
  0600 like the device token, bound to the server's URL (a changed URL starts afresh), with the
  access token's expiry and the authorization server's metadata, so that after a restart an
  expired token is refreshed at the authorization server, not sent (nor refreshed elsewhere).
- `HeadlessAuthorization`: the authorization code flow's browser step done by the agent itself
  (no person watches a device): it requests the authorization URL and takes the code from the
  redirect to `redirect_uri`, which a server that grants a device without a sign-in page sends
  at once. A server that shows a page instead gets a clear failure, not a hang.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2
from mcp.client.auth import OAuthClientProvider, OAuthFlowError
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.oauth2 import OAuthContext
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthMetadata,
    OAuthToken,
    ProtectedResourceMetadata,
)
from pydantic import AnyUrl

from device_agent.config import McpOAuthConfig
from device_agent.datadir import OAUTH_NAME, PRIVATE_DIR, PRIVATE_FILE

log = logging.getLogger("orrery.agent.oauth")

CLIENT_NAME = "Orrery device agent"
AUTHORIZE_TIMEOUT_S = 30.0
AUTHORIZE_REDIRECTS = 5  # hops within the authorization server before the redirect to redirect_uri


def token_path(data_dir: Path, namespace: str) -> Path:
    return data_dir / OAUTH_NAME / f"{namespace}.json"


class FileTokenStorage:
    """The SDK's `TokenStorage` as a private JSON file: tokens, their expiry, the registered client.

    Every write replaces the file through a 0600 temporary file in a 0700 directory. The file
    names the server URL it was obtained for; for any other URL it holds nothing."""

    def __init__(self, path: Path, server_url: str, preregistered: OAuthClientInformationFull | None = None) -> None:
        self.path = path
        self.server_url = server_url
        self.preregistered = preregistered
        self.context: OAuthContext | None = None  # the provider's, once `bind` is called

    def bind(self, context: OAuthContext) -> None:
        """Restore into (and save from) the context of the provider this storage serves.

        After a restart the SDK knows the stored token but not when it expires, nor where its
        authorization server is: without these it would send an expired token, or send the
        refresh token (and client secret) to the MCP server's own `/token`. The file holds both."""
        self.context = context

    def _read(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring the unreadable OAuth token file %s (%s)", self.path, type(exc).__name__)
            return {}
        return state if state.get("server") == self.server_url else {}

    def _write(self, **changes: Any) -> None:
        state = {**self._read(), **changes, "server": self.server_url}
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE)
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), PRIVATE_FILE)  # whatever the umask, and if a wider one was there
            out.write(json.dumps(state))
        os.replace(tmp, self.path)

    async def get_tokens(self) -> OAuthToken | None:
        state = self._read()
        if not state.get("tokens"):
            return None
        tokens = OAuthToken.model_validate(state["tokens"])
        context = self.context
        if context is not None:  # the provider is loading what it holds (a start or restart)
            context.token_expiry_time = self.expires_at()
            if context.oauth_metadata is None:
                context.oauth_metadata, context.protected_resource_metadata = self.metadata()
            if context.oauth_metadata is None and tokens.refresh_token is not None:
                # Where to refresh is unknown: authorize afresh (discovery) rather than guess.
                tokens = tokens.model_copy(update={"refresh_token": None})
        return tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        expires_at = time.time() + tokens.expires_in if tokens.expires_in is not None else None
        changes: dict[str, Any] = {
            "tokens": tokens.model_dump(mode="json", exclude_none=True),
            "expires_at": expires_at,
        }
        if self.context is not None and self.context.oauth_metadata is not None:
            # The metadata the tokens came with: where to refresh them after a restart.
            resource = self.context.protected_resource_metadata
            changes["authorization_server"] = self.context.oauth_metadata.model_dump(mode="json", exclude_none=True)
            changes["protected_resource"] = resource.model_dump(mode="json", exclude_none=True) if resource else None
        self._write(**changes)

    def expires_at(self) -> float | None:
        """When the stored access token expires (epoch seconds), if the server said."""
        value = self._read().get("expires_at")
        return float(value) if isinstance(value, int | float) else None

    def metadata(self) -> tuple[OAuthMetadata | None, ProtectedResourceMetadata | None]:
        """The authorization server's and the resource's metadata the stored tokens came with."""
        state = self._read()
        server, resource = state.get("authorization_server"), state.get("protected_resource")
        return (
            OAuthMetadata.model_validate(server) if server else None,
            ProtectedResourceMetadata.model_validate(resource) if resource else None,
        )

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        if self.preregistered is not None:
            return self.preregistered
        info = self._read().get("client")
        return OAuthClientInformationFull.model_validate(info) if info else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self._write(client=client_info.model_dump(mode="json", exclude_none=True))

    def secrets(self) -> list[str]:
        """The stored tokens and client secret: never to appear in a message."""
        state = self._read()
        tokens, client = state.get("tokens") or {}, state.get("client") or {}
        found = [tokens.get("access_token"), tokens.get("refresh_token"), client.get("client_secret")]
        return [s for s in found if isinstance(s, str) and s]


class HeadlessAuthorization:
    """The authorization code flow's redirect and callback handlers, for an agent with no browser.

    `redirect` requests the authorization URL (PKCE challenge, state, no credentials) and follows
    the authorization server's redirects until one leads to `redirect_uri`; `callback` hands the
    code and state from it to the SDK, which checks the state and exchanges the code."""

    def __init__(self, redirect_uri: str) -> None:
        self.redirect_uri = redirect_uri
        self._result: AuthorizationCodeResult | None = None

    async def redirect(self, authorization_url: str) -> None:
        self._result = None
        url = authorization_url
        async with httpx2.AsyncClient(follow_redirects=False, timeout=AUTHORIZE_TIMEOUT_S) as http:
            for _ in range(AUTHORIZE_REDIRECTS):
                response = await http.get(url)
                location = response.headers.get("location") if response.is_redirect else None
                if location is None:
                    raise OAuthFlowError(
                        f"the authorization endpoint {_public(authorization_url)} answered "
                        f"{response.status_code} instead of redirecting to {self.redirect_uri}: it wants a "
                        'person to sign in, which no one does on a device; use grant = "client_credentials"'
                    )
                url = str(httpx2.URL(url).join(location))
                if _same_endpoint(url, self.redirect_uri):
                    self._result = _code_from(url)
                    return
        raise OAuthFlowError(f"the authorization endpoint {_public(authorization_url)} redirected too often")

    async def callback(self) -> AuthorizationCodeResult:
        if self._result is None:
            raise OAuthFlowError("no authorization code was received")
        return self._result


def _same_endpoint(url: str, redirect_uri: str) -> bool:
    a, b = urlsplit(url), urlsplit(redirect_uri)
    return (a.scheme, a.netloc, a.path) == (b.scheme, b.netloc, b.path)


def _code_from(url: str) -> AuthorizationCodeResult:
    query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    if "code" not in query:
        error = query.get("error", "no code")
        raise OAuthFlowError(f"the authorization server refused: {error} {query.get('error_description', '')}".strip())
    return AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))


def _public(url: str) -> str:
    return str(httpx2.URL(url).copy_with(query=None, fragment=None))


def oauth_provider(url: str, oauth: McpOAuthConfig, storage: FileTokenStorage) -> OAuthClientProvider:
    """The SDK provider that gets and refreshes the bearer token for the MCP server at `url`,
    keeping what it gets in `storage` (bound to it here)."""
    provider = _provider(url, oauth, storage)
    storage.bind(provider.context)
    return provider


def _provider(url: str, oauth: McpOAuthConfig, storage: FileTokenStorage) -> OAuthClientProvider:
    if oauth.grant == "client_credentials":
        assert oauth.client_id is not None  # McpOAuthConfig requires it for this grant
        with warnings.catch_warnings():
            # Without `issuer` the SDK warns that the server names the authorization server; the
            # owner chose that (the docs say what `issuer` adds), so it is not repeated per start.
            warnings.simplefilter("ignore")
            if oauth.private_key_file is not None:
                key = SignedJWTParameters(
                    issuer=oauth.client_id,
                    subject=oauth.client_id,
                    signing_key=oauth.private_key_file.expanduser().read_text(),
                    signing_algorithm=oauth.signing_algorithm,
                )
                assertion = key.create_assertion_provider()
                return PrivateKeyJWTOAuthProvider(url, storage, oauth.client_id, assertion, issuer=oauth.issuer)
            assert oauth.client_secret is not None
            return ClientCredentialsOAuthProvider(
                url,
                storage,
                oauth.client_id,
                oauth.client_secret.get_secret_value(),
                token_endpoint_auth_method=oauth.token_endpoint_auth_method,
                issuer=oauth.issuer,
            )
    secret = oauth.client_secret.get_secret_value() if oauth.client_secret is not None else None
    method = oauth.token_endpoint_auth_method if secret is not None else "none"
    redirect_uris: list[AnyUrl] = [AnyUrl(oauth.redirect_uri)]
    if oauth.client_id is not None:  # pre-registered: used as it is, never registered again
        storage.preregistered = OAuthClientInformationFull(
            client_id=oauth.client_id,
            client_secret=secret,
            redirect_uris=redirect_uris,
            grant_types=["authorization_code", "refresh_token"],
            token_endpoint_auth_method=method,
        )
    metadata = OAuthClientMetadata(
        client_name=CLIENT_NAME,
        redirect_uris=redirect_uris,
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
    )
    browser = HeadlessAuthorization(oauth.redirect_uri)
    return OAuthClientProvider(
        url, metadata, storage, browser.redirect, browser.callback, client_metadata_url=oauth.client_metadata_url
    )
