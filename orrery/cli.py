"""`orrery`: `orrery agent ...` is the device agent's command, every other command the orchestrator's.

Each side is imported only when asked for: a device install (the base dependencies, no `server`
extra) runs `orrery agent`, and any other command there says which extra to install (exit 2).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from orrery.exits import SERVER_EXTRA, guarded, is_missing_dependency

if TYPE_CHECKING:
    from typer.core import TyperGroup


def main(argv: list[str] | None = None) -> None:
    """The `orrery` console script (and `python -m orrery`)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["agent"]:
        guarded(lambda: _agent(args[1:]), needs_server=False)
    else:
        guarded(lambda: _everything(args), needs_server=True)


def command(args: list[str] | None = None) -> TyperGroup:
    """Every `orrery` command: the orchestrator's CLI with the agent's `agent` command first.

    Given the arguments of a run that names one of the orchestrator's commands, the agent's
    command (and its imports, a third of the start-up) is left out: that run cannot reach it.
    Help and a mistyped command still list and suggest `agent`."""
    import typer
    from typer.core import TyperGroup

    from orchestrator.cli import app as server_app

    group = typer.main.get_command(server_app)
    assert isinstance(group, TyperGroup)
    if args and args[0] in group.commands:
        return group
    from device_agent.cli import app as agent_app

    group.commands = {"agent": typer.main.get_command(agent_app), **group.commands}
    return group


def _agent(args: list[str]) -> None:
    from device_agent.cli import run

    run(args, "orrery agent")


def _everything(args: list[str]) -> None:
    try:
        group = command(args)
    except ModuleNotFoundError as exc:
        if is_missing_dependency(exc) and args in ([], ["--help"]):
            sys.stdout.write(
                "Usage: orrery agent [OPTIONS]\n\n"
                "This install has the device agent only: see `orrery agent --help`.\n"
                f"The orchestrator's commands (serve, demo, devices, tasks, ...) need: {SERVER_EXTRA}\n"
            )
            raise SystemExit(0 if args else 2) from None
        raise
    group(args=args, prog_name="orrery")
