"""What an operator's control of a device, or a safety breach its agent reports, does to the
device's admin state and to the control state its agent must apply (pure rules).

A device's controls are desired state with one writer (the engine): `admin` (what placement
reads) and the agent's part, a `ControlState` with a generation that grows with every change
the agent must act on (a stop, a resume, a budget reset). The engine sends that state until the
agent reports the generation applied. The rules here decide each change from the state the
engine holds, so there is never a read-check-write between two writers:

- only a resume lowers a stop; a drain, cordon or uncordon of a stopped device is refused, and a
  safety breach on a stopped device is recorded but leaves it stopped;
- a device cordoned by a breach (or that breached while stopped) comes back from a resume
  cordoned, and only an uncordon (which resets its agent's budgets) returns it to service;
- a revoked device takes no control at all;
- a takeover hands the device's screen to a person until a handback: it is refused on a stopped
  device, and a stop ends it (a stop still ends everything).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from orchestrator.domain.model import AdminState

OPERATOR_CORDON = "cordoned by an operator"


class ControlAction(StrEnum):
    DRAIN = "drain"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    STOP = "stop"
    RESUME = "resume"
    REVOKE = "revoke"
    TAKEOVER = "takeover"
    HANDBACK = "handback"


@dataclass(frozen=True, slots=True)
class Controls:
    """A device's controls as the engine holds them (and stores with the device)."""

    admin: AdminState
    gen: int = 0  # the generation of the agent's part; grows with every change it must apply
    stop_reason: str = ""
    resumed: int = 0  # generation of the last resume
    budgets_reset: int = 0  # generation of the last budget reset
    stopped_at: int = 0  # generation of the last stop
    cordon_reason: str | None = None
    breach: str | None = None  # a safety breach not yet cleared by an uncordon
    # An operator's takeover: who has the device (None: nobody), since when (wall clock, epoch
    # seconds: it survives restarts), why, and the generation of the last takeover.
    taken_over_by: str | None = None
    takeover_since: float = 0.0
    takeover_reason: str = ""
    takeover_gen: int = 0

    @property
    def stopped(self) -> bool:
        return self.admin is AdminState.STOPPED

    @property
    def taken_over(self) -> bool:
        return self.taken_over_by is not None


@dataclass(frozen=True, slots=True)
class Refusal:
    code: str  # a stable API code: `conflict`
    detail: str


@dataclass(frozen=True, slots=True)
class Change:
    """The controls after the action, and the reason its history entry gives."""

    after: Controls
    why: str
    before_gen: int
    note: str = ""  # a handback's note (what the model reads)

    @property
    def agent_must_apply(self) -> bool:
        """The agent's part changed: a new generation to send it."""
        return self.after.gen != self.before_gen


