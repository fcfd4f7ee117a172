"""Append-only JSON-lines audit log of every tool call on this device (SPEC section 5).

It records who asked (batch, call id), what tool, the decision and the outcome, and never the
arguments or results: those may hold typed text, file contents or secrets.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from device_agent.datadir import PRIVATE_DIR, private_file

ALLOWED_FIELDS = frozenset(
    {"batch_id", "call_id", "task_id", "node_id", "tool", "decision", "status", "error_code", "duration_ms", "reason"}
)


class AuditLog:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        self.path = path
        # O_APPEND: each line lands at the end even if another process appends too. 0600 even if
        # an older agent or a loose umask created it wider.
        self._fd = private_file(path, os.O_WRONLY | os.O_APPEND)

    def record(self, **fields: Any) -> None:
        entry = {"ts": round(time.time(), 3), **{k: v for k, v in fields.items() if k in ALLOWED_FIELDS}}
        os.write(self._fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
