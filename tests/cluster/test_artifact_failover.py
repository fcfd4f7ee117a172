"""Artifacts across replicas (issue 20, SPEC section 7): the engine leader killed with SIGKILL in
the middle of an upload and in the middle of a download. The agent dials the leader (through a
rate-holding proxy, so the kill lands mid-transfer) and fails over to the other replica, which
takes the rest of the pieces or serves the rest of the bytes from Postgres: the tools succeed,
the file is whole, one attempt each, and the transfer resumed rather than started over."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.chaos.test_artifact_restarts import FAULT_AT, LOST_AT_MOST, RATE, SIZE, SlowLink, check_moved, moving
from tests.cluster.replicaset import ReplicaSet
from tests.integration.test_artifacts import random_file
from tests.support import wait_until


@pytest.mark.parametrize("way", ["upload", "download"])
def test_the_leader_killed_mid_transfer_hands_it_to_the_other_replica(
    tmp_path: Path, postgres_db: str, redis_db: str, way: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        leader = rs.leader()
        other = next(r for r in rs.replicas if r is not leader)
        link = SlowLink(leader.port, RATE)
        spare = SlowLink(other.port, 50 * RATE)  # only counts: the bytes that went the other way
        try:
            slow = rs.agent_at(link.url, "slow", also=[spare.url])  # dials the leader, fails over
            fast = rs.agent_at(other.url, "fast")
            for agent in (slow, fast):
                rs.wait_device(agent.device_id, "idle")
            producer, consumer = (slow, fast) if way == "upload" else (fast, slow)
            digest = random_file(producer.workspace / "big.bin", SIZE)
            with other.client() as c:
                task = c.post("/v1/tasks", json={"dag": moving(producer, consumer)}).json()
            crossed = (lambda: link.up) if way == "upload" else (lambda: link.down)
            rest = (lambda: spare.up) if way == "upload" else (lambda: spare.down)
            wait_until(lambda: crossed() >= FAULT_AT, 90, f"the {way} to be well under way", interval=0.01)
            leader.kill(signal.SIGKILL)
            link.close()  # the way to the dead replica is gone: the next URL is the survivor
            rs.server = other
            retries = dict(zip(("upload", "download"), check_moved(rs, task, consumer, digest), strict=True))
            assert retries[way] >= 1
            assert rest() > 0, "nothing went through the survivor"
            assert crossed() + rest() < SIZE + LOST_AT_MOST, f"{crossed()} + {rest()} bytes: it started over"
        finally:
            link.close()
            spare.close()
