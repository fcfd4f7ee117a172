"""The audit log's lines are the bytes `json.dumps(entry, separators=(",", ":"))` writes, whichever
serializer wrote them (device_agent/audit.py writes most with pydantic's, for speed)."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from device_agent.audit import AuditLog, _line


def dumps(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


TEXTS = [
    "".join(chr(c) for c in range(128)),  # every ASCII character: controls, quotes, backslash, DEL
    "b-01HZX.y_z/1",
    "café",
    "日本語",
    "emoji 😀 and a lone surrogate \ud800",
    "line\nbreak\ttab\r\x00nul\x7f",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_line_with_any_text_is_what_json_dumps_writes(text: str) -> None:
    entry = {"ts": 1764000000.5, "batch_id": text, "tool": "system.echo", "error_code": None, "reason": text}
    assert _line(entry) == dumps(entry)


def test_timestamps_and_durations_print_as_json_dumps_prints_them() -> None:
    rng = random.Random(16)
    times = [round(rng.uniform(1e9, 4.1e9), 3) for _ in range(20_000)] + [round(time.time(), 3), 1764000000.0]
    durations = [round(rng.uniform(0, 10), 3) for _ in range(20_000)]
    durations += [round(rng.uniform(0, 1e12), 3) for _ in range(20_000)]
    durations += [0.0, 0.001, 0.01, 0.1, 1.0, 999999999999999.9]
    for ts, duration in zip(times, durations, strict=False):
        entry = {"ts": ts, "call_id": "c1", "duration_ms": duration, "status": "success"}
        assert _line(entry) == dumps(entry), entry


def test_a_recorded_line_keeps_its_fields_in_order_and_drops_unknown_ones(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    try:
        log.record(batch_id="b1", call_id="c1", tool="system.echo", decision="allowed", phase="intent")
        log.record(batch_id="b1", call_id="c1", tool="system.echo", arguments={"text": "secret"}, duration_ms=0.25)
        log.record(batch_id="b1", call_id="c2", tool="x.y", decision="approved", reason="approved by Zoë")
    finally:
        log.close()
    raw = (tmp_path / "audit.jsonl").read_bytes().splitlines(keepends=True)
    entries = [json.loads(line) for line in raw]
    assert [list(e) for e in entries] == [
        ["ts", "batch_id", "call_id", "tool", "decision", "phase"],
        ["ts", "batch_id", "call_id", "tool", "duration_ms"],
        ["ts", "batch_id", "call_id", "tool", "decision", "reason"],
    ]
    assert [dumps(e) for e in entries] == raw
    assert b"secret" not in b"".join(raw)
    assert "\\u00eb" in raw[2].decode()  # non-ASCII escaped, as json.dumps does
