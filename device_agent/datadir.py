"""One agent per data dir: an exclusive lock held for the agent's whole life.

Two agents sharing a data dir would share one ledger: each would see the other's batches as
its own, and fences from two devices would interleave. The second one is refused at start.

The lock is `flock(LOCK_EX | LOCK_NB)` on `<data dir>/agent.lock`, which holds the holder's pid
for the message. The kernel drops the lock when the holder dies however it dies (SIGKILL
included), so a crashed agent never leaves a stale lock behind. The descriptor is not inherited
by the agent's child processes (Python opens it non-inheritable), so a tool's leftover process
cannot keep the data dir locked either.

The data dir is private: the ledger holds every command's full arguments and
results, the audit log what ran. `make_private` makes the directory 0700 and the agent's own files
in it 0600 (its own directories 0700) whatever the umask, and tightens what an older agent or a
loose umask left wider, saying so in the log. It touches only what the agent creates (`OWN_FILES`,
`OWN_DIRS`), never follows a symlink, and leaves anything else alone: a data dir pointed at a
directory that holds other things (`--data-dir ~`) must not have them changed. The workspace,
when it lives in the data dir, is the tools' (its files keep the modes the work gives them); the
data dir's 0700 already keeps other users out of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("orrery.agent")

LOCK_NAME = "agent.lock"
AUDIT_NAME = "audit.jsonl"
LEDGER_NAME = "ledger.sqlite3"
# What the agent keeps in its data dir: these, and nothing else, `make_private` tightens.
SESSION_NAME = "session.json"  # device_agent/health.py
OWN_FILES = (
    LOCK_NAME,
    AUDIT_NAME,
    SESSION_NAME,
    *(LEDGER_NAME + suffix for suffix in ("", "-wal", "-shm", "-journal")),
)
SCREENSHOTS_NAME = "screenshots"  # gui.observe's PNG files
OAUTH_NAME = "oauth"  # OAuth tokens for third-party MCP servers (device_agent/mcp_oauth.py)
OWN_DIRS = (SCREENSHOTS_NAME, OAUTH_NAME)
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private(data_dir: Path) -> None:
    """Create `data_dir` as 0700, or tighten it to 0700, and tighten the agent's own files in it to
    0600 (its own directories, and everything in them, to 0600 files / 0700 dirs)."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    mode = stat.S_IMODE(data_dir.stat().st_mode)
    if mode != PRIVATE_DIR:
        os.chmod(data_dir, PRIVATE_DIR)
        log.warning(
            "the data dir %s was mode %04o; tightened it to %04o: it holds the ledger (every "
            "command's arguments and results) and the audit log, for this agent's user only",
            data_dir,
            mode,
            PRIVATE_DIR,
        )
    tightened = [t for name in (*OWN_FILES, *OWN_DIRS) for t in _tighten(data_dir, data_dir / name)]
    if tightened:
        shown = ", ".join(tightened[:10]) + (f" and {len(tightened) - 10} more" if len(tightened) > 10 else "")
        log.warning("tightened %d of the agent's files in %s to 0600 (dirs 0700): %s", len(tightened), data_dir, shown)


def _tighten(data_dir: Path, path: Path) -> Iterator[str]:
    """Make `path` (and, for a directory, everything in it) private; yield what was changed."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        return  # not followed: what it points at is not the agent's to change
    directory = stat.S_ISDIR(info.st_mode)
    wanted = PRIVATE_DIR if directory else PRIVATE_FILE
    mode = stat.S_IMODE(info.st_mode)
    if mode != wanted:
        try:
            os.chmod(path, wanted, follow_symlinks=False)
            yield f"{path.relative_to(data_dir)} ({mode:04o})"
        except OSError as exc:
            log.warning("cannot make %s private (mode %04o): %s", path, mode, exc)
    if directory:
        for child in sorted(path.iterdir()):
            yield from _tighten(data_dir, child)


def private_file(path: Path, flags: int = os.O_RDWR) -> int:
    """Open `path`, creating it 0600 if it is missing and tightening it to 0600 if it is not: the
    mode is set through the descriptor, so there is no moment when another user may open it."""
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


class DataDirBusy(Exception):
    """Another live agent holds the data dir."""


class DataDirLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock `data_dir` for this process, or raise `DataDirBusy` naming the holder's pid."""
        data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        path = data_dir / LOCK_NAME
        fd = private_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DataDirBusy(
                f"the data dir {data_dir} is in use by another agent (pid {holder}); stop that agent "
                "or give this one its own --data-dir"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None


class Footprint:
    """What a run of the agent finds missing before it starts, so it can take back what it made
    when the orchestrator refuses it before ever accepting it (a wrong or revoked token): a
    refused run must not leave `./.orrery-agent/<id>/` behind. Only what was missing is taken
    back, files by name and directories only once empty, so a data dir that held a ledger (or
    anything else) before this run keeps it."""

    def __init__(self, data_dir: Path, workspace: Path) -> None:
        self.data_dir = data_dir
        self.files = [data_dir / name for name in OWN_FILES if not os.path.lexists(data_dir / name)]
        self.dirs: list[Path] = []
        for start in (data_dir / SCREENSHOTS_NAME, workspace, data_dir):
            path = start
            while not os.path.lexists(path) and path not in self.dirs and path != path.parent:
                self.dirs.append(path)  # missing, as its parents up to the first that exists
                path = path.parent

    def take_back(self, why: str | None = None) -> None:
        """Remove what this run made; `why` is logged when the data dir itself goes (a run that
        failed on its settings says only that, in one line: nothing is logged for it)."""
        for file in self.files:
            with contextlib.suppress(OSError):
                file.unlink(missing_ok=True)
        for path in sorted(self.dirs, key=lambda p: len(p.parts), reverse=True):  # the deepest first
            with contextlib.suppress(OSError):  # not empty: something else is in it, kept
                path.rmdir()
        if why is not None and self.data_dir in self.dirs and not os.path.lexists(self.data_dir):
            log.info("removed the data dir %s this run made: %s", self.data_dir, why)
