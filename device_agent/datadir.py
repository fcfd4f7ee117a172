"""One agent per data dir: an exclusive lock held for the agent's whole life.

Two agents sharing a data dir would share one ledger: each would see the other's batches as
its own, and fences from two devices would interleave. The second one is refused at start.

The lock is `flock(LOCK_EX | LOCK_NB)` on `<data dir>/agent.lock`, which holds the holder's pid
for the message. The kernel drops the lock when the holder dies however it dies (SIGKILL
included), so a crashed agent never leaves a stale lock behind. The descriptor is not inherited
by the agent's child processes (Python opens it non-inheritable), so a tool's leftover process
cannot keep the data dir locked either.

The data dir is private (issue 14, item 9): the ledger holds every command's full arguments and
results, the audit log what ran. `make_private` makes the directory 0700 and everything in it 0600
(directories 0700) whatever the umask, and tightens what an older agent, another tool or a loose
umask left wider, saying so in the log. The workspace, when it lives in the data dir, is left as
the tools made it (its files are the work, with the modes the work needs); the data dir's 0700
already keeps other users out of it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("orrery.agent")

LOCK_NAME = "agent.lock"
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private(data_dir: Path, skip: Iterable[Path] = ()) -> None:
    """Create `data_dir` as 0700, or tighten it to 0700, and every file under it to 0600 (every
    directory to 0700), except under `skip` (the workspace). Symlinks are never followed."""
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
    skipped = {os.path.realpath(p) for p in skip}
    tightened: list[str] = []
    for root, dirs, files in os.walk(data_dir, followlinks=False):
        dirs[:] = [d for d in dirs if os.path.realpath(os.path.join(root, d)) not in skipped]
        for name, wanted in [*((d, PRIVATE_DIR) for d in dirs), *((f, PRIVATE_FILE) for f in files)]:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode) or stat.S_IMODE(info.st_mode) == wanted:
                continue
            try:
                os.chmod(path, wanted, follow_symlinks=False)
            except OSError as exc:
                log.warning("cannot make %s private (mode %04o): %s", path, stat.S_IMODE(info.st_mode), exc)
                continue
            tightened.append(f"{os.path.relpath(path, data_dir)} ({stat.S_IMODE(info.st_mode):04o})")
    if tightened:
        shown = ", ".join(tightened[:10]) + (f" and {len(tightened) - 10} more" if len(tightened) > 10 else "")
        log.warning(
            "tightened %d paths in the data dir %s to 0600 files / 0700 dirs: %s", len(tightened), data_dir, shown
        )


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
