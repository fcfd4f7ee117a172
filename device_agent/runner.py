"""Assemble and run an agent from its config: toolsets, ledger, audit log, router."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from device_agent import orphans
from device_agent.agent import Agent, AgentFailed, TokenRefused
from device_agent.audit import AuditLog
from device_agent.budgets import SafetyBudgets
from device_agent.config import PROFILES, AgentConfig, McpServerConfig
from device_agent.datadir import AUDIT_NAME, LEDGER_NAME, DataDirBusy, DataDirLock, Footprint, make_private
from device_agent.faults import CrashPoints
from device_agent.guards import Guards
from device_agent.killswitch import KillSwitch
from device_agent.launch import LaunchRefused, stdio_target
from device_agent.ledger import Ledger, LedgerError, LedgerOwned
from device_agent.mcp_client import ClientFeatures, HttpTarget, public_url
from device_agent.mcp_oauth import FileTokenStorage, oauth_provider, token_path
from device_agent.router import Router
from device_agent.sandbox import Sandbox, SandboxUnavailable
from device_agent.toolset_host import ToolsetHost, ToolsetUnavailable
from device_agent.toolsets import approval, files, gui, shell, system
from device_agent.toolsets.base import ToolsetContext

log = logging.getLogger("orrery.agent")

# "gui" is opt-in (`--toolset gui` or `toolsets` in the config): it is not in the default list.
BUILTIN = {"system": system.build, "shell": shell.build, "files": files.build, "gui": gui.build}
KNOWN = f"built-in ones are {sorted(BUILTIN)}, profiles {list(PROFILES)} (see the agent configuration reference)"
# Readiness checks of toolsets that depend on more than Python (`orrery agent --check`).
CHECKS: dict[str, Callable[[ToolsetContext], dict[str, Any]]] = {"gui": gui.check, "shell": shell.check}


class ConfigError(ValueError):
    pass


def validate(config: AgentConfig) -> None:
    """What must hold before anything is created on disk (the data dir is named after the device)."""
    if not config.token:
        raise ConfigError("a device token is required: --token or ORRERY_AGENT_TOKEN ('orrery devices enroll')")
    if not config.identity():
        raise ConfigError("cannot tell the device id from this token; pass --device-id")
    token_id = config.token_device_id()
    if config.device_id and token_id and config.device_id != token_id:
        raise ConfigError(f"--device-id {config.device_id} does not match the token's device ({token_id})")


def build(config: AgentConfig) -> Agent:
    validate(config)
    for url in config.server_urls():
        host = urlsplit(url).hostname or ""
        if url.startswith("ws://") and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning(
                "connecting to %s over plain ws://: the token and all traffic are unencrypted; "
                "use https:// (wss) for anything but loopback",
                url,
            )
    try:
        ctx = toolset_context(config)
    except SandboxUnavailable as exc:  # never run unconfined when the owner asked for the sandbox
        raise ConfigError(str(exc)) from None
    data_dir = config.resolved_data_dir
    audit = AuditLog(data_dir / AUDIT_NAME, fsync=config.audit_fsync)
    guards = Guards(
        audit,
        KillSwitch(config.resolved_kill_switch_file, config.kill_switch),
        SafetyBudgets(config.max_destructive_per_minute, config.max_consecutive_bad_outcomes),
    )
    router = Router(
        ctx.policy,
        audit,
        config.effective_approval_required(),
        config.max_result_bytes,
        ctx.processes.kill_all,
        guards=guards,
        stop_latch=ctx.stop_latch,
        takeover=ctx.takeover,
    )
    for name in config.builtin_toolsets():
        factory = BUILTIN.get(name)
        if factory is None:
            raise ConfigError(f"unknown toolset '{name}'; {KNOWN}")
        _add(
            router,
            ToolsetHost(name, factory(ctx), on_change=router.tools_changed, strict_arguments=True, in_process=True),
        )
    # Always there: a model's way to ask a person; it waits in the approvals queue.
    _add(router, ToolsetHost("approval", approval.build(ctx), strict_arguments=True, in_process=True))
    if "browser" in config.toolsets and (problem := config.browser.problem()) is not None:
        log.warning("the browser toolset will fail until this is fixed: %s", problem)
    for server in config.all_mcp_servers():
        _add(router, mcp_host(server, ctx, router.tools_changed))
    try:
        crash = CrashPoints.from_env()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        ledger = Ledger(data_dir / LEDGER_NAME, config.identity())
    except LedgerOwned as exc:
        raise ConfigError(str(exc)) from None
    if ledger.rebound_from:
        log.info(
            "the data dir %s held device %s's ledger, with everything reported; it is now device %s's",
            data_dir,
            ledger.rebound_from,
            config.identity(),
        )
    if ctx.sandbox is None and "shell" in config.toolsets:
        log.info("shell.run is not sandboxed: shell_allow/shell_deny are guardrails only (see sandbox = 'bwrap')")
    info = {**system.device_info(), "policy": config.policy_report()}
    agent = Agent(config, router, ledger, info, crash)
    ctx.current_batch = lambda: agent.current  # the artifact tools act for the running batch
    if orphans.SUPPORTED:  # what a command starts is recorded, to be killed if the agent dies first
        ctx.processes.watcher = orphans.Recorder(ledger, agent.running)
    return agent


def mcp_host(server: McpServerConfig, ctx: ToolsetContext, on_change: Callable[[], None] | None = None) -> ToolsetHost:
    """The host of a third-party MCP server: stdio (started as device_agent/launch.py says: in a
    directory of its own, in the sandbox if there is one) or streamable HTTP, with the client
    features the agent declares (roots: the workspace unless configured; elicitation: declined)."""
    target: Any
    if server.url:
        secrets = server.http_headers()
        parts = urlsplit(server.url)
        if (
            (secrets or server.oauth)
            and parts.scheme == "http"
            and parts.hostname not in ("127.0.0.1", "localhost", "::1")
        ):
            log.warning(
                "MCP server '%s' is reached over plain http://: its bearer token travels unencrypted; "
                "use https:// for anything but loopback",
                server.namespace,
            )
        target = HttpTarget(server.url, tuple(secrets.items()))
        if server.oauth is not None:
            assert ctx.data_dir is not None
            # Tokens are kept per namespace in the private data dir, like the device token.
            storage = FileTokenStorage(token_path(ctx.data_dir, server.namespace), server.url)
            oauth = server.oauth
            target = HttpTarget(
                server.url,
                auth=oauth_provider(server.url, oauth, storage),
                secrets=lambda: [*oauth.secrets(), *storage.secrets()],
            )
    elif server.command:
        assert ctx.data_dir is not None
        try:
            target = stdio_target(server, ctx.workspace, ctx.data_dir, ctx.sandbox)
        except LaunchRefused as exc:
            raise ConfigError(str(exc)) from None
    else:
        raise ConfigError(f"MCP server '{server.namespace}' needs a 'command' (stdio) or a 'url' (HTTP)")
    features = ClientFeatures(roots=server.root_dirs(ctx.workspace))
    return ToolsetHost(
        server.namespace, target, frozenset(server.read_only_tools), on_change=on_change, features=features
    )


async def check_mcp_server(server: McpServerConfig, ctx: ToolsetContext, timeout_s: float = 20.0) -> dict[str, Any]:
    """`--check` for one third-party MCP server: connect, list its tools, disconnect."""
    where = {"url": public_url(server.url)} if server.url else {"command": server.command}
    try:
        host = mcp_host(server, ctx)
    except ConfigError as exc:
        return {"ready": False, "reason": str(exc), **where}
    try:
        await host.start(timeout_s)
    except (ToolsetUnavailable, TimeoutError) as exc:
        return {"ready": False, "reason": str(exc) or f"no answer within {timeout_s:g}s", **where}
    finally:
        await host.stop()
    return {"ready": True, "reason": None, **where, "tools": [t.name for t in host.tools]}


def _add(router: Router, host: ToolsetHost) -> None:
    try:
        router.add(host)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def toolset_context(config: AgentConfig) -> ToolsetContext:
    """The context every built-in toolset gets; creates (or tightens) the private data dir and
    creates the workspace (0700 if it is new: it is the tools' to open up).

    With `sandbox = "bwrap"` it also runs a trivial command in the sandbox once, and raises
    `SandboxUnavailable` (one line: why, and what to do) if that fails.
    """
    data_dir = config.resolved_data_dir
    workspace = config.resolved_workspace
    make_private(data_dir)
    workspace.mkdir(parents=True, exist_ok=True, mode=0o700)
    sandbox = None
    if config.sandbox == "bwrap":
        sandbox = Sandbox.create(workspace, data_dir, network=config.sandbox_network, limits=config.sandbox_limits())
        sandbox.probe()
    return ToolsetContext(
        workspace=workspace,
        policy=config.policy(),
        data_dir=data_dir,
        sandbox=sandbox,
        artifacts=config.artifact_link() if config.token else None,
    )


async def check(config: AgentConfig) -> dict[str, Any]:
    """`orrery agent --check`: build each configured toolset, list its tools, run its readiness check.

    Returns `{"ready", "reason", "toolsets": {name: {"ready", "reason", "tools", ...}}}`; ready
    only if every configured toolset is. No token or orchestrator is needed. With a token (or
    --data-dir) it also names the data dir and workspace the agent would use; without either, the
    check runs in a temporary directory and leaves nothing behind.
    """
    if config.data_dir is None and not config.identity():
        with tempfile.TemporaryDirectory(prefix="orrery-agent-check-") as tmp:
            report = await _check(config.model_copy(update={"data_dir": Path(tmp)}))
        return {**report, "data_dir": None, "workspace": None}
    report = await _check(config)
    return {**report, "data_dir": str(config.resolved_data_dir), "workspace": str(config.resolved_workspace)}


async def _check(config: AgentConfig) -> dict[str, Any]:
    reports: dict[str, dict[str, Any]] = {}
    sandbox_error = None
    try:
        ctx = toolset_context(config)
    except SandboxUnavailable as exc:  # the agent would refuse to start with this very line
        sandbox_error = str(exc)
        ctx = toolset_context(config.model_copy(update={"sandbox": "none"}))
        if "shell" in config.toolsets:
            reports["shell"] = {
                "ready": False,
                "reason": "the sandbox cannot start",
                "sandbox": config.sandbox_report(),
            }
    for name in config.builtin_toolsets():
        if name in reports:
            continue
        factory = BUILTIN.get(name)
        if factory is None:
            reports[name] = {"ready": False, "reason": f"unknown toolset; {KNOWN}"}
            continue
        try:
            tools = [t.name for t in await factory(ctx).list_tools()]
        except Exception as exc:  # a toolset that cannot even be built is the finding
            reports[name] = {"ready": False, "reason": f"cannot build the toolset: {exc}"}
            continue
        checker = CHECKS.get(name)
        report = await asyncio.to_thread(checker, ctx) if checker else {"ready": True, "reason": None}
        reports[name] = {**report, "tools": tools}
    for server in config.all_mcp_servers():
        reports[server.namespace] = await check_mcp_server(server, ctx)
    if "browser" in config.toolsets and (problem := config.browser.problem()) is not None:
        reports["browser"] = {**reports["browser"], "ready": False, "reason": problem}
    failing = [f"{name}: {r['reason']}" for name, r in reports.items() if not r["ready"]]
    if sandbox_error is not None:
        failing.insert(0, f"sandbox: {sandbox_error}")
    sandbox = {**config.sandbox_report(), "ready": sandbox_error is None, "reason": sandbox_error}
    return {"ready": not failing, "reason": "; ".join(failing) or None, "sandbox": sandbox, "toolsets": reports}


async def serve(config: AgentConfig) -> None:
    validate(config)
    made = Footprint(config.resolved_data_dir, config.resolved_workspace)
    try:
        lock = DataDirLock.acquire(config.resolved_data_dir)  # before the ledger is opened
    except DataDirBusy as exc:
        raise ConfigError(str(exc)) from None
    try:
        await _serve(config, made)
    finally:
        lock.release()


async def _serve(config: AgentConfig, made: Footprint) -> None:
    try:
        agent = build(config)
    except ConfigError:
        made.take_back()  # it never ran: what it made for the run goes
        raise
    refused_at_once = False
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, task.cancel)
    for sig, on in ((signal.SIGUSR1, True), (signal.SIGUSR2, False)):  # the kill switch, at run time
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, functools.partial(_flip, agent.router.guards.kill_switch, on))
    try:
        await agent.run()
    except asyncio.CancelledError:
        log.info("agent stopping")
    except TokenRefused as exc:
        log.error("%s", exc)
        refused_at_once = agent.sessions_opened == 0  # never accepted: its ledger holds nothing
        raise
    except AgentFailed as exc:
        log.error(
            "agent stopping with an error: %s; restart it (it reports the interrupted batch when it starts)",
            exc,
            exc_info=exc.__cause__ if not isinstance(exc.__cause__, LedgerError) else None,
        )
        raise
    except ValueError as exc:  # e.g. two toolsets offering the same tool name
        log.error("%s", exc)
        raise ConfigError(str(exc)) from None
    finally:
        agent.ledger.close()
        agent.router.audit.close()
        if refused_at_once:
            made.take_back("the orchestrator never accepted it")


def _flip(switch: KillSwitch, on: bool) -> None:
    """SIGUSR1 / SIGUSR2: turn the kill switch on / off (its file), for the next command on."""
    try:
        switch.turn(on)
    except OSError as exc:
        log.error("could not turn the kill switch %s (%s): %s", "on" if on else "off", switch.path, exc)
        return
    log.warning("kill switch turned %s by a signal: %s", "on" if on else "off", switch.status())


def main(config: AgentConfig) -> None:
    try:
        import uvloop
    except ImportError:  # optional: plain asyncio works the same, a little slower
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
