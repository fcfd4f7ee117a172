"""The durable floor of a round trip: what `bench/rtt.py`'s round trip costs with nothing but the
hops and the commits, measured in the same run as the raw echo.

Two processes, as in the real system: a "server" and an "agent", `websockets` on both ends, on
uvloop (what `orrery serve` and `orrery agent` run on), JSON frames of the real frames' size and
shape. Per round they do what the real ones do to their databases and nothing else:
- the server, on a result frame: one transaction on a real, migrated Orrery store holding a real
  chain task (prepared by the engine), with the statements the engine's group commit issues for a
  chained node (the attempt ended, the node succeeded, the next attempt inserted, the device's
  fence, the next node running, five events), then the next `command_batch`;
- the agent, on a `command_batch`: its three ledger writes on a real ledger file (the batch
  recorded, the command started, the results recorded in the outbox with the acknowledged entry
  let go), a no-op call between the second and third, then the `result_batch`.
No engine, no placement, no validation, no safety checks, no events to subscribers. Both
databases: WAL, synchronous=NORMAL, checkpoints on their own thread, as in the real ones.

A sample is the server's time from opening node i's transaction to having decoded node i's
results: `bench/rtt.py`'s sample (an attempt's `started_at` to its `ended_at`) without the work.

    python bench/rtt_floor.py [--nodes 1000] [--echo 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.echo import echo_rtt, frame_size, percentile
from tests.support import free_port

WARMUP = 50

SERVER_SQL = [
    "UPDATE attempts SET status = 'succeeded', ended_at = ?, results = ?, error = NULL, accepted_at = ? "
    "WHERE batch_id = ?",
    "UPDATE nodes SET state = 'succeeded', attempts = 1, queued_on = NULL, ready_since = ?, not_before = NULL, "
    "output = ?, results = ?, error = NULL, finished_at = ? WHERE task_id = ? AND id = ?",
    "INSERT INTO attempts (batch_id, parent_batch_id, kind, task_id, node_id, n, device_id, fence, commands, status, "
    "deadline, started_at) VALUES (?, NULL, 'tool', ?, ?, 1, ?, ?, ?, 'dispatched', ?, ?)",
    "UPDATE devices SET current_batch_id = ?, fence = ? WHERE id = ?",
    "UPDATE nodes SET state = 'running', attempts = 1, queued_on = NULL, ready_since = ?, not_before = NULL, "
    "started_at = ? WHERE task_id = ? AND id = ?",
]
# The agent's ledger writes per batch (`device_agent.ledger`): the receipt (one transaction), the
# command started (one statement), the results (one transaction, letting go of the last
# acknowledged outbox entry).
RECEIPT_SQL = [
    "SELECT state FROM batches WHERE batch_id=?",
    "INSERT INTO batches (batch_id, fence, frame, state, received_at) VALUES (?,?,?,?,?)",
    "INSERT INTO fences (server_id, device_id, max_fence) VALUES (?,?,?) "
    "ON CONFLICT(server_id, device_id) DO UPDATE SET max_fence=excluded.max_fence",
]
STARTED_SQL = "UPDATE batches SET state='running', running_call=? WHERE batch_id=? AND state!='done'"
RESULTS_SQL = [
    "UPDATE batches SET state='done', finished_at=?, results=?, running_call=NULL WHERE batch_id=?",
    "INSERT OR REPLACE INTO outbox (batch_id, fence, results, created_at) VALUES (?,?,?,?)",
    "DELETE FROM calls WHERE batch_id=?",
    "DELETE FROM outbox WHERE batch_id=?",
]
NEXT_EVENT_SQL = "SELECT coalesce(max(id), 0) FROM events"
EVENTS_SQL = "INSERT INTO events (task_id, type, node_id, data, at, id) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?)"] * 5)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL", "wal_autocheckpoint=0"):
        db.execute(f"PRAGMA {pragma}")
    return db


# ---------------------------------------------------------------------------------- server


async def _server(db_path: str, port: int, task_id: str, device_id: str, nodes: list[str], fence: int) -> list[float]:
    from websockets.asyncio.server import serve

    from orrery.checkpoints import Checkpoints

    db = _connect(db_path)
    checkpoints = Checkpoints(db_path)
    cursor = db.cursor()
    batch_of = {nodes[0]: "b_floor_00000000000000"}
    command = [{"call_id": "c1", "tool": "system.echo", "tool_type": "data_collection", "arguments": {"text": "x"}}]
    commands_json = json.dumps(command, separators=(",", ":"))
    samples: list[float] = []
    finished = asyncio.get_running_loop().create_future()

    def step(i: int, results: str | None) -> str:
        """Node i-1's results applied (if any), node i assigned: one transaction; node i's frame."""
        node, now = nodes[i], _now()
        batch_id = batch_of[node] = f"b_floor_{i:014d}"
        cursor.execute("BEGIN IMMEDIATE")
        events = []
        if results is not None:
            prev = nodes[i - 1]
            cursor.execute(SERVER_SQL[0], (now, results, now, batch_of[prev]))
            cursor.execute(SERVER_SQL[1], (now, '{"ok":true}', results, now, task_id, prev))
            events += [("node.attempt", prev, "succeeded"), ("node.state", prev, "succeeded")]
        cursor.execute(SERVER_SQL[2], (batch_id, task_id, node, device_id, fence + i, commands_json, now, now))
        cursor.execute(SERVER_SQL[3], (batch_id, fence + i, device_id))
        cursor.execute(SERVER_SQL[4], (now, now, task_id, node))
        events += [("node.state", node, "ready"), ("node.state", node, "running"), ("node.attempt", node, "dispatched")]
        first = int(cursor.execute(NEXT_EVENT_SQL).fetchone()[0]) + 1
        if len(events) == 5:  # (the first round, with no results yet, writes no events)
            params: list[object] = []
            for n, (kind, node_id, state) in enumerate(events):
                data = {"task_id": task_id, "at": now, "state": state, "node_id": node_id, "batch_id": batch_id}
                params += [task_id, kind, node_id, json.dumps(data, separators=(",", ":")), now, first + n]
            cursor.execute(EVENTS_SQL, params)
        cursor.execute("COMMIT")
        frame = {
            "type": "command_batch",
            "seq": i + 1,
            "ack": i,
            "batch_id": batch_id,
            "task_id": task_id,
            "node_id": node,
            "attempt": 1,
            "fence": fence + i,
            "commands": command,
            "early_exit": True,
            "deadline": None,
        }
        return json.dumps(frame, separators=(",", ":"))

    async def handler(ws) -> None:
        try:
            t0 = time.perf_counter()
            await ws.send(step(0, None))
            for i in range(1, len(nodes)):
                message = json.loads(await ws.recv())
                samples.append((time.perf_counter() - t0) * 1000)  # node i-1: its transaction to its results
                t0 = time.perf_counter()
                await ws.send(step(i, json.dumps(message["results"], separators=(",", ":"))))
            await ws.recv()
        except Exception as exc:  # the agent went away, or a statement failed: end the run with it
            finished.set_exception(exc)
        else:
            finished.set_result(None)

    try:
        async with serve(handler, "127.0.0.1", port, compression=None):
            print("ready", flush=True)
            await finished
        done = db.execute("SELECT count(*) FROM attempts WHERE status = 'succeeded' AND task_id = ?", (task_id,))
        assert done.fetchone()[0] == len(nodes) - 1, "the floor's transactions did not all land"
    finally:
        checkpoints.close()
        db.close()
    return samples[WARMUP:]


# ----------------------------------------------------------------------------------- agent


def _noop(text: str) -> dict[str, str]:
    return {"text": text}


async def _agent(ledger_path: str, port: int) -> None:
    from websockets.asyncio.client import connect

    from orrery.checkpoints import Checkpoints

    db = _connect(ledger_path)
    checkpoints = Checkpoints(ledger_path)
    acked: str | None = None
    seq = 0
    try:
        async with connect(f"ws://127.0.0.1:{port}", compression=None) as ws:
            async for data in ws:
                batch = json.loads(data)
                batch_id, fence = batch["batch_id"], batch["fence"]
                db.execute("BEGIN IMMEDIATE")  # the receipt
                db.execute(RECEIPT_SQL[0], (batch_id,)).fetchone()
                db.execute(RECEIPT_SQL[1], (batch_id, fence, data, "received", time.time()))
                db.execute(RECEIPT_SQL[2], ("srv", "dev", fence))
                db.execute("COMMIT")
                db.execute(STARTED_SQL, ("c1", batch_id))
                t0 = time.perf_counter()
                output = _noop(batch["commands"][0]["arguments"]["text"])
                results = [
                    {
                        "call_id": "c1",
                        "status": "success",
                        "result": output,
                        "error": None,
                        "namespace": "system",
                        "duration_ms": (time.perf_counter() - t0) * 1000,
                    }
                ]
                payload, now = json.dumps(results, separators=(",", ":")), time.time()
                db.execute("BEGIN IMMEDIATE")  # the results
                db.execute(RESULTS_SQL[0], (now, payload, batch_id))
                db.execute(RESULTS_SQL[1], (batch_id, fence, payload, now))
                db.execute(RESULTS_SQL[2], (batch_id,))
                if acked is not None:
                    db.execute(RESULTS_SQL[3], (acked,))
                db.execute("COMMIT")
                acked, seq = batch_id, seq + 1
                frame = {"type": "result_batch", "seq": seq, "ack": batch["seq"], "batch_id": batch_id}
                await ws.send(json.dumps({**frame, "fence": fence, "results": results}, separators=(",", ":")))
        rows = db.execute("SELECT count(*) FROM batches WHERE state = 'done'").fetchone()[0]
        assert rows == seq, f"the ledger holds {rows} finished batches of {seq}"
    finally:
        checkpoints.close()
        db.close()


# ---------------------------------------------------------------------------------- set-up


async def _prepare_store(tmp: Path, nodes: int) -> tuple[str, str, list[str], int]:
    """A migrated store with a chain task of `nodes` no-op nodes for one connected device, set
    up by the real engine: (task id, device id, node ids, the device's next fence)."""
    from tests.unit.engine.harness import Harness

    h = await (await asyncio.to_thread(Harness, tmp)).open()
    try:
        device = await h.enroll("floor")
        await h.connect(device)
        ids = [f"n{i}" for i in range(nodes + 1)]
        dag = {
            "nodes": [{"id": n, "commands": [{"tool": "sim.act", "arguments": {"text": "x"}}]} for n in ids],
            "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
        }
        await h.submit(dag)  # (the harness's devices have the `sim` tools) n0 is assigned; the floor runs n1 on
        return h.links.sent[-1].message.task_id, device, ids[1:], int(h.links.sent[-1].message.fence) + 1
    finally:
        await h.close()


def _prepare_ledger(path: Path) -> None:
    from device_agent.ledger import Ledger

    Ledger(path, "dev").close()


def _child(argv: list[str]) -> None:
    import uvloop

    role = argv[0]
    if role == "server":
        db, port, task_id, device_id, nodes, fence = argv[1:7]
        samples = uvloop.run(_server(db, int(port), task_id, device_id, nodes.split(","), int(fence)))
        print(json.dumps(samples), flush=True)
    else:
        uvloop.run(_agent(argv[1], int(argv[2])))


def floor_rtt(nodes: int) -> list[float]:
    """The floor's samples (ms), after a warm-up of WARMUP rounds: `nodes` - 1 of them."""
    if nodes < 2:
        raise SystemExit(f"the durable floor needs at least 2 rounds to time one (asked for {nodes})")
    with tempfile.TemporaryDirectory() as tmp:
        task_id, device_id, ids, fence = asyncio.run(_prepare_store(Path(tmp), nodes + WARMUP))
        ledger = Path(tmp) / "ledger.db"
        _prepare_ledger(ledger)
        port = free_port()
        me = [sys.executable, __file__, "--child"]
        args = [str(Path(tmp) / "engine.db"), str(port), task_id, device_id, ",".join(ids), str(fence)]
        server = subprocess.Popen([*me, "server", *args], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            agent = subprocess.Popen([*me, "agent", str(ledger), str(port)])
            out, _ = server.communicate(timeout=600)
            agent.wait(timeout=60)
        finally:
            server.kill()
        if server.returncode or agent.returncode:
            raise SystemExit(f"the floor's server exited {server.returncode}, its agent {agent.returncode}")
        return list(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--echo", type=int, default=2000)
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes: at least 2 rounds (one of them is timed)")
    floor = floor_rtt(args.nodes)
    echo = echo_rtt(frame_size(), args.echo)
    base = statistics.median(echo)
    print("\nround trip; p50/p99 in ms; ratio = p50 / raw echo p50\n")
    print(f"{'system':40} {'n':>6} {'p50':>8} {'p99':>8} {'ratio':>7}")
    for name, samples in (("raw websockets echo", echo), ("durable floor (hops and commits only)", floor)):
        p50 = statistics.median(samples)
        print(f"{name:40} {len(samples):>6} {p50:>8.3f} {percentile(samples, 0.99):>8.3f} {p50 / base:>7.1f}")
    print(json.dumps({"floor_p50": statistics.median(floor), "echo_p50": base}))


if __name__ == "__main__":
    main()
