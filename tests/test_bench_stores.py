"""Every benchmark's `--store postgres` / `--replicas N` path runs, at tiny sizes, so the flags
cannot rot: each benchmark is run as a user runs it (`python bench/X.py ...`) on the session's
Postgres and Redis (bench/stores.py's ORRERY_BENCH_* variables), and its JSON line keeps its
keys, gains `store` and `replicas`, and holds sane figures. One test starts the harness's own
throwaway Postgres, to check it runs with a production's durability."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.stores import DURABLE_POSTGRES, POSTGRES_SERVER_ENV, REDIS_ENV, postgres_database
from tests.services import asyncpg_dsn, fresh_database, run_async
from tests.support import ROOT, child_env
from tests.unit.engine.harness import chain_dag, results

TIMEOUT_S = 240


@pytest.fixture
def floor_db(postgres_url: str) -> Iterator[str]:
    """A second empty database (the engine's harness and the floor's each number their task 1)."""
    with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture
def servers(postgres_url: str, redis_db: str) -> dict[str, str]:
    return {POSTGRES_SERVER_ENV: postgres_url, REDIS_ENV: redis_db}


def bench(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(**(env or {})),
        timeout=TIMEOUT_S,
        check=False,
    )


def json_line(script: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = bench(script, *args, env=env)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    last = done.stdout.strip().splitlines()[-1]
    figures: dict[str, Any] = json.loads(last)
    return figures


def write_shape(inserts: Any, updates: Any, deletes: Any, events: Any, guard: Any) -> tuple[object, ...]:
    """What a call of the store's Postgres writer writes, whatever the values (the statements it
    sends follow from this alone): per table, in order, the columns of each row inserted or set
    and the keys updated or deleted; the events' columns and count; whether the lease is checked."""
    return (
        [(t.name, [tuple(sorted(row)) for row in rows]) for t, rows in inserts],
        [(t.name, [(len(key), tuple(sorted(values))) for key, values in keyed]) for t, keyed in updates],
        [(t.name, len(keys)) for t, keys in deletes],
        None if events is None else (events[0].name, [tuple(sorted(row)) for row in events[1]]),
        guard is not None,
    )


