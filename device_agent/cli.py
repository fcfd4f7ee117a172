"""`orrery agent`: flags over `ORRERY_AGENT_*` variables over the TOML file (SPEC section 5)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from device_agent import config as agent_config
from device_agent import owner
from device_agent.agent_dir import ConfigOption, DataDirOption, TokenOption, agent_settings
from orrery.logs import NOISY, setup_logging
from orrery.options import parse_labels

app = typer.Typer(add_completion=False)

# A bad value under these is never echoed back: it may be a token, a header or a URL with a password.
SECRET_PARTS = frozenset({"token", "mcp_servers", "bearer_token", "headers", "url", "env"})


def _shown(error: Any) -> str:
    """` (got VALUE)` for a plain value of a setting that holds no secret, else nothing."""
    value = error.get("input")
    if SECRET_PARTS & {str(part) for part in error["loc"]} or not isinstance(value, str | int | float | bool):
        return ""
    return f" (got {value!r})"


# Exit statuses: 0 stopped by a signal; a supervisor should restart on EXIT_FAILED only.
EXIT_FAILED = 1  # the ledger or the executor failed; a restart reports the interrupted batch
EXIT_CONFIG = 2  # bad settings, the data dir held by another agent or by another device's work
EXIT_TOKEN_REFUSED = 3  # the orchestrator refused the token (revoked or wrong) 3 times in a row


def agent(
    server: Annotated[str | None, typer.Option(help="orchestrator base URL (http(s) or ws(s))")] = None,
    token: Annotated[str | None, typer.Option(help="device token from 'orrery devices enroll'")] = None,
    device_id: Annotated[str | None, typer.Option(help="must match the token's device")] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable")] = None,
    workspace: Annotated[
        Path | None, typer.Option(help="directory the tools work in (default: <data dir>/workspace)")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="this device's ledger, audit log and lock; one agent per data dir "
            "(default: ./.orrery-agent/<device id>, the id from the token)"
        ),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="TOML file with an \\[agent] table of settings")] = None,
    also_server: Annotated[list[str] | None, typer.Option("--also-server", help="failover URLs")] = None,
    ca_file: Annotated[Path | None, typer.Option(help="CA bundle to verify an https server")] = None,
    toolset: Annotated[
        list[str] | None,
        typer.Option(help="built-in toolsets (default system, shell, files; also gui) or the browser profile"),
    ] = None,
    unattended: Annotated[bool | None, typer.Option("--unattended", help="allow tools that need approval")] = None,
    log_format: Annotated[str | None, typer.Option(help="text or json")] = None,
    sandbox: Annotated[
        str | None,
        typer.Option(
            help="'bwrap' runs every shell.run in a bubblewrap sandbox (workspace the only writable place, "
            "no network); 'none' (default) runs programs unconfined"
        ),
    ] = None,
    sandbox_network: Annotated[
        bool | None, typer.Option("--sandbox-network", help="let sandboxed programs use the network")
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="check that the configured toolsets can run; print JSON (with the data dir and workspace), exit 0/1",
        ),
    ] = False,
) -> None:
    """Run a device agent: connect to the orchestrator and serve this machine's MCP tools.

    Exit status: 1 the agent failed (restart it), 2 bad settings or a data dir in use,
    3 the orchestrator refused the token (revoked or wrong: enroll again).

    Beside a running agent, its owner answers approvals: 'orrery agent approvals',
    'orrery agent approve ID', 'orrery agent deny ID' (each naming the data dir as the agent does:
    --data-dir, ORRERY_AGENT_DATA_DIR or the --config file), and takes the device over itself:
    'orrery agent takeover', 'orrery agent handback --note ...'.
    Also: 'orrery agent kill-switch on|off|status' flips the kill switch of a running agent.
    """
    overrides: dict[str, Any] = {
        "server": server,
        "token": token,
        "device_id": device_id,
        "labels": parse_labels(label),
        "workspace": workspace,
        "data_dir": data_dir,
        "servers": also_server,
        "ca_file": ca_file,
        "toolsets": toolset,
        "unattended": unattended,
        "log_format": log_format,
        "sandbox": sandbox,
        "sandbox_network": sandbox_network,
        "log_level": log_level,
    }
    try:
        cfg = agent_config.load(config, overrides)
    except ValidationError as exc:  # one line per bad setting, not a traceback
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "settings"
            typer.echo(f"bad agent setting {where}: {error['msg']}{_shown(error)}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    setup_logging(cfg.log_format, cfg.log_level, quiet=("websockets",) if cfg.log_level == "debug" else NOISY)
    if check:
        _check(cfg)
        return
    from device_agent.agent import AgentFailed, TokenRefused
    from device_agent.runner import ConfigError, main

    try:
        main(cfg)
    except ConfigError as exc:
        logging.getLogger("orrery.agent").error("%s", exc)
        raise typer.Exit(EXIT_CONFIG) from None
    except AgentFailed:
        raise typer.Exit(EXIT_FAILED) from None  # logged where it happened
    except TokenRefused:
        raise typer.Exit(EXIT_TOKEN_REFUSED) from None  # logged where it happened


def _check(cfg: agent_config.AgentConfig) -> None:
    """`--check`: a readiness report on stdout; exit 1 (reason on stderr) unless all are ready."""
    from device_agent.runner import check

    report = asyncio.run(check(cfg))
    typer.echo(json.dumps(report, indent=2, default=str))
    for name, toolset in report["toolsets"].items():
        if toolset.get("warning"):
            logging.getLogger("orrery.agent").warning("%s: %s", name, toolset["warning"])
    if not report["ready"]:
        logging.getLogger("orrery.agent").error("not ready: %s", report["reason"])
        raise typer.Exit(1)


app.command()(agent)


# ---------------------------------------------------------------- the kill switch at run time

kill_switch_app = typer.Typer(add_completion=False)


@kill_switch_app.command()
def kill_switch(
    action: Annotated[str, typer.Argument(help="on, off or status")],
    data_dir: DataDirOption = None,
    config: ConfigOption = None,
    token: TokenOption = None,
) -> None:
    """Turn the device's kill switch on or off while its agent runs (from its next command on).

    On: every tool that may change the device is refused (policy_denied); read-only tools still
    work. It is the file <data dir>/kill-switch (or kill_switch_file): present means on, so it
    stays on across agent restarts. SIGUSR1 / SIGUSR2 to the agent do the same.
    """
    from device_agent.killswitch import KillSwitch

    if action not in ("on", "off", "status"):
        typer.echo(f"unknown action {action!r}: use on, off or status", err=True)
        raise typer.Exit(EXIT_CONFIG)
    cfg = agent_settings(data_dir, config, token)  # as every `orrery agent` subcommand: agent_dir.py
    if cfg.data_dir is None and cfg.kill_switch_file is None and not cfg.identity():
        typer.echo(
            "which agent? pass --data-dir (the agent's data dir), or --config / ORRERY_AGENT_* settings naming it",
            err=True,
        )
        raise typer.Exit(EXIT_CONFIG)
    switch = KillSwitch(cfg.resolved_kill_switch_file, cfg.kill_switch)
    if action != "status":
        try:
            switch.turn(action == "on")
        except OSError as exc:
            typer.echo(f"could not turn the kill switch {action} ({switch.path}): {exc}", err=True)
            raise typer.Exit(1) from None
    typer.echo(f"kill switch: {switch.status()}")


# `orrery agent WORD ...` runs one of these instead of the agent.
SUBCOMMANDS: dict[str, typer.Typer] = {"kill-switch": kill_switch_app}


def run(args: list[str], prog_name: str) -> None:
    """`orrery agent [OPTIONS]`, or `orrery agent kill-switch ...` (see SUBCOMMANDS)."""
    sub = SUBCOMMANDS.get(args[0]) if args else None
    if sub is not None:
        sub(args=args[1:], prog_name=f"{prog_name} {args[0]}")
    elif args and args[0] in owner.COMMANDS:  # the owner's approvals, and takeover/handback
        owner.app(args=args, prog_name=prog_name)
    else:
        app(args=args, prog_name=prog_name)


def main() -> None:
    import sys

    run(sys.argv[1:], "python -m device_agent")
