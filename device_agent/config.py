"""Agent settings from flags, `ORRERY_AGENT_*` variables and an optional TOML file (SPEC section 5)."""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from device_agent import browser_net
from device_agent.browser_net import parse_origins
from device_agent.killswitch import default_path as default_kill_switch_path
from device_agent.policy import Policy
from device_agent.sandbox import Limits
from device_agent.transfer import ArtifactLink, http_base

TOKEN_PREFIX = "orrd_"
# Without --data-dir, each device gets `<this>/<device id>/` under the directory the agent is
# started from, so several agents started from one directory never share a ledger.
DATA_ROOT = Path(".orrery-agent")


class McpOAuthConfig(BaseModel):
    """`oauth` of an HTTP `[[agent.mcp_servers]]` entry: the agent gets its access token itself,
    as the MCP authorization specification describes (the server's protected resource metadata
    names its authorization server; the scopes are the ones the server asks for).

    - `grant = "client_credentials"` (the default, for a device no person watches): the client
      registered for this device at the authorization server, `client_id` with `client_secret`
      (or with `private_key_file`, signing a `private_key_jwt` assertion instead of sending a
      secret).
    - `grant = "authorization_code"`: OAuth 2.1 with PKCE. The agent registers itself (a client
      ID metadata document at `client_metadata_url` when the server accepts one, else dynamic
      registration), or uses the pre-registered `client_id`/`client_secret`. It follows the
      authorization endpoint's redirect to `redirect_uri` itself, so this suits authorization
      servers that grant a device without a sign-in page; one that shows a page fails with a
      message that says so.

    Tokens (and a registered client) are kept in `<data dir>/oauth/<namespace>.json` (0600),
    refreshed with the refresh token when they expire, and never logged; `client_secret` and the
    tokens go to the authorization server and the MCP server's origin only."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    grant: Literal["client_credentials", "authorization_code"] = Field(
        default="client_credentials",
        description="client_credentials (unattended: the device's own client) or authorization_code (PKCE)",
    )
    client_id: str | None = Field(
        default=None, description="the client registered for this device (required for client_credentials)"
    )
    client_secret: SecretStr | None = Field(
        default=None, description="its secret: sent to the authorization server's token endpoint only; never logged"
    )
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post"] = Field(
        default="client_secret_basic", description="how client_secret is sent to the token endpoint"
    )
    private_key_file: Path | None = Field(
        default=None,
        description="client_credentials with private_key_jwt: a PEM private key file, absolute (instead of a secret)",
    )
    signing_algorithm: Literal["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"] = Field(
        default="RS256", description="the key's JWT signing algorithm"
    )
    issuer: str | None = Field(
        default=None,
        description="client_credentials: the authorization server the client belongs to; the secret "
        "goes to no other (unset: whichever one the MCP server names)",
    )
    client_metadata_url: str | None = Field(
        default=None,
        description="authorization_code: the https URL of this client's metadata document, used as its "
        "client_id where the authorization server accepts one",
    )
    redirect_uri: str = Field(
        default="http://127.0.0.1/callback",
        description="authorization_code: the redirect URI registered for the client",
    )

    @field_validator("issuer", "redirect_uri", "client_metadata_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and (urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).hostname):
            raise ValueError(f"an oauth issuer, redirect_uri or client_metadata_url must be an http(s) URL, got '{v}'")
        return v

    @field_validator("private_key_file")
    @classmethod
    def _absolute_key(cls, v: Path | None) -> Path | None:
        if v is not None and not v.expanduser().is_absolute():
            raise ValueError(f"oauth private_key_file must be an absolute path, got '{v}'")
        return v

    @model_validator(mode="after")
    def _one_client(self) -> McpOAuthConfig:
        if self.grant == "client_credentials":
            if self.client_id is None:
                raise ValueError("oauth grant client_credentials needs the device's client_id")
            if (self.client_secret is None) == (self.private_key_file is None):
                raise ValueError("oauth grant client_credentials needs client_secret or private_key_file (one of them)")
        else:
            if self.private_key_file is not None:
                raise ValueError("oauth private_key_file is for grant client_credentials")
            if self.client_secret is not None and self.client_id is None:
                raise ValueError("oauth client_secret needs the client_id it belongs to")
        return self

    def secrets(self) -> list[str]:
        """What must never appear in a message: the client secret."""
        return [self.client_secret.get_secret_value()] if self.client_secret is not None else []


class McpServerConfig(BaseModel):
    """A third-party MCP server: stdio (`command`, `args`, `env`) or streamable HTTP (`url`).

    `bearer_token` and `headers` are secrets: they are sent (as `Authorization: Bearer ...` and
    as given) only to requests for `url`'s origin, and never logged or reported. `roots` are the
    directories the server is told it may work in (MCP roots): the agent's workspace unless given;
    `roots = []` declares no roots capability at all. With `oauth` the agent gets its bearer token
    from the server's authorization server instead (OAuth, see `[agent.mcp_servers.oauth]`).

    A stdio server starts in a directory of its own under the data dir, never in the workspace
    (programs read configuration from their working directory: npm's `.npmrc`, Python's
    `sys.path`), unless the owner gives `cwd` (refused inside the workspace). With
    `sandbox = "bwrap"` it runs in the sandbox: `sandbox_writable` and `sandbox_readable` are more
    paths it may write or read there (e.g. under the hidden data dir), `sandbox_network` its
    network (unset: the agent's `sandbox_network`)."""

    # A refused setting is not echoed back: it may be a token, or a URL with one in it.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    namespace: str = Field(
        pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="the server's tools are named `<namespace>.<tool>`"
    )
    command: str | None = Field(default=None, description="a stdio server: the program to start")
    args: list[str] = Field(default_factory=list, description="its arguments")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="its environment, over HOME, PATH, USER, LOGNAME, SHELL and TERM of the agent's",
    )
    cwd: Path | None = Field(
        default=None,
        description="its working directory, absolute (default: <data dir>/mcp/<namespace>; never the workspace)",
    )
    url: str | None = Field(default=None, description="a streamable HTTP server: its http(s) URL (instead of command)")
    bearer_token: SecretStr | None = Field(
        default=None, description="sent as `Authorization: Bearer` to the url's origin only; never logged"
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="more headers for the url's origin only (secrets, never logged)"
    )
    oauth: McpOAuthConfig | None = Field(
        default=None, description="get the bearer token with OAuth (see `[agent.mcp_servers.oauth]`)"
    )
    read_only_tools: list[str] = Field(
        default_factory=list,
        description="tools (without namespace) to treat as read-only whatever their hints say: the kill switch, "
        "a stop and the safety budgets never refuse them, and retries treat them as safe",
    )
    hidden_tools: list[str] = Field(
        default_factory=list,
        description="tools (without namespace) the agent keeps for itself (the live view's input) and never "
        "offers to tasks",
    )
    roots: list[Path] | None = Field(
        default=None, description="MCP roots offered to the server, absolute (default: the workspace; [] offers none)"
    )
    sandbox_writable: list[Path] = Field(
        default_factory=list, description='with sandbox = "bwrap": more absolute paths the server may write'
    )
    sandbox_readable: list[Path] = Field(
        default_factory=list, description='with sandbox = "bwrap": more absolute paths the server may read'
    )
    sandbox_network: bool | None = Field(
        default=None, description="the server's network in the sandbox (unset: the agent's sandbox_network)"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an MCP server url must be an http(s) URL with a host, got '{_without_secrets(v)}'")
        if parts.username is not None or parts.password is not None:
            raise ValueError("put an MCP server's credentials in bearer_token or headers, not in its url")
        return v

    @field_validator("roots")
    @classmethod
    def _absolute(cls, v: list[Path] | None) -> list[Path] | None:
        for root in v or []:
            if not root.expanduser().is_absolute():
                raise ValueError(f"MCP roots must be absolute directories, got '{root}'")
        return v

    @field_validator("cwd", "sandbox_writable", "sandbox_readable")
    @classmethod
    def _absolute_paths(cls, v: Path | list[Path] | None) -> Path | list[Path] | None:
        for path in [v] if isinstance(v, Path) else v or []:
            if not path.expanduser().is_absolute():
                raise ValueError(f"an MCP server's cwd and sandbox paths must be absolute, got '{path}'")
        return v

    @model_validator(mode="after")
    def _one_authorization(self) -> McpServerConfig:
        if self.oauth is not None:
            if self.url is None:
                raise ValueError(f"MCP server '{self.namespace}': oauth is for a server with a url")
            if self.bearer_token is not None or any(n.lower() == "authorization" for n in self.headers):
                raise ValueError(
                    f"MCP server '{self.namespace}': oauth gets the bearer token itself; drop bearer_token "
                    "(or the Authorization header)"
                )
        return self

    def http_headers(self) -> dict[str, str]:
        """The headers for requests to `url`'s origin: `headers`, then the bearer token."""
        out = {name: value.get_secret_value() for name, value in self.headers.items()}
        if self.bearer_token is not None:
            out["Authorization"] = f"Bearer {self.bearer_token.get_secret_value()}"
        return out

    def root_dirs(self, workspace: Path) -> tuple[Path, ...]:
        """The directories offered as MCP roots: `roots` as given, else the workspace."""
        if self.roots is None:
            return (workspace.resolve(),)
        return tuple(r.expanduser().resolve() for r in self.roots)


def _without_secrets(url: str) -> str:
    """`url` for a message: without userinfo, query or fragment (they can carry credentials)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


# ---- browser devices
# `toolsets = [..., "browser"]` is a profile, not a built-in toolset: it adds Playwright's MCP
# server (pinned; `npx` fetches it once, or point `browser.command` at an installed copy) as the
# `browser` namespace, driving the system Chromium. Read-only tools are declared here so that the
# kill switch, a stop and the safety budgets never refuse them and retries treat them as safe.
PROFILES = ("browser",)
BROWSER_PACKAGE = "@playwright/mcp@0.0.83"
BROWSER_READ_ONLY_TOOLS = (
    "browser_snapshot",
    "browser_take_screenshot",
    "browser_find",
    "browser_console_messages",
    "browser_network_requests",
    "browser_network_request",
    "browser_wait_for",
)
# Tools that reach past the page wait for a person unless --unattended: arbitrary code in the
# server's Node process, script in the page, and device files handed to a page.
BROWSER_APPROVAL_REQUIRED = (
    "browser.browser_run_code_unsafe",
    "browser.browser_evaluate",
    "browser.browser_file_upload",
    "browser.browser_drop",
)


# The live view's own tools (`--caps vision`): device_agent/screen/browser.py calls them for a
# person's forwarded input; tasks never see them (a model aims by element reference instead).
BROWSER_VIEW_TOOLS = (
    "browser_mouse_click_xy",
    "browser_mouse_move_xy",
    "browser_mouse_drag_xy",
    "browser_mouse_down",
    "browser_mouse_up",
    "browser_mouse_wheel",
)


def browser_output_dir(data_dir: Path) -> Path:
    """Where the browser writes the files it names itself (outside the workspace)."""
    return data_dir / "browser" / "output"


class BrowserProfile(BaseModel):
    """`[agent.browser]`: how the `browser` profile starts Playwright's MCP server."""

    model_config = ConfigDict(extra="forbid")

    # The command line that starts `@playwright/mcp` (its own flags are added after it).
    command: list[str] = Field(
        default_factory=lambda: ["npx", "--yes", BROWSER_PACKAGE],
        min_length=1,
        description="the command line that starts @playwright/mcp (its flags are added after it)",
    )
    executable_path: Path = Field(default=Path("/usr/bin/chromium"), description="the Chromium or Chrome binary")
    headless: bool = Field(default=True, description="run the browser without a window")
    # Chromium's own sandbox; None: on, except when the agent runs as root (Chromium refuses it then).
    chromium_sandbox: bool | None = Field(
        default=None, description="Chromium's own sandbox (unset: on, except when the agent runs as root)"
    )
    # More `@playwright/mcp` flags, e.g. ["--allowed-origins", "https://intranet.example"].
    args: list[str] = Field(default_factory=list, description="more @playwright/mcp flags")
    # Added to the agent's approval_required while the profile is on.
    approval_required: list[str] = Field(
        default_factory=lambda: list(BROWSER_APPROVAL_REQUIRED),
        description="added to the agent's approval_required while the profile is on",
    )
    # The browser opens only http(s) at public addresses; these loopback, link-local or private
    # origins too, e.g. ["http://127.0.0.1:8080"] (scheme, host as written and port must match).
    allowed_private_origins: list[str] = Field(
        default_factory=list,
        description="loopback, link-local or private origins the browser may open too, e.g. http://127.0.0.1:8080 "
        "(it opens only http(s) at public addresses otherwise)",
    )

    @field_validator("allowed_private_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        parse_origins(v)  # ValueError names the origin that is not one
        return v

    def private_origins(self) -> frozenset[tuple[str, str, int]]:
        return parse_origins(self.allowed_private_origins)

    # Environment for the server (e.g. npm_config_registry for a registry mirror): the agent's
    # own environment is not passed on beyond HOME, PATH, USER, LOGNAME, SHELL and TERM.
    env: dict[str, str] = Field(
        default_factory=dict, description="environment for the server, e.g. npm_config_registry for a mirror"
    )

    def server(self, data_dir: Path, workspace: Path) -> McpServerConfig:
        """The `mcp_servers` entry the profile stands for: a browser profile of its own under the
        data dir (cookies and logins survive restarts, and never mix with a person's browser).

        The server runs behind `device_agent.browser_net`'s proxy, which every request of the
        browser goes through (redirects and a page's own requests included): it refuses
        loopback, link-local and private addresses but `allowed_private_origins`. Files the
        server names itself (no `filename` given) go to `<data dir>/browser/output`, outside the
        workspace; a call that gives `filename` writes into the workspace and counts as a write
        (device_agent.policy.call_spec)."""
        sandbox = self.chromium_sandbox if self.chromium_sandbox is not None else os.geteuid() != 0
        flags = [
            "--browser",
            "chromium",
            "--executable-path",
            str(self.executable_path),
            "--user-data-dir",
            str(data_dir / "browser" / "profile"),
            "--output-dir",
            str(browser_output_dir(data_dir)),
            *(["--headless"] if self.headless else []),
            *([] if sandbox else ["--no-sandbox"]),
            # The coordinate mouse tools: the live view's forwarded clicks (hidden from tasks, below).
            *([] if "--caps" in self.args else ["--caps", "vision"]),
            *self.args,
        ]
        # Run by path in isolated mode (-I): the module needs only the standard library, and
        # neither the working directory nor PYTHON* variables can put other code in its place.
        proxy = [sys.executable, "-I", str(Path(browser_net.__file__).resolve())]
        for origin in self.allowed_private_origins:
            proxy += ["--allow", origin]
        # No cwd: it starts in a directory of its own, not the workspace (npx would read a
        # `.npmrc` planted there). In the sandbox it may write its profile and output under
        # <data dir>/browser (the rest of the data dir stays hidden) and needs the network;
        # Playwright's cache (~/.cache/ms-playwright, which it writes even with
        # --executable-path) moves there too.
        return McpServerConfig(
            namespace="browser",
            command=proxy[0],
            args=[*proxy[1:], "--", *self.command, *flags],
            env={"XDG_CACHE_HOME": str(data_dir / "browser" / "cache"), **self.env},
            read_only_tools=list(BROWSER_READ_ONLY_TOOLS),
            hidden_tools=list(BROWSER_VIEW_TOOLS),
            sandbox_writable=[data_dir / "browser"],
            sandbox_network=True,
        )

    def problem(self) -> str | None:
        """Why the browser could not start, as far as can be told without starting it."""
        if not os.access(self.executable_path, os.X_OK):
            return (
                f"no browser at executable_path '{self.executable_path}': install Chromium (apt-get install "
                "chromium) or set [agent.browser] executable_path to a Chromium or Chrome binary"
            )
        return None


class ViewSettings(BaseModel):
    """`[agent.view]`: what the device's owner lets people do through the live view."""

    model_config = ConfigDict(extra="forbid")

    allow_watching: bool = Field(
        default=True, description="people with access to the device may watch its screen live (false forbids it)"
    )
    allow_input: bool = Field(
        default=True,
        description="an operator who took the device over may click and type through the live view "
        "(false: they may watch only)",
    )


class RecordingSettings(BaseModel):
    """`[agent.recording]`: screen recordings of the GUI and browser attempts the server asks for."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="record the screen while a batch asks for it (needs ffmpeg)")
    fps: float = Field(default=2.0, gt=0, le=10, description="frames a second a recording keeps")
    max_bytes: int = Field(
        default=20_000_000, ge=100_000, description="largest recording video uploaded (frames are dropped to fit)"
    )


class AgentConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ORRERY_AGENT_", extra="ignore")

    server: str = Field(default="http://127.0.0.1:8765", description="the orchestrator's base URL (http(s) or ws(s))")
    servers: list[str] = Field(default_factory=list, description="more URLs to fail over to")
    token: str = Field(default="", description="the device token `orrery devices enroll` printed")
    device_id: str | None = Field(default=None, description="must match the token's device (default: the token's)")
    labels: dict[str, str] = Field(
        default_factory=dict, description="labels reported in hello (enrollment's win on a conflicting key)"
    )
    data_dir: Path | None = Field(  # default: DATA_ROOT / <device id> (see resolved_data_dir)
        default=None,
        description="this device's ledger, audit log and lock; one agent per data dir "
        "(default: ./.orrery-agent/<device id>)",
    )
    workspace: Path | None = Field(
        default=None, description="the directory tools work in (default: <data dir>/workspace)"
    )
    ca_file: Path | None = Field(default=None, description="CA bundle to verify an https server")
    toolsets: list[str] = Field(
        default_factory=lambda: ["system", "shell", "files"],
        description="built-in toolsets (system, shell, files, gui) and profiles (browser)",
    )
    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list, description="third-party MCP servers, each under its own namespace (below)"
    )
    # Settings of the `browser` profile (used only with "browser" in `toolsets`).
    browser: BrowserProfile = Field(
        default_factory=BrowserProfile,
        description='the browser profile\'s settings, with "browser" in toolsets (below)',
    )

    # The live view and screen recordings (device_agent/screen/).
    view: ViewSettings = Field(default_factory=ViewSettings, description="the owner's say over the live view (below)")
    recording: RecordingSettings = Field(
        default_factory=RecordingSettings, description="screen recordings of attempts (below)"
    )

    shell_allow: list[str] | None = Field(
        default=None, description="only these programs may shell.run (a guardrail, not a security boundary)"
    )
    shell_deny: list[str] = Field(
        default_factory=list, description="programs shell.run refuses (a guardrail, not a security boundary)"
    )
    # The allow/deny lists are guardrails; "bwrap" confines every shell.run (device_agent/sandbox.py).
    sandbox: Literal["none", "bwrap"] = Field(
        default="none", description="bwrap: every shell.run and stdio MCP server runs in a bubblewrap sandbox"
    )
    sandbox_network: bool = Field(default=False, description="sandboxed programs may use the network")
    # Per-command limits inside the sandbox; 0 turns one off.
    sandbox_memory_mb: int = Field(
        default=Limits.memory_mb, ge=0, description="per sandboxed command: writable memory in MiB (0: no limit)"
    )
    sandbox_cpu_s: int = Field(
        default=Limits.cpu_s, ge=0, description="per sandboxed command: CPU seconds (0: no limit)"
    )
    sandbox_max_processes: int = Field(
        default=Limits.max_processes, ge=0, description="per sandboxed command: processes at once (0: no limit)"
    )
    sandbox_file_size_mb: int = Field(
        default=Limits.file_size_mb,
        ge=0,
        description="per sandboxed command: largest file written in MiB (0: no limit)",
    )
    # Screen input needs the owner's approval unless the agent runs --unattended (device-safety).
    approval_required: list[str] = Field(
        default_factory=lambda: [
            *("gui.click", "gui.double_click", "gui.type", "gui.key", "gui.scroll", "gui.drag"),
            *("gui.set_value", "gui.focus_window", "gui.launch"),  # element and window inputs
        ],
        description="tools (patterns) that wait for a person's approval before they run",
    )
    unattended: bool = Field(default=False, description="run tools that need approval without asking")
    # Approvals for this device are given only on the device itself (`orrery agent approve ID`);
    # the orchestrator shows them but cannot decide them.
    approvals_local_only: bool = Field(
        default=False, description="only `orrery agent approve ID` on this device may decide its approvals"
    )
    kill_switch: bool = Field(default=False, description="refuse every action tool (read-only tools keep working)")
    # ---- safety budgets
    # The kill switch flipped at run time: on while this file exists (default <data dir>/kill-switch).
    kill_switch_file: Path | None = Field(
        default=None, description="the kill switch is on while this file exists (default: <data dir>/kill-switch)"
    )
    audit_fsync: bool = Field(default=False, description="fdatasync every audit line (survives a power loss)")
    # Safety budgets, 0 = off: destructive actions per sliding minute, and consecutive outcomes
    # that are uncertain, policy_denied or approval_denied. A breach cordons the device.
    max_destructive_per_minute: int = Field(
        default=0, ge=0, description="destructive actions per sliding minute; a breach cordons the device (0: off)"
    )
    max_consecutive_bad_outcomes: int = Field(
        default=0,
        ge=0,
        description="uncertain, policy_denied or approval_denied outcomes in a row; a breach cordons the device "
        "(0: off)",
    )
    max_output_bytes: int = Field(
        default=1_000_000, ge=1024, description="shell.run keeps this much of each output stream; the rest is counted"
    )
    max_result_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description="a larger result is truncated with a marker and a preview, never dropped",
    )
    max_frame_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, description="largest protocol frame the agent accepts from the server"
    )
    # The largest artifact this device publishes or fetches (files.publish_artifact/fetch_artifact).
    max_artifact_bytes: int = Field(
        default=1024 * 1024 * 1024, ge=0, description="largest artifact this device publishes or fetches"
    )
    log_format: Literal["text", "json"] = Field(default="text", description="text or json (one object per line)")
    # debug also shows the MCP SDK's and HTTP client's lines (they include tool arguments)
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="debug also shows the MCP SDK's and HTTP client's lines (with tool arguments)"
    )

    @field_validator("token")
    @classmethod
    def _strip(cls, v: str) -> str:
        return v.strip()

    @property
    def resolved_data_dir(self) -> Path:
        """`data_dir` as given, else `./.orrery-agent/<device id>/` (the device the token names)."""
        if self.data_dir is not None:
            return self.data_dir.resolve()
        return (DATA_ROOT / dir_name(self.identity() or "no-device")).resolve()

    @property
    def resolved_kill_switch_file(self) -> Path:
        return (self.kill_switch_file or default_kill_switch_path(self.resolved_data_dir)).resolve()

    @property
    def resolved_workspace(self) -> Path:
        return (self.workspace or self.resolved_data_dir / "workspace").resolve()

    def token_device_id(self) -> str | None:
        """The device id a token names (`orrd_<device id>.<secret>`), if it has that shape."""
        if not self.token.startswith(TOKEN_PREFIX) or "." not in self.token:
            return None
        return self.token[len(TOKEN_PREFIX) :].rsplit(".", 1)[0] or None

    def identity(self) -> str:
        return self.device_id or self.token_device_id() or ""

    def builtin_toolsets(self) -> list[str]:
        """`toolsets` less the profiles (which stand for MCP servers, see `all_mcp_servers`)."""
        return [name for name in self.toolsets if name not in PROFILES]

    def all_mcp_servers(self) -> list[McpServerConfig]:
        """`mcp_servers` and the servers the profiles in `toolsets` stand for."""
        servers = list(self.mcp_servers)
        if "browser" in self.toolsets:
            servers.append(self.browser.server(self.resolved_data_dir, self.resolved_workspace))
        return servers

    def effective_approval_required(self) -> list[str]:
        """`approval_required` and the patterns the profiles in `toolsets` add."""
        extra = self.browser.approval_required if "browser" in self.toolsets else []
        return [*self.approval_required, *(p for p in extra if p not in self.approval_required)]

    def server_urls(self) -> list[str]:
        return [agent_url(u) for u in [self.server, *self.servers]]

    def artifact_link(self) -> ArtifactLink:
        """How the artifact tools reach the orchestrator: the same URLs, token and CA file."""
        servers = tuple(http_base(u) for u in self.server_urls())
        return ArtifactLink(servers, self.token, self.ca_file, self.max_artifact_bytes)

    def policy_report(self) -> dict[str, Any]:
        """What the owner allows, as `hello.info.policy` reports it (the server keeps it as given)."""
        return {
            "shell_allow": list(self.shell_allow) if self.shell_allow is not None else None,
            "shell_deny": list(self.shell_deny),
            "approval_required": self.effective_approval_required(),
            "unattended": self.unattended,
            "approvals_local_only": self.approvals_local_only,
            "kill_switch": self.kill_switch,
            "sandbox": self.sandbox_report(),
            "safety_budgets": {
                "max_destructive_per_minute": self.max_destructive_per_minute,
                "max_consecutive_bad_outcomes": self.max_consecutive_bad_outcomes,
            },
        }

    def sandbox_limits(self) -> Limits:
        return Limits(
            memory_mb=self.sandbox_memory_mb,
            cpu_s=self.sandbox_cpu_s,
            max_processes=self.sandbox_max_processes,
            file_size_mb=self.sandbox_file_size_mb,
        )

    def sandbox_report(self) -> dict[str, Any]:
        """How `shell.run` is confined: `{"kind": "none"}`, or bwrap with its network and limits."""
        if self.sandbox == "none":
            return {"kind": "none"}
        return {"kind": self.sandbox, "network": self.sandbox_network, "limits": self.sandbox_limits().report()}

    def policy(self) -> Policy:
        return Policy(
            shell_allow=tuple(self.shell_allow) if self.shell_allow is not None else None,
            shell_deny=tuple(self.shell_deny),
            max_output_bytes=self.max_output_bytes,
            unattended=self.unattended,
            kill_switch=self.kill_switch,
            browser_private_origins=self.browser.private_origins() if "browser" in self.toolsets else frozenset(),
        )


def dir_name(device_id: str) -> str:
    """A device id as one safe path component (ids are `dev_<hex>`; anything else is defanged)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", device_id).lstrip(".")
    return name or "no-device"


def agent_url(server: str) -> str:
    """`--server` takes the orchestrator's http(s) or ws(s) base URL; return its `/v1/agent` URL."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None:
        raise ValueError(f"--server must be an http(s) or ws(s) URL, got '{server}'")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1/agent"):
        path += "/v1/agent"
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def load(config_file: Path | None, overrides: dict[str, Any]) -> AgentConfig:
    """Precedence: flags, then environment, then the TOML file, then defaults."""
    file_values: dict[str, Any] = {}
    if config_file is not None:
        with config_file.open("rb") as fh:
            file_values = tomllib.load(fh)
        file_values = file_values.get("agent", file_values)
    env_values = AgentConfig().model_dump(exclude_unset=True)
    merged = {**file_values, **env_values, **{k: v for k, v in overrides.items() if v is not None}}
    return AgentConfig(**merged)
