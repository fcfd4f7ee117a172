"""Placement and an emergency stop: a stopped device takes no work, yet it still counts as able
to run the node once it is resumed (so a node that only it fits waits instead of failing)."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.domain import placement
from orchestrator.domain.model import AdminState, Liveness, NodeSpec
from orchestrator.domain.placement import DeviceView


def node() -> NodeSpec:
    return NodeSpec.model_validate({"id": "n", "commands": [{"tool": "shell.run", "arguments": {}}]})


def device(device_id: str, admin: AdminState = AdminState.ACTIVE) -> DeviceView:
    tools = frozenset({"shell.run"})
    return DeviceView(id=device_id, name=device_id, tools=tools, admin=admin, liveness=Liveness.ONLINE)


def test_a_stopped_device_takes_no_work_but_could_run_it_once_resumed() -> None:
    stopped = device("a", AdminState.STOPPED)
    assert not stopped.takes_work and not stopped.free
    assert placement.choose_queue(node(), [stopped]) is None
    assert placement.could_ever_run(node(), [stopped])


def test_a_node_goes_to_the_device_in_service_and_never_to_the_stopped_one() -> None:
    stopped = device("a", AdminState.STOPPED)  # first in id order, free, with an empty queue
    serving = replace(device("b"), busy=True, queue_length=3)
    assert placement.choose_queue(node(), [stopped, serving]) == serving
