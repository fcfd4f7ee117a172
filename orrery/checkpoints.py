"""SQLite checkpoints off the writer's thread, for the server's store and the agent's ledger.

Both keep their database in WAL mode with `synchronous=NORMAL`: a commit is in the WAL file (the
OS has it) before it returns, so it survives the process being killed at any point; what the OS
had not written to disk when the power failed may be lost (the last commits, never a torn one).
SQLite would otherwise checkpoint (copy the WAL into the database file, with fsyncs) inside
whichever commit crossed 1,000 WAL pages, stalling that writer's event loop for tens of
milliseconds. The writer turns that off (`PRAGMA wal_autocheckpoint=0`) and a `Checkpoints`
thread does it every `every_s` instead, on a connection of its own; the sqlite3 module lets go
of the GIL meanwhile, and a PASSIVE checkpoint never blocks the writer or readers.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger("orrery.sqlite")

EVERY_S = 0.5


class Checkpoints:
    def __init__(self, path: str | Path, every_s: float = EVERY_S) -> None:
        self.path = str(path)
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orrery-sqlite-checkpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop after one last checkpoint (bounded: a stuck disk does not hold the caller)."""
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        except sqlite3.Error as exc:
            log.warning("SQLite checkpoints of %s not started: %s", self.path, exc)
            return
        try:
            while not self._stop.wait(self.every_s):
                self._checkpoint(db)
            self._checkpoint(db)
        finally:
            db.close()

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # busy or failing storage: the next round tries again
            log.warning("SQLite checkpoint of %s failed: %s", self.path, exc)