def test_the_harness_postgres_commits_as_a_production_one_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(POSTGRES_SERVER_ENV, raising=False)

    async def settings(url: str) -> dict[str, str]:
        import asyncpg

        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            return {name: await conn.fetchval(f"SHOW {name}") for name in DURABLE_POSTGRES}
        finally:
            await conn.close()

    with postgres_database() as url:
        assert run_async(settings(url)) == {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


def test_rtt_on_postgres_replicas_measures_the_round_trip_and_its_floor_on_that_store(
    servers: dict[str, str],
) -> None:
    out = json_line(
        "rtt.py", "--store", "postgres", "--replicas", "2", "--nodes", "15", "--echo", "20", "--ray", "0",
        "--floor", "5", env=servers,
    )  # fmt: skip
    assert set(out) == {"orrery_p50", "echo_p50", "ray_p50", "floor_p50", "store", "replicas"}
    assert (out["store"], out["replicas"], out["ray_p50"]) == ("postgres", 2, None)
    assert min(out["echo_p50"], out["floor_p50"], out["orrery_p50"]) > 0


def test_rtt_floor_on_postgres_with_the_lease_check(servers: dict[str, str]) -> None:
    out = json_line("rtt_floor.py", "--store", "postgres", "--guard", "--nodes", "5", "--echo", "20", env=servers)
    assert set(out) == {"floor_p50", "echo_p50", "store", "replicas"}
    assert out["store"] == "postgres" and out["floor_p50"] > 0


def test_dag_throughput_on_postgres_replicas(servers: dict[str, str]) -> None:
    out = json_line(
        "dag_throughput.py", "--store", "postgres", "--replicas", "2", "--layers", "2", "--width", "4",
        "--devices", "4", "--skip-peers", env=servers,
    )  # fmt: skip
    assert {"orrery", "dask_nodes_per_s", "ray_nodes_per_s", "store", "replicas"} <= set(out)
    assert (out["store"], out["replicas"]) == ("postgres", 2)
    assert out["orrery"]["nodes_per_s"] > 0 and len(out["orrery"]["replica_peak_rss_mb"]) == 2
    assert out["orrery"]["server_peak_rss_mb"] == max(out["orrery"]["replica_peak_rss_mb"]) > 10


def test_dag_throughput_keeps_sqlite_as_the_default() -> None:
    out = json_line("dag_throughput.py", "--layers", "2", "--width", "3", "--devices", "2", "--skip-peers")
    assert (out["store"], out["replicas"]) == ("sqlite", 1) and out["orrery"]["nodes_per_s"] > 0


def test_fanout_on_postgres_replicas(servers: dict[str, str]) -> None:
    out = json_line(
        "fanout.py", "--store", "postgres", "--replicas", "2", "--devices", "6", "--canary", "2", env=servers
    )
    assert {"devices", "seconds", "children_per_s", "server_cpu_s", "server_peak_rss_mb"} <= set(out)
    assert (out["store"], out["replicas"], out["devices"]) == ("postgres", 2, 6)
    assert len(out["replica_cpu_s"]) == 2 and out["server_cpu_s"] == pytest.approx(sum(out["replica_cpu_s"]))


def test_devices_on_postgres_replicas(servers: dict[str, str]) -> None:
    out = json_line(
        "devices.py", "--store", "postgres", "--replicas", "2", "--steps", "6", "--interval", "0.5",
        "--window", "1.5", env=servers,
    )  # fmt: skip
    (step,) = out["steps"]
    assert (out["store"], out["replicas"], step["devices"]) == ("postgres", 2, 6)
    assert len(step["rss_mb"]) == 2 and step["beats"] > 0 and 0 < step["lag_p50_ms"] <= step["lag_p99_ms"]


def test_recovery_kills_the_leader_of_postgres_replicas_and_loses_nothing(servers: dict[str, str]) -> None:
    out = json_line(
        "recovery.py", "--store", "postgres", "--replicas", "2", "--nodes", "12", "--devices", "4",
        "--seconds", "0.5", "--lease-ttl-s", "2", env=servers,
    )  # fmt: skip
    assert (out["store"], out["replicas"]) == ("postgres", 2)
    assert (out["lost"], out["ran_twice"]) == (0, 0)
    assert 0 < out["in_flight"] <= 4  # (one device may be between two nodes at the snapshot)
    assert 0 < out["ready_s"] <= out["all_terminal_s"]
    # An in-flight node runs again once a replica leads and its device is linked (at the latest).
    assert out["in_flight_back_s"] <= max(out["ready_s"], out["devices_back_s"])


def test_reconnect_restarts_every_postgres_replica(servers: dict[str, str]) -> None:
    out = json_line(
        "reconnect.py", "--store", "postgres", "--replicas", "2", "--devices", "6", "--policies", "backoff",
        "--processes", "1", "--detail", "0.5", env=servers,
    )  # fmt: skip
    (run,) = out["runs"]
    assert (out["store"], out["replicas"], out["devices"]) == ("postgres", 2, 6)
    assert run["policy"] == "backoff" and 0 < run["ready_s"] <= run["all_welcomed_s"]


def test_rtt_parts_server_side_on_postgres_replicas(servers: dict[str, str]) -> None:
    out = json_line("rtt_parts.py", "--store", "postgres", "--replicas", "2", "--batches", "10", env=servers)
    assert set(out) == {"agent_p50", "server_p50", "echo_p50", "store", "replicas"}
    assert (out["store"], out["replicas"]) == ("postgres", 2) and out["server_p50"] > 0


def test_rtt_timeline_on_postgres(servers: dict[str, str]) -> None:
    out = json_line("rtt_timeline.py", "--store", "postgres", "--nodes", "100", env=servers)
    assert (out["store"], out["replicas"]) == ("postgres", 1)
    assert out["round_p50_us"] > 0 and "server: group commit" in out["steps_us"]


def test_engine_step_on_postgres_times_the_step_and_its_commit(servers: dict[str, str]) -> None:
    out = json_line("engine_step.py", "--store", "postgres", "--nodes", "40", env=servers)
    assert set(out) == {"step_p50_us", "commit_p50_us", "store", "replicas"}
    assert (out["store"], out["replicas"]) == ("postgres", 1)
    assert 0 < out["commit_p50_us"] < out["step_p50_us"]


def test_load_on_postgres_replicas_reports_each_level_against_its_goal(servers: dict[str, str]) -> None:
    out = json_line(
        "load.py", "--store", "postgres", "--replicas", "2", "--devices", "20", "--seconds", "1",
        "--probe-tasks", "6", "--levels", "50,90", env=servers,
    )  # fmt: skip
    assert (out["store"], out["replicas"], out["devices"], out["failed"]) == ("postgres", 2, 20, 0)
    assert out["max_batches_per_s"] > 0
    assert [level["level"] for level in out["levels"]] == [50, 90]
    for level in out["levels"]:
        assert level["offered_batches_per_s"] == pytest.approx(out["max_batches_per_s"] * level["level"] / 100)
        assert level["tasks"] > 0 and level["dispatch_samples"] > 0
        assert 0 < level["dispatch_p50_ms"] <= level["dispatch_p99_ms"]
        assert 0 < level["task_p50_ms"] <= level["task_p99_ms"]
        assert level["goal_dispatch_p99_ms"] == {50: 100.0, 90: 500.0}[level["level"]]
        assert level["goal_held"] == (level["dispatch_p99_ms"] <= level["goal_dispatch_p99_ms"])
        assert len(level["replica_cpu_s"]) == len(level["replica_peak_rss_mb"]) == 2


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("engine_step.py", ["--replicas", "2"]),
        ("router_call.py", ["--store", "postgres"]),
        ("agent_batch.py", ["--replicas", "3"]),
        ("llm_overhead.py", ["--store", "postgres"]),
        ("schedule_viewers.py", ["--store", "postgres", "--replicas", "2"]),
        ("rtt_timeline.py", ["--replicas", "2"]),
    ],
)
def test_a_benchmark_without_a_store_refuses_the_flags_in_one_line(script: str, args: list[str]) -> None:
    done = bench(script, *args)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert f"{' '.join(args)} does not apply" in line
    assert "only" in bench(script, "--help").stdout  # and its --help says so


