"""Small real records for the collaborators' own tests (no store, no engine)."""

from __future__ import annotations

from typing import Any

from orchestrator.domain.model import AdminState, Liveness, NodeSpec
from orchestrator.domain.run import TaskRun
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceRun
from protocol.messages import Command


def device(device_id: str, tools: tuple[str, ...] = ("sim.act",), liveness: Liveness = Liveness.ONLINE) -> DeviceRun:
    return DeviceRun(
        id=device_id,
        name=device_id,
        labels={},
        reported_labels={},
        platform="linux",
        tools={t: {"name": t} for t in tools},
        admin=AdminState.ACTIVE,
        liveness=liveness,
        fence=1,
        current_batch=None,
    )


def task(task_id: str, *tools: str, now: float = 0.0, **node: Any) -> TaskRun:
    """A task of independent one-command nodes n1, n2, ..., started (its nodes READY)."""
    specs = [
        NodeSpec.model_validate({"id": f"n{i + 1}", "commands": [{"tool": t}], **node}) for i, t in enumerate(tools)
    ]
    run = TaskRun(task_id, specs, [])
    run.start(now)
    return run


def attempt(batch_id: str, device_id: str, fence: int, *tools: str) -> AttemptRun:
    commands = [Command(call_id=f"c{i + 1}", tool=t) for i, t in enumerate(tools or ("sim.act",))]
    return AttemptRun(batch_id, "t", "n1", 1, device_id, fence, commands, None, started=0.0, kind=AttemptKind.TOOL)
