"""One agent per data dir: an exclusive lock held for the agent's whole life.

Two agents sharing a data dir would share one ledger: each would see the other's batches as
its own, and fences from two devices would interleave. The second one is refused at start.

The lock is `flock(LOCK_EX | LOCK_NB)` on `<data dir>/agent.lock`, which holds the holder's pid
for the message. The kernel drops the lock when the holder dies however it dies (SIGKILL
included), so a crashed agent never leaves a stale lock behind. The descriptor is not inherited
by the agent's child processes (Python opens it non-inheritable), so a tool's leftover process
cannot keep the data dir locked either.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "agent.lock"


class DataDirBusy(Exception):
    """Another live agent holds the data dir."""


class DataDirLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock `data_dir` for this process, or raise `DataDirBusy` naming the holder's pid."""
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = data_dir / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
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
