"""`bench/rtt_floor.py`, the durable floor the README measures the round trip against, stays the
floor of *this* system: its server transaction is the statements the engine's group commit issues
for a chained node, its agent the statements the ledger issues for a batch, and it runs."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench.rtt_floor import EVENTS_SQL, NEXT_EVENT_SQL, RECEIPT_SQL, RESULTS_SQL, SERVER_SQL, STARTED_SQL
from device_agent.ledger import Ledger
from protocol.messages import Command, CommandBatch, Result
from tests.unit.engine.harness import Harness, chain_dag, results

ROOT = Path(__file__).resolve().parent.parent


def normalized(sql: str) -> str:
    """A statement with every value a `?`: a traced one (values written in) and one with
    placeholders compare equal when they are the same statement."""
    sql = re.sub(r"'(?:[^']|'')*'", "?", sql)
    return re.sub(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])", "?", sql)


async def test_the_floor_writes_what_the_engine_writes_for_a_chained_node(tmp_path: Path) -> None:
    h = await (await asyncio.to_thread(Harness, tmp_path)).open()  # (it migrates a template first)
    try:
        device = await h.enroll("d1")
        await h.connect(device)
        await h.submit(chain_dag(6))
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
    engine = Counter(normalized(s) for s in traced)
    floor = Counter(normalized(s) for s in [*SERVER_SQL, EVENTS_SQL, NEXT_EVENT_SQL, "BEGIN IMMEDIATE", "COMMIT"])
    assert engine == floor
    assert traced[0] == "BEGIN IMMEDIATE" and traced[-1] == "COMMIT"


def test_the_floor_agent_writes_what_the_ledger_writes_for_a_batch(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.db", "dev_1")
    try:

        def batch(n: int) -> CommandBatch:
            command = Command(call_id="c1", tool="system.echo", tool_type="data_collection", arguments={"text": "x"})
            return CommandBatch(
                seq=n, batch_id=f"b{n}", task_id="t", node_id=f"n{n}", attempt=1, fence=n, commands=[command]
            )

        def run(n: int, acknowledged: list[str]) -> None:
            ledger.receive(batch(n), acknowledged)
            ledger.start_call(f"b{n}", "c1")
            ledger.finish_batch(f"b{n}", n, [Result(call_id="c1", status="success", result={"text": "x"})])

        run(1, [])
        traced: list[str] = []
        ledger._db.set_trace_callback(traced.append)
        run(2, ["b1"])  # as in the floor: the result of the batch before was acknowledged
        ledger._db.set_trace_callback(None)
    finally:
        ledger.close()
    floor = [
        "BEGIN IMMEDIATE",
        *RECEIPT_SQL,
        "COMMIT",
        STARTED_SQL,
        "BEGIN IMMEDIATE",
        *RESULTS_SQL,
        "COMMIT",
    ]
    assert [normalized(s) for s in traced] == [normalized(s) for s in floor]


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
    assert set(figures) == {"floor_p50", "echo_p50", "store", "replicas"}
    assert (figures["store"], figures["replicas"]) == ("sqlite", 1)
    assert figures["floor_p50"] > 0 and figures["echo_p50"] > 0
    assert "durable floor (hops and commits only)" in out
