"""Controls given while the cluster is faulted reach the device once it can be reached (SPEC
sections 3 and 7, docs/replicas.md "Controls"): a control is desired state in the store, sent
until the device reports it applied, so a frame that Redis lost, or that died with its leader,
costs a few seconds and nothing more.

Real replicas on Postgres, a Redis of this module's own to stop and start, and agents connected to
a follower: what the engine leader sends them crosses Redis. Each test's agents and tasks are its
own; the replicas are shared, and a test that kills the leader leaves the next test a new leader
and the killed replica started again as a follower.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster.replicaset import Replica, ReplicaSet
from tests.services import RedisServer, fresh_database, owned_redis_server
from tests.support import Agent, shell, wait_until

pytestmark = pytest.mark.timeout(180)

APPROVE_SHELL = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["shell.run"]'}
HELD = ["sh", "-c", "echo $$ > held.pid; sleep 60; touch finished"]  # only a kill ends it within a test
# Once the fault is over, a control lost in it is sent again within a few seconds (a resend
# interval and a link report); this bound is generous on a loaded machine and far below the
# held command's 60 s.
CONVERGE_S = 25.0
# Redis stays down this long after the control was given: longer than a replica's publish keeps
# trying (its client tries 3 times, backing off up to 1 s), so what the leader sends meanwhile is
# dropped, as in a real outage, and not merely held up until Redis is back.
REDIS_OUTAGE_S = 3.0
# A node waiting for approval this long would have timed out, had its wait counted: less than a
# failover takes (a lease of 3 s to expire, then the new leader recovers).
ASKED_TIMEOUT_S = 2.0
# Longer than the Redis outage, so that only a decision that never reaches the device times it out.
OUTLIVES_OUTAGE_S = REDIS_OUTAGE_S + 7.0


@dataclass
class Cluster:
    rs: ReplicaSet
    redis: RedisServer

    def leader_and_follower(self) -> tuple[Replica, Replica]:
        leader = self.rs.leader()
        return leader, next(r for r in self.rs.replicas if r is not leader)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> Iterator[Cluster]:
    with (
        owned_redis_server() as redis_server,
        fresh_database(postgres_url) as database,
        ReplicaSet(
            tmp_path_factory.mktemp("controls-faults"),
            database,
            redis_server.url,
            together=True,
            approval_confirm_s="2",
        ) as rs,
    ):
        try:
            yield Cluster(rs, redis_server)
        finally:
            for replica in rs.live():
                replica.kill(signal.SIGKILL)  # their shutdown is not under test


@pytest.fixture
def cluster(replicas: Cluster) -> Iterator[Cluster]:
    """The module's replicas, all running and one leading, with Redis up; each test's agents are
    stopped after it."""
    if not replicas.redis.running():
        replicas.redis.start_again()
    replicas.rs.revive()
    wait_until(lambda: all(r.ready() for r in replicas.rs.replicas), 60, "every replica to be ready")
    replicas.rs.server = replicas.rs.leader()
    before = len(replicas.rs.agents)
    try:
        yield replicas
    finally:
        for agent in replicas.rs.agents[before:]:
            agent.stop()


@contextlib.contextmanager
def redis_down(cluster: Cluster) -> Iterator[None]:
    """Redis stopped for the block and `REDIS_OUTAGE_S` after it, then started again (empty, as
    after a restart: subscriptions and presence keys are gone)."""
    cluster.redis.stop()
    try:
        yield
        time.sleep(REDIS_OUTAGE_S)  # the outage's length, not a wait for anything
    finally:
        cluster.redis.start_again()


def on(rs: ReplicaSet, replica: Replica, name: str, **env: str) -> Agent:
    """An agent connected to `replica` only (it never fails over: what reaches it crosses Redis)."""
    agent = rs.agent_at(replica.url, name, **env)
    rs.wait_device(agent.device_id, "idle")
    return agent


def pinned(agent: Agent, *commands: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "n1", "placement": {"device": agent.name}, "commands": list(commands), **spec}]}


def submit(replica: Replica, dag: dict[str, Any]) -> str:
    with replica.client() as c:
        r = c.post("/v1/tasks", json={"dag": dag})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def post(replica: Replica, path: str) -> httpx.Response:
    with replica.client() as c:
        return c.post(path, timeout=60)


def post_until_answered(replica: Replica, path: str, within: float = 90) -> httpx.Response:
    """POST until the answer is not 503 (the request may wait for a new leader)."""

    def once() -> httpx.Response | None:
        with contextlib.suppress(httpx.HTTPError):
            r = post(replica, path)
            return None if r.status_code == 503 else r
        return None

    return wait_until(once, within, f"POST {path} to be answered", interval=0.25)


def get(replica: Replica, path: str) -> dict[str, Any]:
    with replica.client() as c:
        return dict(c.get(path).json())


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not reaped yet, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def held(rs: ReplicaSet, agent: Agent) -> tuple[str, int]:
    """A task whose command runs on `agent` until killed: its id, and the pid of the shell that
    would leave `finished` if nothing killed it."""
    task_id = submit(rs.server, pinned(agent, shell(HELD, timeout_s=120)))
    pid = agent.workspace / "held.pid"
    wait_until(lambda: pid.exists() and pid.read_text().strip(), 30, "the held command to start")
    return task_id, int(pid.read_text())


def ended(replica: Replica, task_id: str, within: float = CONVERGE_S) -> dict[str, Any]:
    return wait_until(
        lambda: (t := get(replica, f"/v1/tasks/{task_id}"))["state"] in ("succeeded", "failed", "cancelled") and t,
        within,
        f"task {task_id} to end",
    )


def outcome(node: dict[str, Any]) -> str:
    """A node's state and error, for an assertion's message."""
    return f"node {node['state']} {node.get('error')}, attempts {[a['status'] for a in node['attempts']]}"


def pending_approval(replica: Replica, task_id: str) -> str:
    def found() -> str:
        items = get(replica, f"/v1/approvals?state=pending&task_id={task_id}")["items"]
        node = get(replica, f"/v1/tasks/{task_id}")["nodes"][0]
        return str(items[0]["id"]) if items and node["state"] == "waiting_approval" else ""

    return wait_until(found, 30, f"a pending approval of task {task_id}")


def test_a_stop_given_while_redis_is_down_kills_the_command_on_a_follower_once_redis_is_back(cluster: Cluster) -> None:
    """Before, the leader answered 200, its frame to the follower was lost with Redis and never
    sent again: the command ran on."""
    leader, follower = cluster.leader_and_follower()
    agent = on(cluster.rs, follower, "stop-redis")
    task_id, pid = held(cluster.rs, agent)
    with redis_down(cluster):
        r = post(leader, f"/v1/devices/{agent.device_id}/stop")
        assert r.status_code == 200, r.text
    wait_until(lambda: not running(pid), CONVERGE_S, "the stopped command to die once Redis is back")
    node = ended(leader, task_id)["nodes"][0]
    assert (node["state"], (node["error"] or {}).get("code")) == ("failed", "device_stopped"), outcome(node)
    assert not (agent.workspace / "finished").exists()


def test_a_cancel_given_while_redis_is_down_kills_the_command_on_a_follower_once_redis_is_back(
    cluster: Cluster,
) -> None:
    """Before, the cancel went out once, into the Redis outage, and the command ran on."""
    leader, follower = cluster.leader_and_follower()
    agent = on(cluster.rs, follower, "cancel-redis")
    task_id, pid = held(cluster.rs, agent)
    with redis_down(cluster):
        r = post(leader, f"/v1/tasks/{task_id}/cancel")
        assert r.status_code == 202, r.text
    wait_until(lambda: not running(pid), CONVERGE_S, "the cancelled command to die once Redis is back")
    assert ended(leader, task_id)["state"] == "cancelled"
    assert not (agent.workspace / "finished").exists()


def test_a_resume_given_while_redis_is_down_lets_a_device_on_a_follower_work_again(cluster: Cluster) -> None:
    """Before, the resume was lost with Redis and the agent stayed stopped, refusing its work."""
    leader, follower = cluster.leader_and_follower()
    agent = on(cluster.rs, follower, "resume-redis")
    assert post(leader, f"/v1/devices/{agent.device_id}/stop").status_code == 200
    wait_until(lambda: "device stopped by an operator" in agent.log(), CONVERGE_S, "the agent to apply the stop")
    with redis_down(cluster):
        r = post(leader, f"/v1/devices/{agent.device_id}/resume")
        assert r.status_code == 200, r.text
    wait_until(lambda: "device resumed by an operator" in agent.log(), CONVERGE_S, "the agent to hear the resume")
    task_id = submit(leader, pinned(agent, shell(["touch", "after"])))
    node = ended(leader, task_id)["nodes"][0]
    assert node["state"] == "succeeded", outcome(node)
    assert (agent.workspace / "after").exists()


def test_an_approval_given_while_redis_is_down_runs_the_command_on_a_follower_once_redis_is_back(
    cluster: Cluster,
) -> None:
    """Before, the leader stored the approval and answered 200, its frame was lost with Redis,
    and the command never ran: the node timed out."""
    leader, follower = cluster.leader_and_follower()
    agent = on(cluster.rs, follower, "approve-redis", **APPROVE_SHELL)
    task_id = submit(leader, pinned(agent, shell(["sh", "-c", "echo ran >> asked"]), timeout_s=OUTLIVES_OUTAGE_S))
    approval_id = pending_approval(leader, task_id)
    with redis_down(cluster):
        # The device cannot confirm it now: 202, asked of the device until it does.
        r = post(leader, f"/v1/approvals/{approval_id}/approve")
        assert r.status_code in (200, 202), r.text
    node = ended(leader, task_id, within=CONVERGE_S + OUTLIVES_OUTAGE_S)["nodes"][0]
    assert node["state"] == "succeeded", outcome(node)
    assert (agent.workspace / "asked").read_text() == "ran\n"
    assert get(leader, f"/v1/approvals/{approval_id}")["state"] == "approved"


def test_a_stop_given_through_a_follower_after_the_leader_is_killed_kills_the_command(cluster: Cluster) -> None:
    """Before, the follower answered 200 and the command ran on."""
    leader, follower = cluster.leader_and_follower()
    agent = on(cluster.rs, follower, "stop-failover")
    task_id, pid = held(cluster.rs, agent)
    leader.kill(signal.SIGKILL)
    r = post_until_answered(follower, f"/v1/devices/{agent.device_id}/stop")  # waits for the new leader
    assert r.status_code == 200, r.text
    wait_until(lambda: not running(pid), CONVERGE_S, "the stopped command to die")
    node = ended(follower, task_id)["nodes"][0]
    assert (node["state"], (node["error"] or {}).get("code")) == ("failed", "device_stopped"), outcome(node)
    assert not (agent.workspace / "finished").exists()


def test_an_approval_given_while_the_leader_is_down_runs_once_the_new_leader_has_the_device_confirm_it(
    cluster: Cluster,
) -> None:
    """Before, the follower answered 200 approved, and the node failed `timeout` without running."""
    leader, follower = cluster.leader_and_follower()
    agent = on(cluster.rs, follower, "approve-failover", **APPROVE_SHELL)
    task_id = submit(leader, pinned(agent, shell(["sh", "-c", "echo ran >> asked"]), timeout_s=ASKED_TIMEOUT_S))
    approval_id = pending_approval(leader, task_id)
    leader.kill(signal.SIGKILL)
    killed = time.monotonic()
    r = post_until_answered(follower, f"/v1/approvals/{approval_id}/approve")
    assert r.status_code in (200, 202), r.text
    node = ended(follower, task_id, within=CONVERGE_S + ASKED_TIMEOUT_S)["nodes"][0]
    assert node["state"] == "succeeded", f"{outcome(node)}, {time.monotonic() - killed:.1f}s after the kill"
    assert (agent.workspace / "asked").read_text() == "ran\n"
    assert get(follower, f"/v1/approvals/{approval_id}")["state"] == "approved"
