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

With `--store postgres` the server's transaction runs on a throwaway Postgres with a
production's durability (bench/stores.py: `synchronous_commit=on`, `fsync=on`): the same rows,
written by the store's own writer (`pg_floor_step`), so in the engine's one round trip per
commit (one statement of CTEs over `unnest`, committed on its own; with `--guard`, its first part
checks and locks the engine lease's row, as a replicated leader's commit does).
The agent's ledger is SQLite on every store, as the real agent's.

    python bench/rtt_floor.py [--nodes 1000] [--echo 2000] [--store sqlite|postgres] [--guard]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.echo import echo_rtt, frame_size, percentile
from bench.stores import add_store_options, check_store_options
from tests.support import free_port

if TYPE_CHECKING:
    from orchestrator.store.pg_writer import PostgresWriter
    from tests.unit.engine.harness import Harness

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


GUARD = ("engine", "floor", 1)  # (lease, holder, fence) of the floor's stand-in leader


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=NORMAL", "wal_autocheckpoint=0"):
        db.execute(f"PRAGMA {pragma}")
    return db


# ---------------------------------------------------------------------------------- server


def _batch_frame(i: int, batch_id: str, task_id: str, node: str, fence: int, command: list[dict[str, Any]]) -> str:
    frame = {
        "type": "command_batch",
        "seq": i + 1,
        "ack": i,
        "batch_id": batch_id,
        "task_id": task_id,
        "node_id": node,
        "attempt": 1,
        "fence": fence,
        "commands": command,
        "early_exit": True,
        "deadline": None,
    }
    return json.dumps(frame, separators=(",", ":"))


COMMAND = [{"call_id": "c1", "tool": "system.echo", "tool_type": "data_collection", "arguments": {"text": "x"}}]
Step = Callable[[int, str | None], Awaitable[str]]


async def _serve(port: int, nodes: list[str], step: Step) -> list[float]:
    """Serve one agent: node 0's batch, then for each result frame the next step; the samples."""
    from websockets.asyncio.server import serve

    samples: list[float] = []
    finished = asyncio.get_running_loop().create_future()

    async def handler(ws: Any) -> None:
        try:
            t0 = time.perf_counter()
            await ws.send(await step(0, None))
            for i in range(1, len(nodes)):
                message = json.loads(await ws.recv())
                samples.append((time.perf_counter() - t0) * 1000)  # node i-1: its transaction to its results
                t0 = time.perf_counter()
                await ws.send(await step(i, json.dumps(message["results"], separators=(",", ":"))))
            await ws.recv()
        except Exception as exc:  # the agent went away, or a statement failed: end the run with it
            finished.set_exception(exc)
        else:
            finished.set_result(None)

    async with serve(handler, "127.0.0.1", port, compression=None):
        print("ready", flush=True)
        await finished
    return samples[WARMUP:]


async def _server(db_path: str, port: int, task_id: str, device_id: str, nodes: list[str], fence: int) -> list[float]:
    from orrery.checkpoints import Checkpoints

    db = _connect(db_path)
    checkpoints = Checkpoints(db_path)
    cursor = db.cursor()
    batch_of = {nodes[0]: "b_floor_00000000000000"}
    commands_json = json.dumps(COMMAND, separators=(",", ":"))

    async def step(i: int, results: str | None) -> str:
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
        return _batch_frame(i, batch_id, task_id, node, fence + i, COMMAND)

    try:
        samples = await _serve(port, nodes, step)
        done = db.execute("SELECT count(*) FROM attempts WHERE status = 'succeeded' AND task_id = ?", (task_id,))
        assert done.fetchone()[0] == len(nodes) - 1, "the floor's transactions did not all land"
    finally:
        checkpoints.close()
        db.close()
    return samples


