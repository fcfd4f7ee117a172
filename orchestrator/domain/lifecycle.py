"""Node, task and device state rules (SPEC section 2)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.domain.dag import Graph, failure_handled
from orchestrator.domain.model import AdminState, DeviceState, Liveness, NodeState, TaskState

_ALLOWED: dict[NodeState, frozenset[NodeState]] = {
    NodeState.PENDING: frozenset({NodeState.READY, NodeState.SKIPPED, NodeState.CANCELLED}),
    NodeState.READY: frozenset(
        {NodeState.QUEUED, NodeState.RUNNING, NodeState.FAILED, NodeState.CANCELLED, NodeState.SKIPPED}
    ),
    # A fan-out child still waiting in a queue is skipped when its rollout halts.
    NodeState.QUEUED: frozenset(
        {NodeState.READY, NodeState.RUNNING, NodeState.FAILED, NodeState.CANCELLED, NodeState.SKIPPED}
    ),
    NodeState.RUNNING: frozenset(
        {
            NodeState.SUCCEEDED,
            NodeState.FAILED,
            NodeState.READY,
            NodeState.CANCELLED,
            NodeState.WAITING_APPROVAL,
            NodeState.TAKEN_OVER,
            NodeState.VERIFYING,
        }
    ),
    # Still running (its attempt is open); only a person's decision or the attempt's end moves it.
    NodeState.WAITING_APPROVAL: frozenset(
        {NodeState.RUNNING, NodeState.SUCCEEDED, NodeState.FAILED, NodeState.READY, NodeState.CANCELLED}
        | {NodeState.VERIFYING, NodeState.TAKEN_OVER}
    ),
    # Still running (its agent attempt is open, its clock stopped); a handback or its end moves it.
    NodeState.TAKEN_OVER: frozenset(
        {NodeState.RUNNING, NodeState.WAITING_APPROVAL, NodeState.SUCCEEDED, NodeState.FAILED}
        | {NodeState.READY, NodeState.CANCELLED, NodeState.VERIFYING}
    ),
    # Its verify commands decide; a failed probe of an uncertain attempt may retry it.
    NodeState.VERIFYING: frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.READY, NodeState.CANCELLED}),
}


class IllegalTransition(ValueError):
    pass


_FINAL: frozenset[NodeState] = frozenset()  # what a terminal state may become


def check_transition(current: NodeState, new: NodeState) -> None:
    """Refuse a node transition the lifecycle does not allow (terminal states are final)."""
    if new not in _ALLOWED.get(current, _FINAL):
        raise IllegalTransition(f"node cannot go from {current} to {new}")


def task_outcome(graph: Graph, states: Mapping[str, NodeState], cancel_requested: bool) -> TaskState | None:
    """The task's final state once every node is terminal, else None.

    Succeeded when every failed node's failure was handled by an outgoing `failure` edge.
    """
    if not all(s.terminal for s in states.values()):
        return None
    if cancel_requested:
        return TaskState.CANCELLED
    for node, state in states.items():
        if state is NodeState.FAILED and not failure_handled(graph, node):
            return TaskState.FAILED
    return TaskState.SUCCEEDED


def device_state(admin: AdminState, liveness: Liveness, busy: bool, queued: int = 0) -> DeviceState:
    """The single state shown for a device, from what operators asked and what liveness says.
    A draining device with nothing running or queued is `drained`: safe to take down. A stopped
    device shows `stopped` whatever its liveness: the stop outlasts its connections."""
    if admin is AdminState.REVOKED:
        return DeviceState.REVOKED
    if admin is AdminState.STOPPED:
        return DeviceState.STOPPED
    if liveness is Liveness.ENROLLED:
        return DeviceState.ENROLLED
    if liveness is Liveness.OFFLINE:
        return DeviceState.OFFLINE
    if liveness is Liveness.SUSPECT:
        return DeviceState.SUSPECT
    if admin is AdminState.DRAINING:
        return DeviceState.DRAINING if busy or queued else DeviceState.DRAINED
    if admin is AdminState.CORDONED:
        return DeviceState.CORDONED
    return DeviceState.BUSY if busy else DeviceState.IDLE


def history_state(admin: AdminState, liveness: Liveness, busy: bool, queued: int = 0) -> DeviceState:
    """The state a device's history records: its shown state, except that running a batch or not
    (busy, idle) is not a change of state there (the device's attempts tell that)."""
    state = device_state(admin, liveness, busy, queued)
    return DeviceState.IDLE if state is DeviceState.BUSY else state
