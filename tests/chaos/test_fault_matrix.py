"""The fault matrix: one DAG of about a hundred nodes on three real agents, one fault injected while
work is in flight, and the same referee for every fault (tests/chaos/invariants.py): every node
ends, none is lost, none runs twice, failures are honest and the task's outcome follows the DAG
rules (SPEC sections 2, 4 and 7).

Faults: an agent SIGKILLed at each point of its ledger, the single SQLite orchestrator SIGKILLed,
a replica SIGKILLed, Redis restarted, Redis pub/sub clients killed, Postgres restarted, a TCP cut
between an agent and its replica, and a device hopping from one replica to another and back.

Under each fault a person also acts (harness.Controls, judged by invariants.judge_controls): a
device running a command is stopped and then resumed, a task running a command is cancelled, and
an approval is decided, through the API while the fault is on (or just before it, answered after),
on three agents of the case's own, placed where the fault reaches them.

Every case has agents, devices and a task of its own. The agent-crash cases share one orchestrator
(an agent crash leaves it as it was); every replica case gets two fresh replicas on a database and
a Redis of its own, so what one fault leaves behind cannot decide another case. The matrix runs in
the SQLite pass only: the replica cases are on Postgres anyway (a killed leader's successor
restores the engine from it), and the server's store plays no part in an agent crash.

A case that fails because of a product defect not fixed yet is marked `xfail(strict=True)` with
the diagnosis; once the fix lands it XPASSes, which fails the run until the mark goes.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from device_agent.reconnect import FAST_CAP_S
from tests.chaos import harness
from tests.chaos.harness import Case, Controls, StartAgent, StateWatch, restart_without
from tests.chaos.invariants import (
    ASKED,
    CANCEL_HELD,
    CANCEL_THEN,
    OUTAGE,
    STOP_AFTER,
    STOP_HELD,
    VERBS,
    Answer,
    ControlsSeen,
    Execution,
    executions_on_disk,
    judge,
    judge_controls,
)
from tests.cluster.replicaset import Replica, ReplicaSet
from tests.services import PostgresServer, RedisServer, fresh_database, owned_postgres_server, owned_redis_server
from tests.support import Agent, Fleet, TcpProxy, stop_agents, wait_until

pytestmark = pytest.mark.timeout(240)

CRASH_ENV = "ORRERY_AGENT_CRASH_AT"
CRASH_POINTS = ("received", "accepted", "call_started", "call_done", "finished", "sent")
# A crash at these points interrupts a command the device had started: it must end `uncertain`.
INTERRUPTING = frozenset({"call_started", "call_done"})
CRASH_AFTER = 12  # the agent kills itself the 12th time it passes the point: mid-workload (of ~37)
# The orchestrator stays down until every agent has tried this often: long enough that a backoff
# without a fast window (0.5 s doubling to 30 s) would have grown past the recovery goal.
ATTEMPTS_WHILE_DOWN = 6
RECONNECT_WITHIN_S = 5.0  # the recovery goal: every agent back this soon after the orchestrator
HEARTBEAT_TIMEOUT_S = 4.0  # the replicas' (tests/cluster/replicaset.py)
# An operator's decision answers 202 if its device has not confirmed it this soon: short, so a
# decision given while the device is out of reach costs the case little.
APPROVAL_CONFIRM_S = "2"


def start_agents(fleet: Fleet, prefix: str, env: dict[int, dict[str, str]] | None = None) -> list[Agent]:
    """Three agents of one case, started together, waited for together."""
    agents = [fleet.agent(f"{prefix}-{i}", wait=False, **(env or {}).get(i, {})) for i in range(3)]
    for a in agents:
        fleet.wait_device(a.device_id, "idle")
    return agents


def stop_all(agents: list[Agent]) -> None:
    stop_agents(agents)


# ================================================================ one orchestrator on SQLite


@pytest.fixture(scope="module")
def crash_fleet(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Iterator[Fleet]:
    """One orchestrator for the agent-crash cases (an agent crash leaves it as it was)."""
    if backend == "postgres":
        pytest.skip("an agent crash is the agent's and its ledger's business: the SQLite pass covers it")
    with Fleet(
        tmp_path_factory.mktemp("agent-crashes"),
        heartbeat_interval_s="1",
        heartbeat_timeout_s="10",
        approval_confirm_s=APPROVAL_CONFIRM_S,
    ) as f:
        yield f


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_an_agent_killed_at_each_ledger_point_loses_nothing_and_runs_nothing_twice(
    crash_fleet: Fleet, point: str
) -> None:
    decision = ("approved", "denied")[CRASH_POINTS.index(point) % 2]
    controls = Controls(crash_fleet, f"crash-{point}", decision)
    agents = start_agents(crash_fleet, f"crash-{point}", {0: {CRASH_ENV: f"{point}:{CRASH_AFTER}"}})
    victim = agents[0]
    try:
        case = Case(crash_fleet, agents, controls=controls)
        case.submit()
        controls.arm()
        wait_until(
            lambda: (
                victim.proc is not None and (victim.proc.poll() is not None or case.executed(victim) > 2 * CRASH_AFTER)
            ),
            60,
            f"the agent to crash at {point} or to run {2 * CRASH_AFTER} commands",
        )
        status = victim.proc.poll() if victim.proc else None
        assert status == -signal.SIGKILL, f"the agent did not kill itself at {point}:{CRASH_AFTER} (status {status})"
        case.fault(f"the agent killed itself at {point}", victim)
        if point in INTERRUPTING:
            case.interrupted[victim.device_id] = 1
        controls.act(crash_fleet.server)  # while the victim is down
        restart_without(victim, CRASH_ENV)
        verdict = case.finish()
        if point in INTERRUPTING:  # the command it cut short is reported, honestly, as uncertain
            assert verdict.failure_codes["uncertain"] == 1, verdict.summary()
    finally:
        stop_all(agents)
        controls.close()


def test_the_orchestrator_killed_with_work_in_flight_restarts_and_loses_nothing(tmp_path: Path, backend: str) -> None:
    if backend == "postgres":
        pytest.skip("the replica cases already restore the engine from Postgres (a killed leader's successor)")
    settings = {"heartbeat_interval_s": "1", "heartbeat_timeout_s": "10", "approval_confirm_s": APPROVAL_CONFIRM_S}
    with Fleet(tmp_path, **settings) as fleet:
        # Each agent dials through a proxy of its own, which counts and times its attempts.
        proxies = [TcpProxy(fleet.server.port) for _ in range(3)]
        agents: list[Agent] = []
        try:
            controls = Controls(fleet, "orch", "denied")
            for i, proxy in enumerate(proxies):
                agents.append(fleet.agent(f"orch-{i}", start=False))
                agents[-1].server_url = proxy.url
                agents[-1].start()
            for a in agents:
                fleet.wait_device(a.device_id, "idle")
            case = Case(fleet, agents, controls=controls)
            case.submit()
            controls.arm()
            case.wait_executed(case.work.size // 3)
            controls.act(fleet.server)  # just before the kill: the answers come from the restarted one
            case.fault("the orchestrator killed")
            fleet.server.kill(signal.SIGKILL)
            down = time.monotonic()
            seen = [p.attempts for p in proxies]
            wait_until(
                lambda: all(p.attempts - n >= ATTEMPTS_WHILE_DOWN for p, n in zip(proxies, seen, strict=True)),
                60,
                f"every agent to try {ATTEMPTS_WHILE_DOWN} times to reach the dead orchestrator",
            )
            fleet.server.start()  # the same store and port; returns once /readyz answers 200
            # SPEC 4 and the recovery goal: agents retry quickly while an outage is young, so the
            # whole fleet is back within seconds of the orchestrator, not after a 30 s backoff.
            try:
                wait_until(
                    lambda: all(fleet.device(a.device_id)["connected"] for a in agents),
                    RECONNECT_WITHIN_S,
                    f"every agent to be back within {RECONNECT_WITHIN_S:.0f}s of the restart",
                )
            except AssertionError as exc:
                raise AssertionError(f"{exc}; {_gaps(proxies, down)}") from None
            back = time.monotonic()
            assert max(_longest_gap(p, down, back) for p in proxies) <= FAST_CAP_S + 1.0, _gaps(proxies, down)
            case.finish()
        finally:
            for proxy in proxies:
                proxy.close()


def _longest_gap(proxy: TcpProxy, start: float, end: float) -> float:
    """The longest pause before or between an agent's connection attempts (seen by its proxy)
    from `start` to `end`."""
    times = [start, *(t for t in proxy.attempt_times if start <= t <= end)]
    return round(max((b - a for a, b in itertools.pairwise(times)), default=0.0), 2)


def _gaps(proxies: list[TcpProxy], down: float) -> str:
    now = time.monotonic()
    return "longest pauses between each agent's reconnect attempts since the kill: " + ", ".join(
        f"{_longest_gap(p, down, now)}s (last attempt {now - p.attempt_times[-1]:.1f}s ago)" for p in proxies
    )


# ================================================================ replicas on Postgres and Redis


@dataclass
class Cluster:
    """Two replicas of one case, on a database of their own on this module's Postgres server and
    on a Redis server of their own, so a case may restart either and leave nothing behind."""

    rs: ReplicaSet
    postgres: PostgresServer
    redis: RedisServer


@pytest.fixture(scope="module")
def postgres(backend: str) -> Iterator[PostgresServer]:
    if backend == "postgres":
        pytest.skip("replicas always run on Postgres: the SQLite pass already ran this case")
    with owned_postgres_server() as server:
        yield server


@pytest.fixture
def cluster(postgres: PostgresServer, tmp_path: Path) -> Iterator[Cluster]:
    if not postgres.running():
        postgres.start_again()
    with (
        owned_redis_server() as redis_server,
        fresh_database(postgres.url) as database,
        ReplicaSet(tmp_path, database, redis_server.url, together=True, approval_confirm_s=APPROVAL_CONFIRM_S) as rs,
    ):
        try:
            yield Cluster(rs, postgres, redis_server)
        finally:
            stop_agents(rs.agents)
            for replica in rs.live():
                replica.kill(signal.SIGKILL)  # their shutdown is not under test, and a wedged one never ends


def spread(rs: ReplicaSet, prefix: str, urls: list[list[str]]) -> list[Agent]:
    """One agent per entry of `urls` (the URL it dials first, then its failovers)."""
    agents = [rs.agent_at(first, f"{prefix}-{i}", also=rest) for i, (first, *rest) in enumerate(urls)]
    for a in agents:
        rs.wait_device(a.device_id, "idle")
    return agents


def dialing(rs: ReplicaSet, first: str, *also: str) -> StartAgent:
    """Starts the controls' agents of a case: each dials `first`, then fails over to `also`."""
    return lambda name, env: rs.agent_at(first, name, also=also, **env)


