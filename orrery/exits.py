"""How an `orrery` command ends: a result or one line on stderr, never a Python traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from rich.console import Console
from rich.text import Text

# The project's own packages: a missing module among them is a broken install, not a missing extra.
OWN = frozenset({"orrery", "protocol", "device_agent", "orchestrator", "migrations"})
SERVER_EXTRA = "pip install 'orrery[server]'"
EXIT_MISSING_EXTRA = 2


def missing_extra(exc: ModuleNotFoundError) -> NoReturn:
    """A server or client command on a device install (no `server` extra): name the extra, exit 2."""
    sys.stderr.write(
        f"error: this command needs the orchestrator's dependencies (no module named {exc.name!r}); "
        f"install them with: {SERVER_EXTRA}\n"
    )
    raise SystemExit(EXIT_MISSING_EXTRA) from None


def is_missing_dependency(exc: ModuleNotFoundError) -> bool:
    return bool(exc.name) and str(exc.name).split(".")[0] not in OWN


def guarded(run: Callable[[], object], *, needs_server: bool) -> None:
    """Run a command: `| head` closing stdout exits 1 quietly; an unexpected error is one line, exit 1;
    with `needs_server`, a missing third-party module is the `server` extra's error (exit 2)."""
    try:
        run()
    except BrokenPipeError:  # `orrery tasks list | head`
        sys.stderr.close()
        raise SystemExit(1) from None
    except ModuleNotFoundError as exc:
        if needs_server and is_missing_dependency(exc):
            missing_extra(exc)
        _internal(exc)
    except Exception as exc:
        _internal(exc)


def _internal(exc: Exception) -> NoReturn:
    Console(stderr=True).print(
        Text.assemble(("error", "red"), f" internal: {type(exc).__name__}: {exc}".rstrip(": ")), soft_wrap=True
    )
    raise SystemExit(1) from None
