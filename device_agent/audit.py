"""Append-only JSON-lines audit log of every tool call on this device (SPEC section 5).

It records who asked (batch, call id), what tool, the decision and the outcome, and never the
arguments or results: those may hold typed text, file contents or secrets.

A call that runs gets two lines: `phase: "intent"` written before the tool is called, and
`phase: "outcome"` after it. A refused call gets one (`decision: "denied"`). Each line is one
`write(2)` on an `O_APPEND` descriptor, unbuffered in this process: once `record` returns, the
line is in the kernel's page cache and survives the agent crashing or being killed. With `fsync`
(`audit_fsync = true`) each line is also `fdatasync`ed to the disk before `record` returns, so it
survives a power loss or a kernel crash too, at the price of one disk flush per line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from device_agent.datadir import PRIVATE_DIR, private_file

ALLOWED_FIELDS = frozenset(
    {
        "batch_id",
        "call_id",
        "task_id",
        "node_id",
        "tool",
        "decision",
        "status",
        "error_code",
        "duration_ms",
        "reason",
        "phase",
        "kind",  # a forwarded input's kind (click, key, type...), never what it typed
        "by",  # who sent a forwarded input
    }
)


# pydantic's JSON serializer writes a line for a quarter of what `json.dumps` costs (every call
# writes two). For what a line holds (ASCII text, None, and floats from 0.001 up to 1e15 with at
# most 3 decimals: the timestamp and a duration) its bytes are the ones
# `json.dumps(entry, separators=(",", ":"))` writes (tests/unit/device_agent/test_audit_lines.py).
# Other text it writes unescaped where json.dumps escapes it (non-ASCII, DEL), or refuses (a lone
# surrogate): such a line is left to json.dumps, so the log reads as it always did.
_TO_JSON = TypeAdapter(Any).serializer.to_json


def _line(entry: dict[str, Any]) -> bytes:
    try:
        line: bytes = _TO_JSON(entry)
        if line.isascii() and b"\x7f" not in line:
            return line + b"\n"
    except ValueError:  # a lone surrogate, which UTF-8 cannot hold
        pass
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


class AuditLog:
    def __init__(self, path: Path, fsync: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        self.path = path
        self.fsync = fsync
        # O_APPEND: each line lands at the end even if another process appends too. 0600 even if
        # an older agent or a loose umask created it wider.
        self._fd = private_file(path, os.O_WRONLY | os.O_APPEND)

    def record(self, **fields: Any) -> None:
        """Write one line; raises OSError if it could not be written (or flushed, with fsync)."""
        if not fields.keys() <= ALLOWED_FIELDS:  # never arguments, results or anything else
            fields = {k: v for k, v in fields.items() if k in ALLOWED_FIELDS}
        # Seconds to the millisecond, as round(time.time(), 3) gives them, for half its cost.
        ts = (time.time_ns() + 500_000) // 1_000_000 / 1000
        line = _line({"ts": ts, **fields})
        written = os.write(self._fd, line)
        if written != len(line):  # a full disk can take part of it: the line is not whole
            raise OSError(f"only {written} of {len(line)} bytes of the audit line were written")
        if self.fsync:
            os.fdatasync(self._fd)

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