def pg_floor_step(
    writer: PostgresWriter, task_id: str, device_id: str, nodes: list[str], fence: int, guard: bool
) -> Step:
    """The floor's step on Postgres: the rows the engine's group commit writes for a chained node
    (node i-1's attempt ended and the node succeeded, node i's attempt inserted, the device's
    fence, node i running, five events, numbered by Postgres), handed to the store's own
    writer (`PostgresWriter`), so its round trip is the engine's: one statement, committed on its
    own (with `guard`, the engine lease's check and row lock its first part)."""
    from orchestrator.store.models import Attempt, Device, Event, Node

    attempts, devices, rows, events = (_table(m) for m in (Attempt, Device, Node, Event))
    batch_of = {nodes[0]: "b_floor_00000000000000"}
    held = GUARD if guard else None

    async def step(i: int, results: str | None) -> str:
        node, now = nodes[i], datetime.now(UTC)
        at = now.isoformat()
        batch_id = batch_of[node] = f"b_floor_{i:014d}"
        attempt = {
            "batch_id": batch_id, "commands": COMMAND, "deadline": now, "device_id": device_id, "fence": fence + i,
            "kind": "tool", "n": 1, "node_id": node, "parent_batch_id": None, "started_at": now,
            "status": "dispatched", "task_id": task_id,
        }  # fmt: skip
        updates: list[tuple[Any, list[tuple[tuple[Any, ...], dict[str, Any]]]]] = [
            (devices, [((device_id,), {"current_batch_id": batch_id, "fence": fence + i})])
        ]
        running = {
            "attempts": 1, "not_before": None, "queued_on": None, "ready_since": now, "started_at": now,
            "state": "running",
        }  # fmt: skip
        happened = []
        if results is None:  # the first round, with no results yet: node 0 starts, nothing ends
            updates.append((rows, [((task_id, node), running)]))
        else:
            prev, ended = nodes[i - 1], json.loads(results)
            updates.append((attempts, [((batch_of[prev],), {
                "accepted_at": now, "ended_at": now, "error": None, "results": ended, "status": "succeeded",
            })]))  # fmt: skip
            succeeded = {
                "attempts": 1, "error": None, "finished_at": now, "not_before": None, "output": {"ok": True},
                "queued_on": None, "ready_since": now, "results": ended, "state": "succeeded",
            }  # fmt: skip
            updates.append((rows, [((task_id, prev), succeeded), ((task_id, node), running)]))
            happened += [("node.attempt", prev, "succeeded"), ("node.state", prev, "succeeded")]
        happened += [
            ("node.state", node, "ready"),
            ("node.state", node, "running"),
            ("node.attempt", node, "dispatched"),
        ]
        new_events = []
        if results is not None:
            for kind, node_id, state in happened:
                data = {"at": at, "node_id": node_id, "state": state, "task_id": task_id}
                if kind == "node.attempt":
                    data |= {"attempt": 1, "batch_id": batch_of[node_id], "device_id": device_id}
                new_events.append({"at": now, "data": data, "node_id": node_id, "task_id": task_id, "type": kind})
        await writer.write([(attempts, [attempt])], updates, [], (events, new_events) if new_events else None, held)
        return _batch_frame(i, batch_id, task_id, node, fence + i, COMMAND)

    return step


async def _server_pg(
    database_url: str, port: int, task_id: str, device_id: str, nodes: list[str], fence: int, guard: bool
) -> list[float]:
    """`_server` on Postgres: the store's own writer (one connection, the engine's three round
    trips per commit)."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from orchestrator.store.pg_writer import PostgresReader, PostgresWriter

    engine = create_async_engine(database_url)
    writer = PostgresWriter(engine)
    reader = PostgresReader(engine)
    try:
        samples = await _serve(port, nodes, pg_floor_step(writer, task_id, device_id, nodes, fence, guard))
        done = await reader.fetch(
            "SELECT count(*) FROM attempts WHERE status = 'succeeded' AND task_id = $1 AND batch_id LIKE 'b_floor_%'",
            task_id,
        )
        assert done[0][0] == len(nodes) - 1, "the floor's transactions did not all land"
    finally:
        await writer.close()
        await reader.close()
        await engine.dispose()
    return samples


def _table(model: Any) -> Any:
    return model.__table__


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


async def harness(tmp: Path, database_url: str | None = None, **settings: Any) -> Harness:
    """The engine's in-process harness (tests/unit/engine/harness.py), opened: on its SQLite file
    in `tmp`, or on the (empty) Postgres database at `database_url`, migrated first."""
    from orchestrator.store.migrate import upgrade_async
    from orchestrator.store.repo import Store
    from tests.unit.engine.harness import Harness

    h = await asyncio.to_thread(lambda: Harness(tmp, **settings))
    if database_url is not None:  # the same engine on the Postgres store
        await upgrade_async(database_url)
        await h.store.close()
        h.url, h.store = database_url, Store(database_url)
        h.engine = h._engine()
    return await h.open()


async def _prepare_store(tmp: Path, nodes: int, database_url: str | None = None) -> tuple[str, str, list[str], int]:
    """A migrated store (the SQLite file in `tmp`, or the Postgres database at `database_url`)
    with a chain task of `nodes` no-op nodes for one connected device, set up by the real engine:
    (task id, device id, node ids, the device's next fence)."""
    from tests.unit.engine.harness import chain_dag

    h = await harness(tmp, database_url)
    try:
        device = await h.enroll("floor")
        await h.connect(device)
        dag = chain_dag(nodes + 1)
        await h.submit(dag)  # (the harness's devices have the `sim` tools) n0 is assigned; the floor runs n1 on
        ids = [n["id"] for n in dag["nodes"]]
        return h.links.sent[-1].message.task_id, device, ids[1:], int(h.links.sent[-1].message.fence) + 1
    finally:
        await h.close()


async def _hold_lease(dsn: str) -> None:
    """The floor's leader holds the engine lease for the run (its commits check it, as a replica's)."""
    import asyncpg

    name, holder, fence = GUARD
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO leases (name, holder, fence, expires_at) VALUES ($1, $2, $3, now() + interval '1 day') "
            "ON CONFLICT (name) DO UPDATE SET holder = $2, fence = $3, expires_at = now() + interval '1 day'",
            name,
            holder,
            fence,
        )
    finally:
        await conn.close()


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
    elif role == "server-pg":
        db, port, task_id, device_id, nodes, fence, guard = argv[1:8]
        run = _server_pg(db, int(port), task_id, device_id, nodes.split(","), int(fence), guard == "guard")
        print(json.dumps(uvloop.run(run)), flush=True)
    else:
        uvloop.run(_agent(argv[1], int(argv[2])))


