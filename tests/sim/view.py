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


def controls(engine: Engine) -> dict[str, tuple[str, int, str, int, int, str | None]]:
    """Each device's controls: admin state, generation, stop reason, last resume, last budget
    reset, breach."""
    return {
        d: (dev.admin.value, dev.control_gen, dev.stop_reason, dev.resumed_gen, dev.budgets_reset_gen, dev.breach)
        for d, dev in sorted(engine.devices.items())
    }


def approvals(engine: Engine) -> dict[str, tuple[str, str | None]]:
    """Approvals the engine waits on: their batch and the decision asked of the device, if any;
    and open attempts a refusal ended (`refused:`)."""
    out: dict[str, tuple[str, str | None]] = {
        a: (e.batch_id, e.requested) for a, e in sorted(engine.approvals.waiting.items())
    }
    out.update({f"refused:{b}": (b, a.refused) for b, a in sorted(engine.attempts.open.items()) if a.refused})
    return out


def summary(engine: Engine) -> dict[str, Any]:
    """What a restart must rebuild exactly: unfinished tasks and their node states, open
    attempts, device fences, device controls and approvals."""
    return {
        "tasks": {t: node_states(engine, t) for t in task_ids(engine) if not engine.tasks[t].terminal},
        "attempts": open_attempts(engine),
        "fences": device_fences(engine),
        "controls": controls(engine),
        "approvals": approvals(engine),
    }