@pytest.mark.parametrize(
    "script", ["rtt.py", "dag_throughput.py", "fanout.py", "devices.py", "recovery.py", "reconnect.py", "load.py"]
)
def test_replicas_without_postgres_are_refused(script: str) -> None:
    done = bench(script, "--store", "sqlite", "--replicas", "3")
    assert done.returncode == 2
    assert "--replicas N needs --store postgres" in done.stderr


@pytest.mark.parametrize("guarded", [False, True], ids=["one-replica", "replicated-leader"])
async def test_the_postgres_floor_writes_what_the_engine_writes_there_for_a_chained_node(
    tmp_path: Path, postgres_db: str, floor_db: str, guarded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tests/test_rtt_floor.py checks the SQLite floor: one chained step of the real engine on
    Postgres hands the store's writer the same rows, table by table and column by column, as the
    floor's step (so both send the same statements); a replicated leader's (its commits guarded
    by the engine lease) with the lease check, as the floor's with `--guard`."""
    import asyncpg
    from sqlalchemy.ext.asyncio import create_async_engine

    from bench.rtt_floor import GUARD, _hold_lease, _prepare_store, harness, pg_floor_step
    from orchestrator.store.pg_writer import PostgresWriter

    calls: list[tuple[object, ...]] = []
    write = PostgresWriter.write

    async def recorded(self: PostgresWriter, *args: Any) -> list[int]:
        calls.append(write_shape(*args))
        return await write(self, *args)

    monkeypatch.setattr(PostgresWriter, "write", recorded)
    for part in ("engine", "floor"):
        (tmp_path / part).mkdir()
    h = await harness(tmp_path / "engine", postgres_db)
    if guarded:
        name, holder, _ = GUARD
        fence = await h.store.acquire_lease(name, holder, 3600)
        assert fence is not None
        h.engine.lease_guard = (name, holder, fence)
    try:
        device = await h.enroll("d1")
        await h.connect(device)
        await h.submit(chain_dag(6))
        for i in range(4):
            frame = results(device, h.links.sent[-1].message)
            if i == 2:  # a step in the middle of the chain: one node ends, the next starts
                calls.clear()
            await h.step(frame)
            if i == 2:
                engine = list(calls)
    finally:
        await h.close()
    assert len(engine) == 1  # the step is one commit

    # the floor, on a chain task of its own in a database of its own
    task_id, device_id, nodes, fence = await _prepare_store(tmp_path / "floor", 3, floor_db)
    if guarded:
        await _hold_lease(asyncpg_dsn(floor_db))
    sa_engine = create_async_engine(floor_db)
    writer = PostgresWriter(sa_engine)
    conn = await asyncpg.connect(asyncpg_dsn(floor_db))
    try:
        step = pg_floor_step(writer, task_id, device_id, nodes, fence, guarded)
        first = json.loads(await step(0, None))
        calls.clear()
        ended = [{"call_id": c["call_id"], "status": "success", "result": {"ok": True}} for c in first["commands"]]
        await step(1, json.dumps(ended))
        landed = await conn.fetchval(
            "SELECT count(*) FROM attempts WHERE batch_id = $1 AND status = 'succeeded'", first["batch_id"]
        )
    finally:
        await conn.close()
        await writer.close()
        await sa_engine.dispose()
    assert landed == 1
    assert calls == engine
    assert engine[0][-1] is guarded