def both_ways(rs: ReplicaSet) -> tuple[Replica, Replica, list[list[str]]]:
    """The leader, another replica, and the dial lists of three agents: two on the leader, one on
    the other, each failing over to the other replica."""
    leader = rs.leader()
    other = next(r for r in rs.replicas if r is not leader)
    return leader, other, [[leader.url, other.url], [other.url, leader.url], [leader.url, other.url]]


def assert_replicas_survived(rs: ReplicaSet) -> None:
    """SPEC section 7: losing Redis, Postgres for a while or a message never stops a replica."""
    dead = [f"{r.data_dir.name} exited with {r.proc.returncode}" for r in rs.replicas if r.proc and not r.alive()]
    assert not dead, f"replicas stopped: {dead}"
    wait_until(lambda: all(r.ready() for r in rs.replicas), 30, "every replica to be ready again")


def test_a_tcp_cut_between_an_agent_and_its_replica_resumes_and_loses_nothing(cluster: Cluster) -> None:
    rs = cluster.rs
    _, other, urls = both_ways(rs)
    proxy = TcpProxy(other.port)
    # The controls' agents reach the non-leader through a proxy of their own, cut with the other.
    to_other = TcpProxy(other.port)
    try:
        urls[0] = [proxy.url]  # the first agent reaches the non-leader through the proxy, and only that way
        controls = Controls(rs, "cut", "denied", dialing(rs, to_other.url))
        case = Case(rs, spread(rs, "cut", urls), controls=controls)
        case.submit()
        controls.arm()
        share = case.work.placed_on(case.agents[0].device_id)
        for cut in (1, 2):
            case.wait_executed(share * cut // 3, case.agents[0])
            if cut == 1:
                controls.act(rs.server)  # just before the cut: the frames they send are cut off
            case.fault(f"TCP cut {cut}", case.agents[0])
            proxy.sever()
            to_other.sever()
        case.finish()
        assert proxy.connections >= 3, f"the agent connected {proxy.connections} time(s) through the proxy"
    finally:
        proxy.close()
        to_other.close()


def test_a_device_hopping_between_replicas_and_back_is_never_declared_lost(cluster: Cluster) -> None:
    rs = cluster.rs
    a, b, _ = both_ways(rs)
    to_a, to_b = TcpProxy(a.port), TcpProxy(b.port)
    # The controls' agents hop with the hopper, through proxies of their own (the hopper's count its moves).
    also_a, also_b = TcpProxy(a.port), TcpProxy(b.port)
    try:
        controls = Controls(rs, "hop", "approved", dialing(rs, also_a.url, also_b.url))
        agents = spread(rs, "hop", [[to_a.url, to_b.url], [b.url, a.url], [a.url, b.url]])
        hopper = agents[0]
        # The hopper gets half the nodes, so it is busy through both moves.
        case = Case(rs, agents, spread_over=[hopper, agents[1], hopper, agents[2]], controls=controls)
        case.submit()
        controls.arm()
        share = case.work.placed_on(hopper.device_id)
        case.wait_executed(share * 15 // 100, hopper)
        watch = StateWatch(rs, hopper.device_id)
        controls.act(rs.server)  # just before the move: the devices hear them on the replica they move to
        case.fault("the move to replica B", hopper)
        to_a.pause()  # replica A is out of the hopper's reach: it moves to B
        also_a.pause()
        wait_until(lambda: to_b.connections >= 1, 30, "the hopper to connect to replica B")
        case.wait_executed(share * 55 // 100, hopper)
        to_a.resume()
        also_a.resume()
        case.fault("the move back to replica A", hopper)
        to_b.pause()  # and back to A
        also_b.pause()
        wait_until(lambda: to_a.connections >= 2, 30, "the hopper to connect to replica A again")
        moved_back = time.monotonic()
        to_b.resume()
        also_b.resume()
        case.finish()
        # Neither replica it left may declare it offline: watch for longer than their heartbeat timeout.
        watch.watch_until(moved_back + HEARTBEAT_TIMEOUT_S + 1.0)
        assert "offline" not in watch.states(), f"the hopper was declared offline: states seen {watch.states()}"
    finally:
        for proxy in (to_a, to_b, also_a, also_b):
            proxy.close()


def test_killed_redis_subscriptions_lose_no_relayed_input_or_frame(cluster: Cluster) -> None:
    rs = cluster.rs
    leader, other, urls = both_ways(rs)
    # On the non-leader, and asked through it: the requests and the frames both cross pub/sub.
    controls = Controls(rs, "pubsub", "approved", dialing(rs, other.url, leader.url))
    case = Case(rs, spread(rs, "pubsub", urls), controls=controls)
    case.submit()
    controls.arm()
    admin = redis.Redis.from_url(cluster.redis.url)
    try:
        for kill in (1, 2):  # twice, while the replicas relay inputs and frames for each other
            case.wait_executed(case.work.size * kill // 4)
            if kill == 1:
                controls.act(other)
            case.fault(f"pub/sub clients killed ({kill})")
            killed = admin.client_kill_filter(_type="pubsub")
            assert killed >= 2, f"CLIENT KILL TYPE pubsub killed {killed} client(s)"
    finally:
        admin.close()
    case.finish()
    assert_replicas_survived(rs)


def test_a_redis_restart_delays_work_but_loses_none_hangs_no_request_and_stops_no_replica(cluster: Cluster) -> None:
    rs = cluster.rs
    leader, other, urls = both_ways(rs)
    controls = Controls(rs, "redis", "approved", dialing(rs, other.url, leader.url))
    case = Case(rs, spread(rs, "redis", urls), controls=controls)
    case.submit()
    controls.arm()
    case.wait_executed(case.work.size // 3)
    probe = case.agents[1].device_id
    answer: list[int] = []
    case.fault("Redis stopped")
    cluster.redis.stop()
    try:
        # A request that needs the engine (the one writer of a device's controls), made to a
        # replica that does not lead it, while Redis is down: it may wait for Redis, but must
        # answer once Redis is back (SPEC 7: no hung request).
        wait_until(lambda: "error" in other.status().get("checks", {}).get("redis", ""), 30, "Redis to be gone")
        threading.Thread(target=_cordon, args=(other, probe, answer), daemon=True).start()
        tried = other.log().count("could not reach the engine leader through Redis")
        wait_until(
            lambda: other.log().count("could not reach the engine leader through Redis") > tried,
            30,
            "the cordon to be waiting for the engine leader",
        )
        # The leader answers these itself, but what it sends the controls' devices on the other
        # replica crosses Redis: lost, so sent again once Redis is back.
        controls.act(leader)
        wait_until(controls.answered, 30, "the leader to answer the stop, the cancel and the decision")
    finally:
        cluster.redis.start_again()
    rs.server = other
    wait_until(lambda: answer, 60, "POST /cordon to the non-leader to answer after Redis came back")
    if answer[0] != 200:  # 503 cluster_unavailable: the engine was out of reach for too long; ask again
        _cordon(other, probe, answer)
    assert answer[-1] == 200, answer
    assert _admin_state(other, probe) == "cordoned"
    with other.client() as c:
        assert c.post(f"/v1/devices/{probe}/uncordon").status_code == 200
    case.finish()
    assert_replicas_survived(rs)


def _cordon(replica: Replica, device_id: str, answer: list[int]) -> None:
    with replica.client() as c, contextlib.suppress(httpx.HTTPError):
        answer.append(c.post(f"/v1/devices/{device_id}/cordon", timeout=120).status_code)


def _admin_state(replica: Replica, device_id: str) -> str:
    with replica.client() as c, contextlib.suppress(httpx.HTTPError, ValueError):
        return str(c.get(f"/v1/devices/{device_id}").json().get("admin_state"))
    return ""


def test_a_postgres_restart_delays_work_but_loses_none_and_stops_no_replica(cluster: Cluster) -> None:
    rs = cluster.rs
    leader, other, urls = both_ways(rs)
    # While its database is away the API answers 503 `store_unavailable` (docs/replicas.md: a
    # Postgres restart fails requests with 503 meanwhile), never a 500: asked again like any 503.
    controls = Controls(rs, "postgres", "denied", dialing(rs, other.url, leader.url), OUTAGE)
    case = Case(rs, spread(rs, "postgres", urls), controls=controls)
    case.submit()
    controls.arm()
    case.wait_executed(case.work.size // 3)
    controls.act(other)  # just before the restart: asked again while the store is away
    case.fault("Postgres restarted")
    cluster.postgres.restart()
    case.finish()
    assert_replicas_survived(rs)


def test_a_killed_replica_hands_its_devices_and_the_engine_to_another_and_loses_nothing(
    cluster: Cluster,
) -> None:
    rs = cluster.rs
    leader, other, urls = both_ways(rs)
    # The controls' devices are on the leader too: they move to the other replica when it dies.
    controls = Controls(rs, "kill", "approved", dialing(rs, leader.url, other.url))
    case = Case(rs, spread(rs, "kill", urls), controls=controls)
    case.submit()
    controls.arm()
    case.wait_executed(case.work.size // 3)
    controls.act(other)  # just before the kill: relayed to the dying leader, answered by its successor
    case.fault("the leader killed")
    leader.kill(signal.SIGKILL)  # it leads the engine and holds two of the three devices (five, with the controls')
    rs.server = other
    case.finish()


# ================================================================ the referee itself


def _node(node_id: str, state: str, code: str | None = None, device: str = "d1") -> dict[str, Any]:
    error = {"code": code, "message": "..."} if code else None
    attempts = (
        [] if state in ("skipped", "pending") else [{"n": 1, "device_id": device, "status": state, "error": error}]
    )
    return {"id": node_id, "state": state, "error": error, "attempts": attempts}


def _clean() -> tuple[dict[str, Any], dict[str, int]]:
    """a -> b (success), bad -> undo (failure), bad -> never (success); bad fails on purpose."""
    task = {
        "state": "succeeded",
        "nodes": [
            _node("a", "succeeded"),
            _node("b", "succeeded"),
            _node("bad", "failed", "tool_error"),
            _node("undo", "succeeded"),
            _node("never", "skipped"),
        ],
        "edges": [
            {"from": "a", "to": "b", "on": "success"},
            {"from": "bad", "to": "undo", "on": "failure"},
            {"from": "bad", "to": "never", "on": "success"},
        ],
    }
    return task, {"a": 1, "b": 1, "bad": 1, "undo": 1}


def _set(task: dict[str, Any], node: dict[str, Any]) -> None:
    task["nodes"] = [node if n["id"] == node["id"] else n for n in task["nodes"]]


MUTATIONS: dict[str, tuple[Callable[[dict[str, Any], dict[str, int]], None], str, str]] = {
    "clean": (lambda t, r: None, "", ""),
    "ran twice": (lambda t, r: r.update(a=2), "ran twice", "a [succeeded"),
    "succeeded without running": (lambda t, r: r.pop("b"), "lost: succeeded without any execution", "b ["),
    "skipped although it must run": (
        lambda t, r: (_set(t, _node("b", "skipped")), r.pop("b")),
        "lost: the DAG rules say it must run",
        "b [skipped",
    ),
    "ran although it must be skipped": (
        lambda t, r: (_set(t, _node("never", "succeeded")), r.update(never=1)),
        "should be skipped",
        "never [succeeded",
    ),
    "not terminal": (lambda t, r: (_set(t, _node("b", "pending")), r.pop("b")), "not terminal", "b [pending"),
    "device_lost on a device never lost": (
        lambda t, r: (_set(t, _node("a", "failed", "device_lost")), t.update(state="failed")),
        "dishonest failure",
        "device_lost, but that device was never lost",
    ),
    "uncertain with no interrupted command": (
        lambda t, r: (_set(t, _node("a", "failed", "uncertain")), t.update(state="failed")),
        "dishonest failure",
        "no fault interrupted a command",
    ),
    "wrong task state": (lambda t, r: t.update(state="failed"), "task state 'failed'", "unhandled failures: []"),
}


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_referee_passes_a_clean_run_and_names_each_broken_invariant_and_node(tmp_path: Path, mutation: str) -> None:
    task, runs = _clean()
    change, invariant, offender = MUTATIONS[mutation]
    change(task, runs)
    for node, count in runs.items():
        for k in range(count):
            (tmp_path / "d1" / "runs").mkdir(parents=True, exist_ok=True)
            (tmp_path / "d1" / "runs" / f"{node}.{k}.1").touch()
    verdict = judge(task, executions_on_disk({"d1": tmp_path / "d1"}), expected_failures=harness.FAILS_ON_PURPOSE)
    if not invariant:
        assert verdict.ok, verdict.report()
        return
    assert not verdict.ok
    assert any(invariant in name and any(offender in o for o in nodes) for name, nodes in verdict.broken.items()), (
        verdict.report()
    )


def test_the_referee_accepts_one_uncertain_node_per_interrupted_command_and_no_more(tmp_path: Path) -> None:
    task, _ = _clean()
    _set(task, _node("a", "failed", "uncertain"))
    _set(task, _node("b", "skipped"))
    task["state"] = "failed"
    (tmp_path / "runs").mkdir()
    for node in ("a", "bad", "undo"):
        (tmp_path / "runs" / f"{node}.0.1").touch()
    runs = executions_on_disk({"d1": tmp_path})
    assert judge(task, runs, expected_failures=harness.FAILS_ON_PURPOSE, interrupted={"d1": 1}).ok
    assert not judge(task, runs, expected_failures=harness.FAILS_ON_PURPOSE, interrupted={"d2": 1}).ok


def test_a_case_whose_fault_lands_before_any_work_or_after_all_of_it_fails(tmp_path: Path) -> None:
    """`Case.fault` counts what is on disk; `finish` refuses a fault that landed outside the run
    (so a smaller DAG, or a faster machine, cannot quietly turn a case into a fault after the fact)."""
    agents = [Agent(f"m-{i}", f"dev-{i}", "t", tmp_path / f"m-{i}", "http://x", {}, {}) for i in range(3)]
    case = Case(Fleet(tmp_path / "unused"), agents)
    victim, runs = agents[0], agents[0].workspace / "runs"
    share = case.work.placed_on(victim.device_id)
    assert 30 < share < case.work.size

    def on_disk(count: int) -> None:
        runs.mkdir(parents=True, exist_ok=True)
        for k in range(len(list(runs.iterdir())), count):
            (runs / f"i{k:03d}.{k}.1").touch()

    case.fault("before any work", victim)
    on_disk(share // 2)
    case.fault("mid-run", victim)
    case.fault("mid-run, counted over all agents")
    on_disk(share)
    case.fault("after all of the victim's work", victim)
    assert [f[2:] for f in case.faults] == [
        (0, share),
        (share // 2, share),
        (share // 2, case.work.size),
        (share, share),
    ]
    with pytest.raises(AssertionError, match=r"\(before any work\) did not land mid-run: 0 of"):
        case.faults_landed_mid_run()
    case.faults.pop(0)
    with pytest.raises(
        AssertionError, match=rf"\(after all of the victim's work\) did not land mid-run: {share} of {share}"
    ):
        case.faults_landed_mid_run()
    case.faults.pop()
    case.faults_landed_mid_run()  # the two mid-run ones pass
    case.faults.clear()
    with pytest.raises(AssertionError, match="injected no fault"):
        case.faults_landed_mid_run()


STOP_AT, RESUME_AT, CANCEL_AT = 100.0, 110.0, 105.0  # seconds since the epoch, for the referee's tests


def _mark(root: Path, device: str, node: str, at: float, pid: int) -> Execution:
    path = root / device / "runs" / f"{node}.{int(at * 1e9)}.{pid}"
    return Execution(node, device, path)


def _clean_controls(tmp_path: Path, decision: str = "approved") -> ControlsSeen:
    """A stop, a cancel and an approval that went as they must."""

    def task(state: str, *nodes: dict[str, Any]) -> dict[str, Any]:
        return {"state": state, "nodes": list(nodes)}

    runs = {
        STOP_HELD: [_mark(tmp_path, "ds", STOP_HELD, 90.0, 11)],
        STOP_AFTER: [_mark(tmp_path, "ds", STOP_AFTER, 111.0, 12)],
        CANCEL_HELD: [_mark(tmp_path, "dc", CANCEL_HELD, 90.0, 13)],
    }
    if decision == "approved":
        runs[ASKED] = [_mark(tmp_path, "da", ASKED, 104.0, 14)]
    verb = VERBS[decision]
    return ControlsSeen(
        decision=decision,
        stop_task=task(
            "failed",
            _node(STOP_HELD, "failed", "device_stopped", "ds"),
            _node(STOP_AFTER, "succeeded", device="ds"),
        ),
        cancel_task=task(
            "cancelled", _node(CANCEL_HELD, "cancelled", device="dc"), _node(CANCEL_THEN, "cancelled", device="dc")
        ),
        ask_task=task(
            "succeeded" if decision == "approved" else "failed",
            _node(ASKED, "succeeded", device="da")
            if decision == "approved"
            else _node(ASKED, "failed", "approval_denied", "da"),
        ),
        approval={"state": decision},
        stopped_device={"admin_state": "active", "control_generation": 2, "control_applied": 2},
        stopped_device_id="ds",
        executions=runs,
        finished=[],
        still_running=[],
        sent={"stop": STOP_AT, "resume": RESUME_AT, "cancel": CANCEL_AT},
        answers={
            "stop": [Answer(503, {"code": "cluster_unavailable"}), Answer(200, {"control_generation": 1})],
            "resume": [Answer(0, error="no answer (ConnectError)"), Answer(200)],
            "cancel": [Answer(202, {"state": "cancelling"})],
            verb: [Answer(202, {"state": "pending", "requested_state": decision})],
        },
    )


def _node_in(seen: ControlsSeen, task: str, node: dict[str, Any]) -> None:
    tasks = {"stop": seen.stop_task, "cancel": seen.cancel_task, "ask": seen.ask_task}
    tasks[task]["nodes"] = [node if n["id"] == node["id"] else n for n in tasks[task]["nodes"]]


CONTROL_MUTATIONS: dict[str, tuple[Callable[[ControlsSeen, Path], None], str]] = {
    "clean": (lambda s, p: None, ""),
    "the stop left the command running": (
        lambda s, p: s.still_running.append(f"{STOP_HELD}.90000000000.11"),
        "lives on",
    ),
    "the stopped command ended as if nothing happened": (
        lambda s, p: _node_in(s, "stop", _node(STOP_HELD, "succeeded", device="ds")),
        "did not end device_stopped",
    ),
    "the stopped command finished": (lambda s, p: s.finished.append(f"ds:{STOP_HELD}.11"), "ran to its end"),
    "the device took work while stopped": (
        lambda s, p: s.executions.update({STOP_AFTER: [_mark(p, "ds", STOP_AFTER, 101.0, 15)]}),
        "started work while stopped",
    ),
    "the device never ran work again": (
        lambda s, p: (
            s.executions.pop(STOP_AFTER),
            _node_in(s, "stop", _node(STOP_AFTER, "pending")),
        ),
        "did not run work again",
    ),
    "the agent never applied the resume": (
        lambda s, p: s.stopped_device.update(control_applied=1),
        "did not end active",
    ),
    "the cancelled task succeeded": (lambda s, p: s.cancel_task.update(state="succeeded"), "did not end cancelled"),
    "the cancelled command was retried": (
        lambda s, p: s.executions[CANCEL_HELD].append(_mark(p, "dc", CANCEL_HELD, 106.0, 16)),
        "ran after the cancel",
    ),
    "what follows the cancelled command ran": (
        lambda s, p: s.executions.update({CANCEL_THEN: [_mark(p, "dc", CANCEL_THEN, 95.0, 17)]}),
        "what follows it ran",
    ),
    "the store records another decision": (
        lambda s, p: s.approval.update(state="denied"),
        "stored state is not the decision",
    ),
    "the approved command never ran": (lambda s, p: s.executions.pop(ASKED), "ran other than once"),
    "the approved command ran twice": (
        lambda s, p: s.executions[ASKED].append(_mark(p, "da", ASKED, 104.5, 18)),
        "ran other than once",
    ),
    "the approved node failed": (
        lambda s, p: _node_in(s, "ask", _node(ASKED, "failed", "approval_timeout", "da")),
        "did not end succeeded",
    ),
    "the stop answered 500": (lambda s, p: s.answers["stop"].append(Answer(500)), "did not answer the stop"),
    "a decision refused without an outage": (
        lambda s, p: s.answers.update(approve=[Answer(409, {"code": "conflict"})]),
        "did not answer the approve",
    ),
    "a decision answered with another": (
        lambda s, p: s.answers.update(approve=[Answer(200, {"state": "denied"})]),
        "did not answer the approve",
    ),
}


@pytest.mark.parametrize("mutation", CONTROL_MUTATIONS)
def test_the_referee_passes_controls_that_held_and_names_each_that_did_not(tmp_path: Path, mutation: str) -> None:
    seen = _clean_controls(tmp_path)
    change, invariant = CONTROL_MUTATIONS[mutation]
    change(seen, tmp_path)
    verdict = judge_controls(seen)
    if not invariant:
        assert verdict.ok, verdict.report()
        return
    assert any(invariant in name for name in verdict.broken), verdict.report()


def test_the_referee_takes_a_denial_that_ran_nothing_and_a_409_to_a_decision_asked_again(tmp_path: Path) -> None:
    seen = _clean_controls(tmp_path, "denied")
    seen.answers["deny"] = [Answer(0, error="no answer (ReadError)"), Answer(409, {"code": "conflict"})]
    assert judge_controls(seen).ok, judge_controls(seen).report()
    seen.executions[ASKED] = [_mark(tmp_path, "da", ASKED, 104.0, 14)]
    assert not judge_controls(seen).ok


def test_the_referee_lets_a_request_be_asked_again_only_after_the_answers_its_case_calls_an_outage(
    tmp_path: Path,
) -> None:
    seen = _clean_controls(tmp_path)
    seen.answers["stop"] = [Answer(500, {"code": "internal_error"}), Answer(200)]
    assert not judge_controls(seen).ok
    seen.outage = (*OUTAGE, 500)
    assert judge_controls(seen).ok, judge_controls(seen).report()
