"""DAG semantics and scheduling against a real server with simulated protocol devices (issue: full
DAG semantics). Each test uses its own labels, so tests sharing the server do not meet."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.simdevice import SimDevice, SimFleet
from tests.support import Fleet, wait_until


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, SimFleet]]:
    with Fleet(tmp_path_factory.mktemp("sched"), heartbeat_interval_s="1", queue_timeout_s="300") as fleet:
        sims = SimFleet()
        try:
            yield fleet, sims
        finally:
            sims.close()


class Lab:
    """A pool of simulated devices under one unique label, for one test."""

    def __init__(self, fleet: Fleet, sims: SimFleet) -> None:
        self.fleet, self.sims = fleet, sims
        self.pool = uuid.uuid4().hex[:8]
        self.devices: dict[str, SimDevice] = {}

    def device(self, name: str, **kw: Any) -> SimDevice:
        full = f"{self.pool}-{name}"
        enrolled = self.fleet.enroll(full, {"pool": self.pool})
        dev = self.sims.add(self.fleet.server.url, enrolled, **kw)
        self.devices[name] = dev
        self.fleet.wait_device(dev.device_id, "idle")
        return dev

    def node(self, node_id: str, tool: str = "sim.noop", device: str | None = None, **extra: Any) -> dict[str, Any]:
        args = extra.pop("args", {})
        placement: dict[str, Any] = {"labels": {"pool": self.pool}}
        if device:
            placement = {"device": f"{self.pool}-{device}"}
        return {"id": node_id, "placement": placement, "commands": [{"tool": tool, "arguments": args}], **extra}

    def run(self, nodes: list[dict[str, Any]], edges: list[tuple[str, str, str]] = (), **body: Any) -> dict[str, Any]:  # type: ignore[assignment]
        dag = {"nodes": nodes, "edges": [{"from": a, "to": b, "on": on} for a, b, on in edges]}
        task = self.fleet.submit(dag, **body)
        return self.fleet.wait_task(task["id"])

    def states(self, task: dict[str, Any]) -> dict[str, str]:
        return {n["id"]: n["state"] for n in task["nodes"]}

    def ran(self) -> list[str]:
        return [e.node_id for d in self.devices.values() for e in d.executions]


@pytest.fixture
def lab(env: tuple[Fleet, SimFleet]) -> Lab:
    return Lab(*env)


# ---------------------------------------------------------------- edges


def test_a_failure_edge_runs_compensation_and_the_task_succeeds(lab: Lab) -> None:
    lab.device("d")
    task = lab.run(
        [lab.node("a", args={"fail": True}), lab.node("undo"), lab.node("next")],
        [("a", "undo", "failure"), ("a", "next", "success")],
    )
    assert lab.states(task) == {"a": "failed", "undo": "succeeded", "next": "skipped"}
    assert task["state"] == "succeeded"
    assert "next" not in lab.ran()


def test_dependents_of_a_failed_node_never_run_and_the_skip_propagates(lab: Lab) -> None:
    lab.device("d")
    task = lab.run(
        [lab.node("a", args={"fail": True}), lab.node("b"), lab.node("c"), lab.node("d")],
        [("a", "b", "success"), ("b", "c", "success"), ("c", "d", "success")],
    )
    assert lab.states(task) == {"a": "failed", "b": "skipped", "c": "skipped", "d": "skipped"}
    assert task["state"] == "failed"
    assert lab.ran() == ["a"]


def test_an_always_edge_runs_after_a_failure_and_after_a_skip(lab: Lab) -> None:
    lab.device("d")
    task = lab.run(
        [lab.node("a", args={"fail": True}), lab.node("b"), lab.node("cleanup"), lab.node("fix")],
        [("a", "b", "success"), ("b", "cleanup", "always"), ("a", "fix", "failure")],
    )
    assert lab.states(task) == {"a": "failed", "b": "skipped", "cleanup": "succeeded", "fix": "succeeded"}
    assert task["state"] == "succeeded"


def test_a_node_waiting_on_two_parents_runs_once_both_succeed(lab: Lab) -> None:
    lab.device("d1")
    lab.device("d2")
    task = lab.run(
        [lab.node("a"), lab.node("b"), lab.node("join")], [("a", "join", "success"), ("b", "join", "success")]
    )
    assert task["state"] == "succeeded"
    join = lab.fleet.node(task, "join")
    ends = [lab.fleet.node(task, n)["attempts"][0]["ended_at"] for n in ("a", "b")]
    assert join["attempts"][0]["started_at"] >= max(ends)


# ---------------------------------------------------------------- retries


def test_a_read_only_failure_is_retried_with_backoff_and_succeeds(lab: Lab) -> None:
    lab.device("d")
    node = lab.node(
        "flaky", args={"fail_attempts": 2}, retry={"max_attempts": 3, "backoff_s": 0.2, "backoff_max_s": 0.3}
    )
    task = lab.run([node])
    flaky = lab.fleet.node(task, "flaky")
    assert task["state"] == "succeeded"
    assert [a["n"] for a in flaky["attempts"]] == [1, 2, 3]
    assert [a["error"]["code"] if a["error"] else None for a in flaky["attempts"]] == ["tool_error", "tool_error", None]


def test_a_retry_may_go_to_another_capable_device(lab: Lab) -> None:
    broken = lab.device("broken", handlers={"sim.noop": _always_fail})
    lab.device("good")
    nodes = [lab.node(f"n{i}", retry={"max_attempts": 4, "backoff_s": 0.05}) for i in range(4)]
    task = lab.run(nodes)
    assert task["state"] == "succeeded"
    devices = {a["device_id"] for n in task["nodes"] for a in n["attempts"]}
    assert broken.device_id in devices and len(devices) == 2


def test_a_side_effecting_failure_is_never_retried(lab: Lab) -> None:
    lab.device("d")
    task = lab.run([lab.node("act", tool="sim.act", args={"fail_attempts": 1}, retry={"max_attempts": 5})])
    act = lab.fleet.node(task, "act")
    assert act["state"] == "failed" and len(act["attempts"]) == 1


# ---------------------------------------------------------------- placement and queues


def test_queue_timeout_fails_a_node_no_device_takes(lab: Lab) -> None:
    dev = lab.device("d")
    _action(lab.fleet, dev.device_id, "cordon")
    task = lab.run([lab.node("stuck", queue_timeout_s=0.5)])
    stuck = lab.fleet.node(task, "stuck")
    assert stuck["state"] == "failed" and stuck["error"]["code"] == "queue_timeout"
    assert stuck["attempts"] == []


def test_the_queue_runs_higher_priority_first_then_oldest(lab: Lab) -> None:
    lab.device("d")
    blocker = lab.fleet.submit({"nodes": [lab.node("block", tool="sim.sleep", device="d", args={"seconds": 1.0})]})
    wait_until(lambda: lab.ran() == ["block"], 20, "the blocker to start")
    low = [lab.fleet.submit({"nodes": [lab.node(f"low{i}", device="d")]}, priority=0) for i in range(2)]
    high = lab.fleet.submit({"nodes": [lab.node("high", device="d")]}, priority=10)
    for t in [blocker, *low, high]:
        lab.fleet.wait_task(t["id"])
    assert lab.ran() == ["block", "high", "low0", "low1"]


def test_no_head_of_line_blocking_a_node_for_a_free_device_never_waits(lab: Lab) -> None:
    lab.device("a")
    lab.device("b")
    busy = lab.fleet.submit({"nodes": [lab.node("long", tool="sim.sleep", device="a", args={"seconds": 2.0})]})
    wait_until(lambda: "long" in lab.ran(), 20, "a to be busy")
    pinned = lab.fleet.submit({"nodes": [lab.node("for-a", device="a")]})
    wait_until(lambda: lab.fleet.task(pinned["id"])["nodes"][0]["state"] == "queued", 10, "queued on a")
    free = lab.fleet.wait_task(lab.fleet.submit({"nodes": [lab.node("for-b", device="b")]})["id"])
    assert free["state"] == "succeeded"
    assert lab.fleet.task(busy["id"])["state"] == "running"  # b did not wait for a's queue
    assert lab.fleet.wait_task(pinned["id"])["state"] == "succeeded"


def test_two_nodes_pinned_to_one_device_never_overlap(lab: Lab) -> None:
    lab.device("solo")
    nodes = [lab.node(f"n{i}", tool="sim.sleep", device="solo", args={"seconds": 0.2}) for i in range(4)]
    task = lab.run(nodes)
    spans = sorted((a["started_at"], a["ended_at"]) for n in task["nodes"] for a in n["attempts"])
    for (_s1, e1), (s2, _e2) in itertools.pairwise(spans):
        assert e1 <= s2, f"attempts overlap: {spans}"


def test_revoking_the_only_capable_device_fails_its_queued_node_with_no_capable_device(lab: Lab) -> None:
    dev = lab.device("only")
    _action(lab.fleet, dev.device_id, "cordon")
    task = lab.fleet.submit({"nodes": [lab.node("n", device="only")]})
    wait_until(lambda: lab.fleet.task(task["id"])["nodes"][0]["state"] == "ready", 10, "the node to wait")
    with lab.fleet.server.client() as c:
        assert c.delete(f"/v1/devices/{dev.device_id}").status_code == 200
    done = lab.fleet.wait_task(task["id"])
    assert done["nodes"][0]["error"]["code"] == "no_capable_device"


# ---------------------------------------------------------------- drain, cordon


def test_drain_finishes_current_work_takes_none_and_shows_draining(lab: Lab) -> None:
    a = lab.device("a")
    running = lab.fleet.submit({"nodes": [lab.node("long", tool="sim.sleep", device="a", args={"seconds": 1.0})]})
    wait_until(lambda: "long" in lab.ran(), 20, "a to start")
    assert _action(lab.fleet, a.device_id, "drain")["state"] == "draining"
    later = lab.fleet.submit({"nodes": [lab.node("later", device="a")]})
    assert lab.fleet.wait_task(running["id"])["state"] == "succeeded"
    assert lab.fleet.task(later["id"])["nodes"][0]["state"] == "ready"
    assert "later" not in lab.ran()
    assert lab.fleet.wait_device(a.device_id, "drained")["current_batch"] is None  # its last batch ended
    assert _action(lab.fleet, a.device_id, "uncordon")["state"] in ("idle", "busy")
    assert lab.fleet.wait_task(later["id"])["state"] == "succeeded"


def test_a_cordoned_device_takes_no_work_and_its_queue_moves_elsewhere(lab: Lab) -> None:
    a = lab.device("a")
    lab.device("b")
    _action(lab.fleet, a.device_id, "cordon")
    assert lab.fleet.device(a.device_id)["state"] == "cordoned"
    task = lab.run([lab.node(f"n{i}") for i in range(3)])
    assert task["state"] == "succeeded"
    assert {x["attempts"][0]["device_id"] for x in task["nodes"]} == {lab.devices["b"].device_id}


# ---------------------------------------------------------------- idempotency, validation


def test_idempotency_key_returns_the_same_task_or_409_for_another_body(lab: Lab) -> None:
    lab.device("d")
    body = {"dag": {"nodes": [lab.node("n")]}}
    key = uuid.uuid4().hex
    with lab.fleet.server.client() as c:
        first = c.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
        again = c.post("/v1/tasks", json=body, headers={"Idempotency-Key": key})
        other = c.post("/v1/tasks", json={**body, "priority": 5}, headers={"Idempotency-Key": key})
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
    assert first.json()["id"] == again.json()["id"]
    assert other.json()["code"] == "conflict"


def test_validation_names_a_non_ancestor_reference_and_limits(lab: Lab) -> None:
    lab.device("d")
    with lab.fleet.server.client() as c:
        ref = c.post(
            "/v1/tasks", json={"dag": {"nodes": [lab.node("a"), lab.node("b", args={"x": "${nodes.a.output}"})]}}
        )
        big = c.post("/v1/tasks", json={"dag": {"nodes": [lab.node("a", args={"blob": "x" * 70_000})]}})
        many = c.post("/v1/tasks", json={"dag": {"nodes": [lab.node(f"n{i}") for i in range(1001)]}})
    assert ref.json()["code"] == "invalid_reference" and ref.json()["problems"][0]["reference"] == "a"
    assert big.json()["problems"][0]["limit"] == "argument_bytes"
    assert many.json()["problems"][0]["limit"] == "nodes_per_task"


# ---------------------------------------------------------------- events and listing


def test_events_have_increasing_ids_and_resume_without_gaps_or_duplicates(lab: Lab) -> None:
    lab.device("d")
    task = lab.run([lab.node("a"), lab.node("b")], [("a", "b", "success")])
    everything = _events(lab.fleet, task["id"])
    ids = [e[0] for e in everything]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    types = {e[1] for e in everything}
    assert {"task.state", "node.state", "node.attempt"} <= types
    assert everything[-1][1] == "task.state" and everything[-1][2]["state"] == "succeeded"
    middle = ids[len(ids) // 2]
    assert _events(lab.fleet, task["id"], after=middle) == everything[len(ids) // 2 + 1 :]
    assert _events(lab.fleet, task["id"], last_event_id=middle) == everything[len(ids) // 2 + 1 :]
    node_event = next(e for e in everything if e[1] == "node.state")
    assert {"task_id", "node_id", "state", "at"} <= set(node_event[2])


def test_task_list_filters_by_state(lab: Lab) -> None:
    lab.device("d")
    ok = lab.run([lab.node("a")])
    bad = lab.run([lab.node("a", args={"fail": True})])
    with lab.fleet.server.client() as c:
        failed = c.get("/v1/tasks", params={"state": "failed", "limit": 500}).json()["items"]
        wrong = c.get("/v1/tasks", params={"state": "exploded"})
    ids = {t["id"] for t in failed}
    assert bad["id"] in ids and ok["id"] not in ids
    assert wrong.status_code == 422


def _always_fail(_args: dict[str, Any], _attempt: int) -> Any:
    from tests.simdevice import ToolFailure

    raise ToolFailure("tool_error", "this device is broken")


def _action(fleet: Fleet, device_id: str, action: str) -> dict[str, Any]:
    with fleet.server.client() as c:
        r = c.post(f"/v1/devices/{device_id}/{action}")
        assert r.status_code == 200, r.text
        result: dict[str, Any] = r.json()
        return result


def _events(
    fleet: Fleet, task_id: str, after: int | None = None, last_event_id: int | None = None
) -> list[tuple[int, str, dict[str, Any]]]:
    params = {"after": after} if after is not None else {}
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    out: list[tuple[int, str, dict[str, Any]]] = []
    with (
        fleet.server.client() as c,
        c.stream(
            "GET", f"/v1/tasks/{task_id}/events", params=params, headers=headers, timeout=httpx.Timeout(20)
        ) as resp,
    ):
        eid, etype = 0, ""
        for line in resp.iter_lines():
            if line.startswith("id:"):
                eid = int(line[3:])
            elif line.startswith("event:"):
                etype = line[6:].strip()
            elif line.startswith("data:"):
                out.append((eid, etype, json.loads(line[5:])))
    return out


__all__ = ["Path"]


def test_a_device_that_accepts_quick_batches_by_their_results_runs_a_chain_with_one_frame_each_way(lab: Lab) -> None:
    """The real agent sends no `batch_accepted` for a batch that starts at once and finishes within
    ACCEPT_AFTER_S: its `result_batch` accepts it. Each attempt is then accepted as it ends."""
    lab.device("quick", accept_by_results=True)
    nodes = [lab.node(f"n{i}", device="quick") for i in range(5)]
    task = lab.run(nodes, [(f"n{i}", f"n{i + 1}", "success") for i in range(4)])
    assert task["state"] == "succeeded", lab.states(task)
    attempts = [n["attempts"][0] for n in task["nodes"]]
    assert all(a["accepted_at"] == a["ended_at"] for a in attempts), attempts