def floor_rtt(nodes: int, store: str = "sqlite", guard: bool = False) -> list[float]:
    """The floor's samples (ms), after a warm-up of WARMUP rounds: `nodes` - 1 of them. On
    `store` (`postgres`: a throwaway durable one, see bench/stores.py); with `guard` (Postgres
    only), each commit checks the engine lease first, as a replicated leader's does."""
    if nodes < 2:
        raise SystemExit(f"the durable floor needs at least 2 rounds to time one (asked for {nodes})")
    if guard and store != "postgres":
        raise SystemExit("the lease check is a replicated leader's, on Postgres only")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        database_url = None
        if store == "postgres":
            from bench.stores import postgres_database

            database_url = stack.enter_context(postgres_database())
        task_id, device_id, ids, fence = asyncio.run(_prepare_store(tmp, nodes + WARMUP, database_url))
        ledger = tmp / "ledger.db"
        _prepare_ledger(ledger)
        port = free_port()
        me = [sys.executable, __file__, "--child"]
        rest = [str(port), task_id, device_id, ",".join(ids), str(fence)]
        if database_url is None:
            argv = [*me, "server", str(tmp / "engine.db"), *rest]
        else:
            from tests.services import asyncpg_dsn

            if guard:
                asyncio.run(_hold_lease(asyncpg_dsn(database_url)))
            argv = [*me, "server-pg", database_url, *rest, "guard" if guard else "-"]
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
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
    parser.add_argument(
        "--guard", action="store_true", help="with --store postgres: check the engine lease in each commit (replicas)"
    )
    add_store_options(parser, replicas=False)
    args = parser.parse_args()
    check_store_options(parser, args)
    if args.nodes < 2:
        parser.error("--nodes: at least 2 rounds (one of them is timed)")
    if args.guard and args.store != "postgres":
        parser.error("--guard needs --store postgres")
    floor = floor_rtt(args.nodes, args.store, args.guard)
    echo = echo_rtt(frame_size(), args.echo)
    base = statistics.median(echo)
    print("\nround trip; p50/p99 in ms; ratio = p50 / raw echo p50\n")
    print(f"{'system':40} {'n':>6} {'p50':>8} {'p99':>8} {'ratio':>7}")
    for name, samples in (("raw websockets echo", echo), ("durable floor (hops and commits only)", floor)):
        p50 = statistics.median(samples)
        print(f"{name:40} {len(samples):>6} {p50:>8.3f} {percentile(samples, 0.99):>8.3f} {p50 / base:>7.1f}")
    store = (
        "SQLite"
        if args.store == "sqlite"
        else f"Postgres, synchronous_commit=on{', lease checked' if args.guard else ''}"
    )
    print(f"\n(the floor's server store: {store}; the agent's ledger: SQLite)")
    print(json.dumps({"floor_p50": statistics.median(floor), "echo_p50": base, "store": args.store, "replicas": 1}))


if __name__ == "__main__":
    main()
