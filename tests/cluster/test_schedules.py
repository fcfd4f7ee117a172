"""A schedule across replicas on real Postgres and Redis (issue 20): the engine leader fires its
ticks; `kill -9` of the leader mid-schedule hands them to the next leader, and every tick still
ends as exactly one outcome, with exactly one task for each tick that made one, run once."""

from __future__ import annotations

import signal
from datetime import datetime
from pathlib import Path
from typing import Any

from orchestrator.domain import cron
from tests.cluster.replicaset import Replica, ReplicaSet
from tests.support import shell, wait_until

EVERY_2S = "*/2 * * * * *"


def _get(replica: Replica, path: str, **params: Any) -> Any:
    with replica.client() as c:
        r = c.get(path, params=params)
        assert r.status_code == 200, r.text
        return r.json()


def ticks(replica: Replica, schedule_id: str) -> list[dict[str, Any]]:
    return list(reversed(_get(replica, f"/v1/schedules/{schedule_id}/ticks", limit=500)["items"]))


def created(replica: Replica, schedule_id: str) -> list[dict[str, Any]]:
    return [t for t in ticks(replica, schedule_id) if t["outcome"] == "created"]


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_killing_the_leader_mid_schedule_leaves_exactly_one_task_per_tick(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        leader = rs.leader()
        other = next(r for r in rs.replicas if r is not leader)
        agent = rs.agent_on(other, "stamper", {"role": "cron"}, fallback=[leader])
        node = {
            "id": "stamp",
            "placement": {"labels": {"role": "cron"}},
            "commands": [shell(["sh", "-c", "echo x >> ran.txt"])],
        }
        with other.client() as c:  # made through a replica that does not lead: it crosses to the leader
            r = c.post("/v1/schedules", json={"name": "failover", "cron": EVERY_2S, "task": {"dag": {"nodes": [node]}}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        wait_until(lambda: len(created(other, sid)) >= 3, 60, "three ticks made by the first leader")

        leader.kill(signal.SIGKILL)
        rs.server = other
        assert rs.leader() is other
        before = len(created(other, sid))
        wait_until(lambda: len(created(other, sid)) >= before + 3, 90, "three ticks made by the next leader")
        with other.client() as c:
            assert c.post(f"/v1/schedules/{sid}/pause").status_code == 200

        def made() -> list[dict[str, Any]]:
            tasks = _get(other, "/v1/tasks", limit=500)["items"]
            return [t for t in tasks if t["labels"].get("orrery.schedule") == sid]

        wait_until(lambda: all(t["state"] in ("succeeded", "failed") for t in made()), 60, "every task to end")
        recorded = ticks(other, sid)
        # Every tick from the first to the last is recorded exactly once, none twice, none lost.
        every = cron.parse(EVERY_2S, "UTC", at(recorded[0]["at"]))
        first, last = at(recorded[0]["at"]), at(recorded[-1]["at"])
        expected = [first, *every.upcoming(first, 10_000)]
        assert [at(t["at"]) for t in recorded] == [t for t in expected if t <= last], recorded
        assert {t["outcome"] for t in recorded} <= {"created", "skipped", "missed"}, recorded
        # One task per created tick, made for that tick, and nothing else made by the schedule.
        tasks = {t["id"]: t for t in made()}
        made_ticks = [t for t in recorded if t["outcome"] == "created"]
        assert sorted(t["task_id"] for t in made_ticks) == sorted(tasks)
        assert sorted(at(tasks[t["task_id"]]["labels"]["orrery.tick"]) for t in made_ticks) == [
            at(t["at"]) for t in made_ticks
        ]
        # Each ran once on the device, and every one of them succeeded.
        assert all(t["state"] == "succeeded" for t in tasks.values()), tasks
        assert len((agent.workspace / "ran.txt").read_text().split()) == len(tasks)
        assert _get(other, f"/v1/schedules/{sid}")["paused"] is True
