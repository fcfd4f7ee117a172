"""The device-level emergency stop latch.

An operator's `POST /v1/devices/{id}/stop` reaches the agent as a `device_stop` frame (or, for an
agent that was away, as `welcome.stopped`). The agent then keeps the stop in its ledger, kills
what runs, and engages this latch: the router refuses every tool that is not read-only with
`device_stopped`, and the toolsets that registered here (the `gui` controller) stop their input
and release held buttons and modifiers. Only `device_resume` (or a welcome that says the device
is not stopped) lifts it; no tool can, so a model cannot undo its own stop.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("orrery.agent.stop")

StopHook = Callable[[], Awaitable[Any]]
ResumeHook = Callable[[], Any]
OPERATOR_STOP = "stopped by an operator"


def stopped_words(reason: str) -> str:
    """`stopped by an operator`, with the stop's reason once: the orchestrator's reason most often
    starts with those words already ("stopped by an operator (key k_1): maintenance")."""
    if not reason:
        return OPERATOR_STOP
    said = reason.startswith("stopped") and "by an operator" in reason  # "stopped and resumed by an operator"
    return reason if said else f"{OPERATOR_STOP} ({reason})"


class StopLatch:
    def __init__(self) -> None:
        self.stopped = False
        self.reason = ""
        self._hooks: list[tuple[StopHook, ResumeHook]] = []

    def on(self, stop: StopHook, resume: ResumeHook) -> None:
        """Call `stop` when the device is stopped (awaited, errors logged) and `resume` when resumed."""
        self._hooks.append((stop, resume))

    async def engage(self, reason: str) -> None:
        """Latch the stop and run every stop hook (a hook that fails is logged, the others run)."""
        self.stopped = True
        self.reason = reason
        for stop, _ in self._hooks:
            try:
                await stop()
            except Exception as exc:
                log.warning("a toolset failed to stop (%s: %s)", type(exc).__name__, exc)

    def lift(self) -> None:
        self.stopped = False
        self.reason = ""
        for _, resume in self._hooks:
            try:
                resume()
            except Exception as exc:
                log.warning("a toolset failed to resume (%s: %s)", type(exc).__name__, exc)

    def refusal(self, tool: str) -> str:
        """What a refused action tool answers while the device is stopped."""
        return (
            f"this device was {stopped_words(self.reason)}, so '{tool}' is refused: every action tool "
            "stays refused until an operator resumes the device (orrery devices resume, or POST "
            "/v1/devices/{id}/resume); read-only tools still run. Do not retry the action on this device."
        )
