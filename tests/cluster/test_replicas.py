"""Replicas on real Postgres and Redis (SPEC section 7): work crosses replicas, events reach every
replica, a killed leader's tasks finish elsewhere, and nothing runs twice."""

from __future__ import annotations

import itertools
import json
import signal
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.cluster.replicaset import Replica, ReplicaSet
from tests.simdevice import SimFleet
from tests.support import shell, wait_until


def events(replica: Replica, task_id: str, into: list[tuple[int, str, str]], done: threading.Event) -> None:
    """Read a task's event stream from one replica until the task ends."""
    headers = {"Authorization": f"Bearer {replica.api_key}"}
    with httpx.stream(
        "GET", f"{replica.url}/v1/tasks/{task_id}/events", headers=headers, timeout=httpx.Timeout(60)
    ) as resp:
        event_id, kind = 0, ""
        for line in resp.iter_lines():
            if line.startswith("id:"):
                event_id = int(line[3:])
            elif line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                into.append((event_id, kind, json.loads(line[5:]).get("state", "")))
    done.set()


def test_a_task_submitted_to_one_replica_runs_on_a_device_of_another_and_both_stream_it(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        a, b = rs.replicas
        rs.agent_on(b, "on-b", {"where": "b"})
        dag = {
            "nodes": [
                {"id": "one", "placement": {"labels": {"where": "b"}}, "commands": [shell(["echo", "crossed"])]},
                {"id": "two", "placement": {"labels": {"where": "b"}}, "commands": [shell(["echo", "again"])]},
            ],
            "edges": [{"from": "one", "to": "two"}],
        }
        with a.client() as c:
            task = c.post("/v1/tasks", json={"dag": dag}).json()
        seen: dict[str, list[tuple[int, str, str]]] = {"a": [], "b": []}
        done = {k: threading.Event() for k in seen}
        readers = [
            threading.Thread(target=events, args=(r, task["id"], seen[k], done[k]), daemon=True)
            for k, r in (("a", a), ("b", b))
        ]
        for t in readers:
            t.start()
        final = rs.wait_task(task["id"])
        assert final["state"] == "succeeded", final
        assert [n["output"]["stdout"] for n in final["nodes"]] == ["crossed\n", "again\n"]
        assert all(d.wait(30) for d in done.values())
        assert seen["a"] == seen["b"]  # every replica sees every event, in order
        assert seen["a"][-1][1:] == ("task.state", "succeeded")
        ids = [e[0] for e in seen["a"]]
        assert ids == sorted(set(ids))


def test_killing_the_leader_mid_task_hands_the_task_to_another_replica_without_repeating_work(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        leader = rs.leader()
        other = next(r for r in rs.replicas if r is not leader)
        agent = rs.agent_on(leader, "survivor", fallback=[other])
        steps = [f"s{i}" for i in range(5)]
        dag = {
            "nodes": [{"id": s, "commands": [shell(["sh", "-c", f"echo {s} >> ran.txt; sleep 0.6"])]} for s in steps],
            "edges": [{"from": x, "to": y} for x, y in itertools.pairwise(steps)],
        }
        with other.client() as c:
            task = c.post("/v1/tasks", json={"dag": dag}).json()
        ran = agent.workspace / "ran.txt"
        wait_until(lambda: ran.exists() and len(ran.read_text().split()) >= 2, 60, "two steps to run")
        leader.kill(signal.SIGKILL)
        rs.server = other  # talk to the survivor from now on
        assert rs.leader() is other
        done = rs.wait_task(task["id"], timeout=120)
        assert done["state"] == "succeeded", done
        assert ran.read_text().split() == steps  # each step ran exactly once
        assert all(len(n["attempts"]) == 1 for n in done["nodes"])
        assert rs.device(agent.device_id)["state"] in ("idle", "busy")
        assert "connected to" in agent.log() and other.url.split("//")[1] in agent.log()


def test_two_replicas_racing_over_200_ready_nodes_dispatch_each_exactly_once(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        sims = SimFleet()
        try:
            for i, replica in enumerate(rs.replicas * 3):
                sims.add(replica.url, rs.enroll(f"sim-{i}"))
            created: list[str] = []

            def submit(replica: Replica, count: int) -> None:
                with replica.client() as c:
                    for k in range(count):
                        body = {"dag": {"nodes": [{"id": f"n{k}", "commands": [{"tool": "sim.noop"}]}]}}
                        created.append(c.post("/v1/tasks", json=body).json()["id"])

            threads = [threading.Thread(target=submit, args=(r, 100)) for r in rs.replicas]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(created) == 200
            wait_until(lambda: _all_ended(rs, created), 120, "all 200 tasks to end")
            executions = [e.batch_id for d in sims.devices for e in d.executions]
            assert len(executions) == 200 and len(set(executions)) == 200
            with rs.server.client() as c:
                attempts = [len(c.get(f"/v1/tasks/{t}").json()["nodes"][0]["attempts"]) for t in created]
            assert attempts == [1] * 200
            assert sum(1 for r in rs.replicas if r.is_leader()) == 1
        finally:
            sims.close()


def _all_ended(rs: ReplicaSet, ids: list[str]) -> bool:
    with rs.server.client() as c:
        page: list[dict[str, Any]] = c.get("/v1/tasks", params={"limit": 500, "state": "succeeded"}).json()["items"]
    return len({t["id"] for t in page} & set(ids)) == len(ids)