def apply(
    current: Controls,
    action: ControlAction,
    reason: str = "",
    expect_gen: int | None = None,
    device: str = "",
    device_id: str = "{id}",
    by: str = "",
    now: float = 0.0,
) -> Change | Refusal | None:
    """The controls after an operator's `action` (None: it changes nothing). `reason` is the
    operator's words for the history (and, for a stop, for the agent; for a handback, the note
    the model reads). `expect_gen`: the generation the operator saw; a resume or uncordon asked
    on an older one is refused, so a stale or repeated request can never lift a stop given
    since. `by` and `now` (epoch seconds): who takes the device over, and when."""
    name = current.admin.value
    if current.admin is AdminState.REVOKED:
        return Refusal("conflict", "the device is revoked; enroll it again to use it")
    if action in (ControlAction.TAKEOVER, ControlAction.HANDBACK):
        return _takeover(current, action, reason, by, now, device or "DEVICE")
    if (
        expect_gen is not None
        and expect_gen != current.gen
        and action in (ControlAction.RESUME, ControlAction.UNCORDON)
    ):
        return Refusal(
            "conflict",
            f"the device's controls changed since you looked (generation {expect_gen}, now {current.gen}, "
            f"{name}); look again and decide again",
        )
    gen = current.gen
    if action is ControlAction.STOP:
        if current.stopped:
            return None
        after = _with(current, admin=AdminState.STOPPED, gen=gen + 1, stop_reason=reason, stopped_at=gen + 1)
        after = _with(after, taken_over_by=None, takeover_since=0.0, takeover_reason="")  # a stop ends it
        return Change(after, reason or "stopped by an operator", gen)
    if action is ControlAction.RESUME:
        if current.stopped:
            admin = AdminState.CORDONED if current.breach else AdminState.ACTIVE
            cordon = current.breach if current.breach else None
            after = _with(current, admin=admin, gen=gen + 1, stop_reason="", resumed=gen + 1, cordon_reason=cordon)
            why = reason or "resumed by an operator"
            if current.breach:
                why += f"; still cordoned: {current.breach}"
            return Change(after, why, gen)
        # Not stopped: its agent is told to resume all the same, which lifts a `gui.stop` a
        # model set (no tool can lift it).
        return Change(_with(current, gen=gen + 1, resumed=gen + 1), reason or "resumed by an operator", gen)
    if current.stopped and action is not ControlAction.REVOKE:
        return Refusal(
            "conflict",
            f"the device is stopped (emergency stop); only resume lifts it: orrery devices resume {device or 'DEVICE'} "
            f"(POST /v1/devices/{device_id}/resume), then {action.value} it",
        )
    if action is ControlAction.REVOKE:
        return Change(
            _with(current, admin=AdminState.REVOKED, cordon_reason=None), reason or "revoked by an admin", gen
        )
    if action is ControlAction.DRAIN:
        if current.admin is AdminState.DRAINING:
            return None
        return Change(
            _with(current, admin=AdminState.DRAINING, cordon_reason=None), reason or "drained by an operator", gen
        )
    if action is ControlAction.CORDON:
        if current.admin is AdminState.CORDONED:
            return None  # cordoned already: keep why it was (a safety breach says more)
        after = _with(current, admin=AdminState.CORDONED, cordon_reason=OPERATOR_CORDON)
        return Change(after, reason or OPERATOR_CORDON, gen)
    # UNCORDON: back to service; a device cordoned (by a breach or an operator) has its agent's
    # safety budgets reset, so a breach does not cordon it again at once.
    resets = current.admin is AdminState.CORDONED or current.breach is not None
    if current.admin is AdminState.ACTIVE and not resets:
        return None
    after = _with(current, admin=AdminState.ACTIVE, cordon_reason=None, breach=None)
    if resets:
        after = _with(after, gen=gen + 1, budgets_reset=gen + 1)
    return Change(after, reason or "uncordoned by an operator", gen)


def _takeover(
    current: Controls, action: ControlAction, reason: str, by: str, now: float, device: str
) -> Change | Refusal | None:
    gen = current.gen
    if action is ControlAction.HANDBACK:
        if not current.taken_over:
            return None
        after = _with(current, gen=gen + 1, taken_over_by=None, takeover_since=0.0, takeover_reason="")
        return Change(after, f"handed back by {by or 'an operator'}" + (f": {reason}" if reason else ""), gen, reason)
    if current.stopped:
        return Refusal(
            "conflict",
            f"the device is stopped (emergency stop): nothing runs on it to take over from; "
            f"resume it first (orrery devices resume {device})",
        )
    if current.taken_over:
        if current.taken_over_by == by:
            return None  # asked again by whoever has it
        return Refusal(
            "conflict",
            f"the device is taken over already (by {current.taken_over_by}); they hand it back first "
            f"(orrery devices handback {device})",
        )
    after = _with(
        current,
        gen=gen + 1,
        taken_over_by=by or "an operator",
        takeover_since=now,
        takeover_reason=reason,
        takeover_gen=gen + 1,
    )
    return Change(after, f"taken over by {by or 'an operator'}" + (f": {reason}" if reason else ""), gen)


def breached(current: Controls, reason: str) -> Change | None:
    """A safety breach the device's agent reported (None: nothing new). It cordons the device,
    but never lowers a stop: a stopped device stays stopped and keeps the breach for its resume."""
    if current.admin is AdminState.REVOKED or current.breach == reason:
        return None
    if current.stopped:
        return Change(_with(current, breach=reason), f"{reason} (while stopped: it stays stopped)", current.gen)
    after = _with(current, admin=AdminState.CORDONED, cordon_reason=reason, breach=reason)
    return Change(after, reason, current.gen)


def _with(c: Controls, **changes: Any) -> Controls:
    return replace(c, **changes)
