"""Which agent an `orrery agent` subcommand acts on: one way to name its data dir everywhere.

The agent itself, `kill-switch`, `approvals`, `approve` and `deny` all read it the same way, with
the agent's own precedence (device_agent/config.py `load`): `--data-dir`, then
`ORRERY_AGENT_DATA_DIR`, then `data_dir` in the `--config` TOML file; failing those, the default
`./.orrery-agent/<device id>` of the token (`--token`, `ORRERY_AGENT_TOKEN` or the file's).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from device_agent import config as agent_config

EXIT_CONFIG = 2  # as `orrery agent`: bad settings

DataDirOption = Annotated[
    Path | None,
    typer.Option(help="the agent's data dir (its --data-dir; else ORRERY_AGENT_DATA_DIR, else the --config file's)"),
]
ConfigOption = Annotated[
    Path | None, typer.Option(help="the agent's TOML file (for data_dir, token, kill_switch_file)")
]
TokenOption = Annotated[
    str | None, typer.Option(help="the device token, to find the default data dir ./.orrery-agent/<device id>")
]


def agent_settings(data_dir: Path | None, config: Path | None, token: str | None) -> agent_config.AgentConfig:
    """The agent's settings as `orrery agent` reads them, with these options given; a setting
    that cannot be read exits with status 2 and one line saying why."""
    try:
        return agent_config.load(config, {"data_dir": data_dir, "token": token})
    except (ValidationError, OSError, ValueError, tomllib.TOMLDecodeError) as exc:
        typer.echo(f"cannot read the agent's settings: {exc}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None


def which_agent(data_dir: Path | None, config: Path | None, token: str | None) -> agent_config.AgentConfig | None:
    """The named agent's settings (`resolved_data_dir` is its data dir), or None when nothing
    names one (no data dir and no device id anywhere)."""
    cfg = agent_settings(data_dir, config, token)
    return cfg if cfg.data_dir is not None or cfg.identity() else None
