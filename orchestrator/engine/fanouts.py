"""Fan-out nodes in the engine: a fan-out node that becomes ready gets its children
from the fleet as it is then (`domain.fanout.targets`), each child a row of its own
(`node_children`) written in the same commit as the node's; and where each unit's row is, so a
child's transitions land on its row and go out as `node.child` events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.domain import fanout
from orchestrator.domain.run import TaskRun, Transition
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store.models import Base, Node, NodeChild

Apply = Callable[[TaskRun, list[Transition], float], None]


class FanOuts:
    def __init__(self, fleet: Fleet, writer: StepWriter) -> None:
        self.fleet = fleet
        self.writer = writer

    def expand(self, run: TaskRun, node_id: str, now: float) -> list[Transition]:
        """Node `node_id` of `run` just became READY and fans out: its children, stored now, and
        the transitions that start them (or fail it when no device matches)."""
        spec = run.nodes[node_id].spec
        found, left_out = fanout.targets(spec, (d.view() for d in self.fleet.devices.values()))
        transitions = run.fan_out(node_id, found, left_out, now)
        rollout = run.rollouts.get(node_id)
        self.writer.update(
            Node,
            (run.id, node_id),
            fan_out=rollout.fan_out_row() if rollout else {"devices": 0, "left_out": left_out[: fanout.LEFT_OUT_SHOWN]},
        )
        if rollout is not None:
            for position, target in enumerate(found):
                self.writer.insert(
                    NodeChild,
                    {
                        "task_id": run.id,
                        "node_id": node_id,
                        "device_id": target.device_id,
                        "device_name": target.name,
                        "position": position,
                        "state": "pending",
                        "attempts": 0,
                    },
                )
        return transitions

    @staticmethod
    def row(run: TaskRun, unit: str) -> tuple[type[Base], tuple[str, ...]]:
        """The table and key of a unit's row: its node's, or for a fan-out child its child row."""
        node_id, device_id = fanout.split_unit(unit)
        if device_id is None:
            return Node, (run.id, node_id)
        return NodeChild, (run.id, node_id, device_id)

    def record(self, run: TaskRun, unit: str, now: float, values: dict[str, Any], **extra: Any) -> None:
        """A unit's new state: `values` merged into its row, and its event (of `values["state"]`,
        with `extra`): `node.state` for a node, `node.child` for a fan-out child (with the node's
        id, and the child's device id and name)."""
        node_id, device_id = fanout.split_unit(unit)
        if device_id is None:
            self.writer.merge(Node, (run.id, node_id), values)
            self.writer.event(EventType.NODE_STATE, run.id, node_id, now, state=values["state"], **extra)
            return
        self.writer.merge(NodeChild, (run.id, node_id, device_id), values)
        name = run.rollouts[node_id].names.get(unit, device_id)
        self.writer.event(
            EventType.NODE_CHILD,
            run.id,
            node_id,
            now,
            state=values["state"],
            device_id=device_id,
            device=name,
            **extra,
        )
