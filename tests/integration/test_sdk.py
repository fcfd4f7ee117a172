"""The Python SDK against a real orchestrator and simulated devices (tests/simdevice.py): tasks
built with `Dag`, submitted, followed and waited for; the event stream resumed across a dropped
connection; listings walked page by page; every kind of problem raised as its typed error."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orrery import (
    Client,
    Conflict,
    Dag,
    Forbidden,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    WaitTimeout,
    call,
)
from orrery.sdk import Event, Task
from tests.simdevice import DEFAULT_TOOLS, SimFleet, tool
from tests.support import Fleet, TcpProxy, wait_until

GATE = "sim.gate"  # a read-only tool that returns once the test opens its gate (arguments: {"gate": name})


@dataclass
class Gates:
    """Gates the simulated device's `sim.gate` waits on, opened from the test's thread."""

    sims: SimFleet
    events: dict[str, asyncio.Event] = field(default_factory=dict)
    names: Iterator[int] = field(default_factory=itertools.count)

    def new(self) -> str:
        return f"gate-{next(self.names)}"

    async def handler(self, arguments: dict[str, Any], attempt: int) -> Any:
        await self.events.setdefault(arguments["gate"], asyncio.Event()).wait()
        return {"gate": arguments["gate"], "opened": True}

    def open(self, name: str) -> None:
        self.sims.loop.call_soon_threadsafe(lambda: self.events.setdefault(name, asyncio.Event()).set())


@dataclass
class SdkFleet:
    fleet: Fleet
    gates: Gates

    @property
    def url(self) -> str:
        return self.fleet.server.url

    @property
    def key(self) -> str:
        return self.fleet.server.api_key

    def client(self, server: str | None = None, key: str | None = None) -> Client:
        return Client(server or self.url, key or self.key, timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SdkFleet]:
    with Fleet(tmp_path_factory.mktemp("sdk"), heartbeat_interval_s="1", max_request_bytes="65536") as f:
        sims = SimFleet()
        gates = Gates(sims)
        try:
            enrolled = f.enroll("sim-1", {"role": "web"})
            tools = [*DEFAULT_TOOLS, tool(GATE, read_only=True)]
            sims.add(f.server.url, enrolled, labels={"role": "web"}, tools=tools, handlers={GATE: gates.handler})
            f.wait_device(enrolled["id"], "idle", timeout=30)
            yield SdkFleet(f, gates)
        finally:
            for name in list(gates.events):
                gates.open(name)
            sims.close()


@pytest.fixture
def client(fleet: SdkFleet) -> Iterator[Client]:
    with fleet.client() as c:
        yield c


def echo_chain(name: str = "echo-chain") -> Dag:
    """first -> second, second echoing what first returned."""
    dag = Dag(name)
    first = dag.node("first", call("sim.noop", {"echo": "from-first"}), labels={"role": "web"})
    dag.node("second", call("sim.noop", {"echo": first.output.echo}), after=first)
    return dag


def gated(gate: str, name: str = "gated") -> Dag:
    """first -> held (until the gate opens) -> last."""
    dag = Dag(name)
    first = dag.node("first", call("sim.noop"))
    held = dag.node("held", call(GATE, {"gate": gate}), after=first)
    dag.node("last", call("sim.noop", {"echo": held.output.gate}), after=held)
    return dag


# ---------------------------------------------------------------- tasks


def test_a_task_built_with_the_builder_runs_and_wait_returns_it_ended(client: Client) -> None:
    submitted = client.submit(echo_chain())
    assert submitted.state in ("running", "succeeded") and submitted.name == "echo-chain"
    task = client.wait(submitted.id, timeout=30)
    assert task.state == "succeeded" and task.ended
    assert task.node("second").output == {"tool": "sim.noop", "echo": "from-first"}
    assert [(e.source, e.target, e.on) for e in task.edges or []] == [("first", "second", "success")]
    assert task.node("first").attempts[0].device_id


def test_the_builders_output_is_accepted_by_validate_and_nothing_is_created(client: Client) -> None:
    before = client.tasks_page(limit=1).items
    checked = client.validate(echo_chain("checked-only"))
    assert checked.valid and checked.problems == []
    assert {n.id: n.devices for n in checked.nodes} == {"first": ["sim-1"], "second": ["sim-1"]}
    assert client.tasks_page(limit=1).items == before


def test_a_dag_given_as_a_dict_with_its_name_is_submitted_as_a_dag_file_would_be(client: Client) -> None:
    spec = {"name": "from-a-dict", "nodes": [{"id": "only", "commands": [{"tool": "sim.noop"}]}]}
    task = client.wait(client.submit(spec).id, timeout=30)
    assert (task.name, task.state) == ("from-a-dict", "succeeded")


def test_the_same_idempotency_key_and_body_return_the_same_task_and_another_body_conflicts(client: Client) -> None:
    first = client.submit(echo_chain("idem"), idempotency_key="sdk-idem-1")
    again = client.submit(echo_chain("idem"), idempotency_key="sdk-idem-1")
    assert again.id == first.id
    with pytest.raises(Conflict) as refused:
        client.submit(echo_chain("idem-other"), idempotency_key="sdk-idem-1")
    assert refused.value.code == "conflict"


def test_a_rerun_from_a_node_is_a_new_task_that_keeps_the_nodes_before_it(client: Client) -> None:
    old = client.wait(client.submit(echo_chain("to-rerun")).id, timeout=30)
    new = client.rerun(old.id, from_node="second")
    assert new.id != old.id and new.rerun_of == old.id
    done = client.wait(new.id, timeout=30)
    assert done.state == "succeeded"
    assert done.node("first").attempts == []  # kept, not run again
    assert done.node("second").attempts


def test_a_cancelled_task_ends_cancelled_and_cancelling_it_again_conflicts(fleet: SdkFleet, client: Client) -> None:
    gate = fleet.gates.new()
    try:
        task = client.submit(gated(gate, "to-cancel"))
        for event in client.events(task.id):  # until `held` runs: a running batch must be stopped
            if (event.node_id, event.state) == ("held", "running"):
                break
        assert client.cancel(task.id).state == "cancelling"
        fleet.gates.open(gate)  # the device ends the command it was running when the cancel came
        done = client.wait(task.id, timeout=30)
        assert done.state == "cancelled" and done.node("last").state == "cancelled"
        with pytest.raises(Conflict) as refused:
            client.cancel(task.id)
        assert refused.value.code == "conflict"
    finally:
        fleet.gates.open(gate)


def test_wait_gives_up_with_wait_timeout_while_the_task_goes_on(fleet: SdkFleet, client: Client) -> None:
    gate = fleet.gates.new()
    try:
        task = client.submit(gated(gate, "slow"))
        with pytest.raises(WaitTimeout) as gave_up:
            client.wait(task.id, timeout=0.5)
        assert gave_up.value.code == "wait_timeout"
        assert not client.task(task.id).ended
    finally:
        fleet.gates.open(gate)
    assert client.wait(task.id, timeout=30).state == "succeeded"


# ---------------------------------------------------------------- the event stream


def test_the_event_stream_resumes_after_a_dropped_connection_without_loss_or_duplication(
    fleet: SdkFleet, client: Client
) -> None:
    gate = fleet.gates.new()
    proxy = TcpProxy(fleet.fleet.server.port)
    try:
        task = client.submit(gated(gate, "dropped-stream"))
        seen: list[Event] = []
        with fleet.client(proxy.url) as through_proxy:
            for event in through_proxy.events(task.id):
                seen.append(event)
                if event.type == "node.state" and event.node_id == "held" and event.state == "running":
                    proxy.sever()  # the connection dies with the task half done...
                    fleet.gates.open(gate)  # ...and the rest of its events come after
        assert proxy.connections >= 2, "the stream was not cut and reopened"
        everything = list(client.events(task.id))
        assert [e.id for e in seen] == [e.id for e in everything]
        assert len({e.id for e in seen}) == len(seen)
        assert seen[-1].ends_task and seen[-1].state == "succeeded"
        assert [(e.type, e.node_id, e.state) for e in seen] == [(e.type, e.node_id, e.state) for e in everything]
    finally:
        fleet.gates.open(gate)
        proxy.close()


def test_the_event_stream_waits_out_an_outage_that_refuses_its_reconnections(fleet: SdkFleet, client: Client) -> None:
    gate = fleet.gates.new()
    proxy = TcpProxy(fleet.fleet.server.port)
    healer: threading.Thread | None = None

    def heal(refused_from: int) -> None:
        """Once two reconnections were refused, the way is open again and the task goes on."""
        wait_until(lambda: proxy.attempts >= refused_from + 2, 10, "two refused reconnections")
        proxy.resume()
        fleet.gates.open(gate)

    try:
        task = client.submit(gated(gate, "outage"))
        seen: list[Event] = []
        with fleet.client(proxy.url) as through_proxy:
            for event in through_proxy.events(task.id):
                seen.append(event)
                if healer is None and (event.node_id, event.state) == ("held", "running"):
                    healer = threading.Thread(target=heal, args=(proxy.attempts,))
                    proxy.pause()
                    healer.start()
        assert healer is not None
        healer.join(10)
        assert proxy.attempts >= 3 and proxy.connections >= 2
        assert [e.id for e in seen] == [e.id for e in client.events(task.id)]
        assert seen[-1].ends_task
    finally:
        fleet.gates.open(gate)
        proxy.close()


def test_events_after_an_id_are_those_that_follow_it(client: Client) -> None:
    task = client.wait(client.submit(echo_chain("after")).id, timeout=30)
    everything = list(client.events(task.id))
    middle = everything[len(everything) // 2]
    assert [e.id for e in client.events(task.id, after=middle.id)] == [e.id for e in everything if e.id > middle.id]
    assert list(client.events(task.id, after=everything[-1].id)) == []  # the server says 204: nothing more
    assert {e.type for e in everything} >= {"task.state", "node.state"}


# ---------------------------------------------------------------- listings


def test_listing_tasks_walks_every_page(client: Client) -> None:
    made = [client.submit(echo_chain(f"paged-{i}")).id for i in range(5)]
    for task_id in made:
        client.wait(task_id, timeout=30)
    first = client.tasks_page(limit=2)
    assert len(first.items) == 2 and first.next_cursor is not None
    walked = [t.id for t in client.tasks(page_size=2)]
    assert len(walked) == len(set(walked))
    assert set(made) <= set(walked)
    assert walked == [t.id for t in client.tasks(page_size=500)]
    assert all(isinstance(t, Task) and t.nodes is None for t in client.tasks(page_size=3))
    assert set(made) <= {t.id for t in client.tasks("succeeded", page_size=2)}


def test_devices_and_their_tools_are_typed(client: Client) -> None:
    (device,) = client.devices()
    assert (device.name, device.labels, device.state) == ("sim-1", {"role": "web"}, "idle")
    assert client.device("sim-1").id == device.id
    tools = {t.name: t for t in client.device_tools(device.id)}
    assert tools[GATE].annotations.read_only and tools["sim.act"].tool_type == "action"


def test_approvals_and_artifacts_are_listed_and_an_unknown_one_is_not_found(client: Client) -> None:
    task = client.wait(client.submit(echo_chain("no-artifacts")).id, timeout=30)
    assert list(client.approvals()) == []
    assert list(client.approvals(None, task_id=task.id, order="newest")) == []
    assert list(client.artifacts(task.id, history=True)) == []
    with pytest.raises(NotFound) as missing:
        client.artifact(task.id, "report.txt")
    assert missing.value.code == "not_found"
    with pytest.raises(NotFound):
        client.decide("apr_nobody", "approve", "looks fine")


# ---------------------------------------------------------------- errors


def test_a_bad_key_is_unauthorized(fleet: SdkFleet) -> None:
    with fleet.client(key="not-a-key") as stranger, pytest.raises(Unauthorized) as refused:
        stranger.devices()
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")


def test_no_key_at_all_is_unauthorized_and_says_where_a_key_is_found(
    fleet: SdkFleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ORRERY_API_KEY", raising=False)
    monkeypatch.setenv("ORRERY_DATA_DIR", str(tmp_path))  # no admin.key there
    with Client(fleet.url) as keyless, pytest.raises(Unauthorized) as refused:
        keyless.tasks_page()
    assert refused.value.code == "unauthorized"
    assert "ORRERY_API_KEY" in refused.value.detail and "admin.key" in refused.value.detail


def test_the_key_of_a_local_server_is_found_in_its_data_directory(
    fleet: SdkFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ORRERY_API_KEY", raising=False)
    monkeypatch.setenv("ORRERY_DATA_DIR", str(fleet.fleet.server.data_dir))
    monkeypatch.setenv("ORRERY_URL", f"{fleet.url.replace('http://', 'ws://')}/v1/agent")  # as an agent is given it
    with Client() as local:
        assert local.server == fleet.url
        assert [d.name for d in local.devices()] == ["sim-1"]


def test_a_viewer_may_read_but_submitting_is_forbidden(fleet: SdkFleet, client: Client) -> None:
    """(A route with no method of its own, such as the API keys', goes through `request`.)"""
    viewer = client.request("POST", "/v1/api-keys", json={"role": "viewer", "name": "sdk-viewer"})["key"]
    with fleet.client(key=viewer) as reader:
        assert reader.request("GET", "/v1/api-keys/me")["role"] == "viewer"
        assert reader.devices()
        with pytest.raises(Forbidden) as refused:
            reader.submit(echo_chain())
    assert refused.value.code == "forbidden"


def test_an_unknown_task_is_not_found(client: Client) -> None:
    with pytest.raises(NotFound) as missing:
        client.task("task_that_never_was")
    assert (missing.value.status, missing.value.code) == (404, "not_found")
    with pytest.raises(NotFound):
        list(client.events("task_that_never_was"))


def test_an_invalid_dag_is_an_invalid_request_listing_every_problem(client: Client) -> None:
    spec = {
        "nodes": [
            {"id": "a", "commands": [{"tool": "sim.nop"}]},
            {"id": "b", "placement": {"labels": {"role": "gpu"}}, "commands": [{"tool": "sim.noop"}]},
        ]
    }
    with pytest.raises(InvalidRequest) as refused:
        client.submit(spec)
    error = refused.value
    assert (error.status, error.code) == (422, "unknown_tool")
    assert {p["code"] for p in error.problems} == {"unknown_tool", "no_capable_device"}
    assert "sim.noop" in error.problems[0]["nearest"]
    checked = client.validate(spec)
    assert not checked.valid and {p.code for p in checked.problems} == {"unknown_tool", "no_capable_device"}


def test_a_request_without_an_llm_is_an_invalid_request_planner_unavailable(client: Client) -> None:
    with pytest.raises(InvalidRequest) as refused:
        client.submit(request="count the files on every web server")
    assert refused.value.code == "planner_unavailable"


def test_a_body_over_the_servers_limit_is_payload_too_large(client: Client) -> None:
    big = Dag("big")
    big.node("a", call("sim.noop", {"echo": "x" * 70_000}))
    with pytest.raises(PayloadTooLarge) as refused:
        client.submit(big)
    assert (refused.value.status, refused.value.code) == (413, "payload_too_large")
