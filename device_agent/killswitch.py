"""The device owner's kill switch, flippable while the agent runs.

The switch is on when the agent's configuration says so (`kill_switch = true`, read at start) or
when the kill-switch file exists (`kill_switch_file`, default `<data dir>/kill-switch`). The file
is checked with one `stat` before every command it could refuse (a read-only tool, or an idempotent
and not destructive one, runs whatever it says), so flipping it takes effect for the next
command, with no restart. `orrery agent kill-switch on|off|status` flips it, and so do signals to
the agent process: SIGUSR1 creates the file (on), SIGUSR2 removes it (off). Because the file is
the state, a switch turned on stays on across agent restarts until it is turned off.

While it is on, every tool that may change the device is refused `policy_denied`; read-only
tools keep working so an operator can still see what the device is doing.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_NAME = "kill-switch"
# What the refusal tells the owner (and the model reading it) about turning it off.
HOW_TO_TURN_OFF = "the device owner turns it off with 'orrery agent kill-switch off' (or SIGUSR2 to the agent)"


def default_path(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


class KillSwitch:
    def __init__(self, path: Path | None, configured: bool = False) -> None:
        self.path = path
        self.configured = configured  # on from the configuration: only a restart without it lifts that

    def is_on(self) -> bool:
        """One stat of the file (the configured switch costs nothing)."""
        if self.configured:
            return True
        if self.path is None:
            return False
        try:
            os.stat(self.path)
        except FileNotFoundError:
            return False
        except OSError:
            return True  # cannot tell (a broken disk, a path we may not search): fail safe, refuse actions
        return True

    def turn(self, on: bool) -> None:
        """Create (on) or remove (off) the file; raises OSError if that is impossible."""
        if self.path is None:
            raise OSError("this agent has no kill-switch file configured")
        if on:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            os.close(fd)
        else:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def status(self) -> str:
        """`on (file)`, `on (configuration)` or `off`, for the CLI and logs."""
        if self.configured:
            return "on (configuration: kill_switch = true)"
        if self.is_on():
            return f"on ({self.path} exists)"
        return "off"
