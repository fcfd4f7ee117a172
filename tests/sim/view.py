"""The simulator's one window into the engine's memory (the lead repoints this file when the
engine's internals move). Everything the invariant checks read of a live engine goes through
these functions, as plain values."""

from __future__ import annotations

from typing import Any

from orchestrator.engine.core import Engine


def task_ids(engine: Engine) -> list[str]:
    return sorted(engine.tasks)


def node_states(engine: Engine, task_id: str) -> dict[str, str]:
    """Every node's state, and every fan-out child's (by its unit, `node@device`)."""
    run = engine.tasks.get(task_id)
    return {} if run is None else {n: rec.state.value for n, rec in run.units()}


def open_attempts(engine: Engine) -> dict[str, tuple[str, str, str, int]]:
    """batch id -> (task id, node id, device id, fence) of every open attempt."""
    return {b: (a.task_id, a.node_id, a.device_id, a.fence) for b, a in sorted(engine.attempts.open.items())}


def device_fences(engine: Engine) -> dict[str, int]:
    return {d: dev.fence for d, dev in engine.devices.items()}


def admin_state(engine: Engine, device_id: str) -> str:
    return engine.devices[device_id].admin.value


def current_batches(engine: Engine) -> dict[str, str | None]:
    return {d: dev.current_batch for d, dev in engine.devices.items()}


def summary(engine: Engine) -> dict[str, Any]:
    """What a restart must rebuild exactly: unfinished tasks and their node states, open
    attempts, device fences."""
    return {
        "tasks": {t: node_states(engine, t) for t in task_ids(engine) if not engine.tasks[t].terminal},
        "attempts": open_attempts(engine),
        "fences": device_fences(engine),
    }
