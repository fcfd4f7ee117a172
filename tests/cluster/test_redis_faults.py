"""Replicas when Redis misbehaves (SPEC section 7, issue 12): Redis is a hint, so losing its
messages, or Redis itself for a while, may delay work but never loses it, hangs a request or
stops a replica; and a replica a device has left never speaks for it again. Real replicas,
a real Postgres, and a Redis server of each test's own so the test can stop and restart it."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.replicaset import Replica, ReplicaSet
from tests.services import RedisServer, redis_pings, unavailable
from tests.support import TcpProxy, free_port, shell, wait_until


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server not found; install Debian's redis-server package")
    server = RedisServer(Path(tempfile.mkdtemp(prefix="orrery-redis-")), free_port())
    server.start(binary)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


def restart(redis: RedisServer) -> None:
    binary = shutil.which("redis-server")
    assert binary is not None
    redis.start(binary)


def redis_command(redis: RedisServer, *args: str) -> str:
    import socket

    command = "".join(f"${len(a)}\r\n{a}\r\n" for a in args)
    with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as s:
        s.sendall(f"*{len(args)}\r\n{command}".encode())
        return s.recv(4096).decode()


def others(rs: ReplicaSet, leader: Replica) -> Replica:
    return next(r for r in rs.replicas if r is not leader)


def test_redis_down_stops_no_replica_and_a_request_to_a_follower_ends_with_503_in_time(
    tmp_path: Path, postgres_db: str, redis: RedisServer
) -> None:
    """Defects 2 and 3: a Redis outage killed the engine leader (publishing events ran inside the
    commit), and a follower's engine request hung forever when its publish failed."""
    with ReplicaSet(tmp_path, postgres_db, redis.url, cluster_request_timeout_s="4") as rs:
        leader = rs.leader()
        follower = others(rs, leader)
        rs.server = leader
        agent = rs.agent_on(leader, "local-to-leader")
        redis.stop()
        assert not redis_pings("127.0.0.1", redis.port)
        task = rs.submit({"nodes": [{"id": "n", "commands": [shell(["echo", "without redis"])]}]})
        done = rs.wait_task(task["id"], timeout=60)
        assert done["state"] == "succeeded", done
        assert leader.alive() and follower.alive()
        with follower.client() as c:
            started = time.monotonic()
            r = c.post(f"/v1/devices/{agent.device_id}/cordon")
            took = time.monotonic() - started
        assert r.status_code == 503, r.text
        assert r.json()["code"] == "cluster_unavailable"
        assert took < 20, f"the request took {took:.1f}s"
        restart(redis)
        with follower.client() as c:
            r = wait_until(
                lambda: (resp := c.post(f"/v1/devices/{agent.device_id}/cordon")).status_code == 200 and resp,
                60,
                "the follower to reach the engine again",
            )
        assert rs.device(agent.device_id)["state"] == "cordoned"
        assert leader.alive() and follower.alive()


def test_a_task_posted_to_a_follower_while_pubsub_clients_are_killed_still_runs(
    tmp_path: Path, postgres_db: str, redis: RedisServer
) -> None:
    """Defect 4: `CLIENT KILL TYPE pubsub` (what a Redis restart does to every subscriber) lost
    the follower's `task_created`, and the task stayed pending until the next leader change."""
    with ReplicaSet(tmp_path, postgres_db, redis.url) as rs:
        leader = rs.leader()
        follower = others(rs, leader)
        rs.agent_on(leader, "worker")
        ids = []
        with follower.client() as c:
            for i in range(5):
                assert ":" in redis_command(redis, "CLIENT", "KILL", "TYPE", "pubsub")
                body = {"dag": {"nodes": [{"id": "n", "commands": [shell(["echo", str(i)])]}]}}
                r = c.post("/v1/tasks", json=body)
                assert r.status_code == 201, r.text
                ids.append(r.json()["id"])
        rs.server = follower
        for task_id in ids:
            assert rs.wait_task(task_id, timeout=60)["state"] == "succeeded"
        assert leader.is_leader()  # no leader change was needed


def test_a_device_that_moves_to_another_replica_is_not_declared_offline_by_the_one_it_left(
    tmp_path: Path, postgres_db: str, redis: RedisServer
) -> None:
    """Defect 1: the replica the device left keeps its link for a resume; its liveness watcher
    then reported it offline, the engine bumped the fence and ended its running batch
    `device_lost`, although the device was connected and healthy on the other replica."""
    with ReplicaSet(tmp_path, postgres_db, redis.url) as rs:
        leader = rs.leader()
        follower = others(rs, leader)
        proxy = TcpProxy(follower.port)
        try:
            enrolled = rs.enroll("hopper")
            from tests.support import Agent, child_env

            agent = Agent(
                "hopper",
                enrolled["id"],
                enrolled["token"],
                tmp_path / "agents" / "hopper",
                proxy.url,
                {},
                child_env(),
                ["--also-server", leader.url],
            )
            rs.agents.append(agent)
            agent.start()
            rs.wait_device(agent.device_id, "idle")
            task = rs.submit(
                {"nodes": [{"id": "long", "commands": [shell(["sh", "-c", "touch started; sleep 8; echo done"])]}]}
            )
            wait_until((agent.workspace / "started").exists, 30, "the command to start")
            proxy.pause()  # the device loses the follower and reconnects to the leader
            wait_until(lambda: "is offline (no frame" in follower.log(), 30, "the follower to give up its old link")
            done = rs.wait_task(task["id"], timeout=60)
            assert done["state"] == "succeeded", done
            node = rs.node(done, "long")
            assert len(node["attempts"]) == 1 and node["output"]["stdout"] == "done\n"
            assert rs.device(agent.device_id)["state"] == "idle"
            again = rs.submit({"nodes": [{"id": "after", "commands": [shell(["echo", "still mine"])]}]})
            assert rs.wait_task(again["id"], timeout=30)["state"] == "succeeded"
            with httpx.Client(base_url=leader.url, headers={"Authorization": f"Bearer {rs.admin_key}"}) as c:
                assert c.get(f"/v1/devices/{agent.device_id}").json()["state"] != "offline"
        finally:
            proxy.close()
