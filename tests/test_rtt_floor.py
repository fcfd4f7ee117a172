"""`bench/rtt_floor.py`, the durable floor the README measures the round trip against, stays the
floor of *this* system: its server transaction writes what the engine's group commit writes for a
chained node (the same tables, the same columns, the same number of events), and it runs."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.rtt_floor import EVENTS_SQL, SERVER_SQL
from tests.unit.engine.harness import Harness, results

ROOT = Path(__file__).resolve().parent.parent


def shape(sql: str) -> tuple[str, str, frozenset[str], int]:
    """(verb, table, columns written, rows) of an INSERT or UPDATE, literals or placeholders alike."""
    if m := re.match(r"INSERT INTO (\w+) \(([^)]*)\) VALUES (.*)$", sql, re.S):
        columns = frozenset(c.strip() for c in m.group(2).split(","))
        rows = len(re.findall(r"\),\s*\(", m.group(3))) + 1
        return "insert", m.group(1), columns, rows
    m = re.match(r"UPDATE (\w+) SET (.*?) WHERE ", sql, re.S)
    assert m, sql
    return "update", m.group(1), frozenset(re.findall(r"(?:^|, )(\w+) = ", m.group(2))), 1


async def test_the_floor_writes_what_the_engine_writes_for_a_chained_node(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()  # (it migrates a template first)
    try:
        device = await h.enroll("d1")
        await h.connect(device)
        ids = [f"n{i}" for i in range(6)]
        dag = {
            "nodes": [{"id": n, "commands": [{"tool": "sim.act", "arguments": {"text": "x"}}]} for n in ids],
            "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
        }
        await h.submit(dag)
        writer = h.store._sqlite
        assert writer is not None
        traced: list[str] = []
        for i in range(4):
            frame = results(device, h.links.sent[-1].message)
            if i == 2:  # a step in the middle of the chain: one node ends, the next starts
                writer._db.set_trace_callback(traced.append)
            await h.step(frame)
            writer._db.set_trace_callback(None)
    finally:
        await h.close()
    engine = Counter(shape(s) for s in traced if s.startswith(("INSERT", "UPDATE")))
    floor = Counter(shape(s) for s in [*SERVER_SQL, EVENTS_SQL])
    assert engine == floor
    assert sum(1 for s in traced if s.startswith("SELECT")) == 1  # the events' next id, as the floor reads it
    assert traced[0] == "BEGIN IMMEDIATE" and traced[-1] == "COMMIT"


def test_the_floor_benchmark_runs_and_prints_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, "bench/rtt_floor.py", "--nodes", "20", "--echo", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert set(figures) == {"floor_p50", "echo_p50"}
    assert figures["floor_p50"] > 0 and figures["echo_p50"] > 0
    assert "durable floor (hops and commits only)" in out
