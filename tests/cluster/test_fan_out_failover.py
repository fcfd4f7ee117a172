"""A fan-out across replicas (issue 20) on real Postgres and Redis: the engine leader is killed
(`kill -9`) in the middle of a rollout; the surviving replica takes the lease, rebuilds the
rollout from the store (its children are rows) and finishes it, each device running the command
once and verifying it once."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.cluster.replicaset import ReplicaSet
from tests.support import shell, wait_until

NAMES = ("web-1", "web-2", "web-3")


def test_killing_the_leader_mid_rollout_finishes_it_elsewhere_without_repeating_a_child(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        leader = rs.leader()
        other = next(r for r in rs.replicas if r is not leader)
        agents = [rs.agent_on(leader, name, {"role": "web"}, fallback=[other]) for name in NAMES]
        dag = {
            "nodes": [
                {
                    "id": "rollout",
                    "for_each": {"labels": {"role": "web"}, "canary": 1, "max_parallel": 1},
                    "commands": [shell(["sh", "-c", "echo ran >> ran.txt; sleep 0.8"])],
                    "verify": [{"tool": "files.read", "arguments": {"path": "ran.txt"}}],
                }
            ]
        }
        with other.client() as c:
            task = c.post("/v1/tasks", json={"dag": dag}).json()
        wait_until((agents[1].workspace / "ran.txt").exists, 60, "the second child to start")
        leader.kill(signal.SIGKILL)
        rs.server = other
        assert rs.leader() is other
        done = rs.wait_task(task["id"], timeout=120)
        rollout = rs.node(done, "rollout")
        assert (done["state"], rollout["state"]) == ("succeeded", "succeeded"), rollout
        for agent in agents:
            assert (agent.workspace / "ran.txt").read_text() == "ran\n", agent.name  # once on each device
        for child in rollout["children"]:
            assert [a["kind"] for a in child["attempts"]] == ["tool", "verify"], child
