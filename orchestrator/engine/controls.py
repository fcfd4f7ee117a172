"""A device's controls in the engine: the one writer of its admin state (drain, cordon, uncordon,
stop, resume, revoke, and the cordon a safety breach brings) and of the control state its agent
applies (emergency stop, resume, budget reset).

Level-triggered, as in Kubernetes: the store holds what should be true, with a generation
(`orchestrator.domain.controls`); the agent reports the generation it has applied in its hello
and heartbeats (carried by the link reports of whichever replica holds it); until the report
catches up the engine sends the state again, at most every `RESEND_AFTER_S`, whoever leads and
whatever became of earlier frames (a Redis restart, a failover, a lost relay). Operators' changes
arrive as `ControlDevice` inputs and breaches as frames, so both go through this one writer in
engine steps: no read-check-write, and a breach can never lower a stop.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Protocol

from orchestrator.domain import controls as rules
from orchestrator.domain.controls import Change, Controls, Refusal
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.engine.actions import Action, Requeue, Revoked, Stopped, Takeover
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.queues import Queues
from orchestrator.engine.records import ControlDevice, DeviceRun
from orchestrator.engine.times import utc
from orchestrator.engine.writer import StepWriter
from orchestrator.store.models import Device, DeviceHistory
from protocol.errors import CloseCode
from protocol.messages import ControlState, DeviceControl, OwnerTakeoverState, SafetyBreach

log = logging.getLogger("orrery.engine")

RESEND_AFTER_S = 3.0  # a control state the device has not reported applied goes again after this
ANSWERS_KEPT = 1000  # replies to recent requests, for a request asked again (its answer lost)

Reply = dict[str, Any]


def control_row(c: Controls, applied: int, owner: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The device row's `control` column (null for a device no control ever touched), with the
    generation its agent last reported applied (shown to operators) and the owner's takeover at
    the device as its agent reported it (`owner`)."""
    if c.gen == 0 and c.breach is None and applied == 0 and owner is None:
        return None
    return {
        "gen": c.gen,
        "stop_reason": c.stop_reason,
        "resumed": c.resumed,
        "budgets_reset": c.budgets_reset,
        "stopped_at": c.stopped_at,
        "breach": c.breach,
        "applied": applied,
        "taken_over_by": c.taken_over_by,
        "takeover_since": c.takeover_since,
        "takeover_reason": c.takeover_reason,
        "takeover_gen": c.takeover_gen,
        "owner_takeover": owner,
    }


def controls_of(row: Device) -> Controls:
    """A device row's controls (its admin state and its `control` column)."""
    data = row.control or {}
    return Controls(
        admin=AdminState(row.admin_state),
        gen=int(data.get("gen") or 0),
        stop_reason=str(data.get("stop_reason") or ""),
        resumed=int(data.get("resumed") or 0),
        budgets_reset=int(data.get("budgets_reset") or 0),
        stopped_at=int(data.get("stopped_at") or 0),
        cordon_reason=row.cordon_reason,
        breach=data.get("breach"),
        taken_over_by=data.get("taken_over_by"),
        takeover_since=float(data.get("takeover_since") or 0.0),
        takeover_reason=str(data.get("takeover_reason") or ""),
        takeover_gen=int(data.get("takeover_gen") or 0),
    )


def wire_state(c: Controls) -> ControlState:
    """The agent's part of the controls, as the protocol carries it."""
    return ControlState(
        gen=c.gen,
        stopped=c.stopped,
        reason=c.stop_reason[:400],
        resumed=c.resumed,
        budgets_reset=c.budgets_reset,
        stopped_at=c.stopped_at,
        taken_over=c.taken_over,
        takeover_by=(c.taken_over_by or "")[:200],
        takeover_gen=c.takeover_gen,
    )


class Devices(Protocol):
    """What the controls need of the fleet they are a part of."""

    devices: dict[str, DeviceRun]
    writer: StepWriter
    queues: Queues
    outbox: Outbox

    def record_state(self, dev: DeviceRun, reason: str, now: float) -> None: ...

    def set_liveness(self, dev: DeviceRun, liveness: Liveness, now: float, reason: str = "") -> list[Action]: ...


class DeviceControls:
    def __init__(self, fleet: Devices) -> None:
        self.fleet = fleet
        self._answers: OrderedDict[str, Reply] = OrderedDict()

    # ---------------------------------------------------------------- what operators ask

    def control(self, item: ControlDevice, now: float) -> tuple[Reply, list[Action]]:
        dev = self.fleet.devices.get(item.device_id)
        if dev is None:
            return {"ok": False, "code": "not_found", "detail": f"no device '{item.device_id}'"}, []
        if item.request_id and item.request_id in self._answers:
            return self._answers[item.request_id], []  # asked again: answered as the first time
        decided = rules.apply(dev.controls(), item.action, item.reason, item.expect_gen, dev.name, dev.id, item.by, now)
        actions: list[Action] = []
        if isinstance(decided, Refusal):
            reply: Reply = {"ok": False, "code": decided.code, "detail": f"device '{dev.name}': {decided.detail}"}
        elif decided is None:
            reply = {"ok": True, "changed": False, "gen": dev.control_gen}
        else:
            actions = self._take(dev, decided, now)
            reply = {"ok": True, "changed": True, "gen": dev.control_gen}
            log.info("device %s: %s (%s)", dev.id, item.action.value, decided.why)
        if item.request_id:
            self._answers[item.request_id] = reply
            if len(self._answers) > ANSWERS_KEPT:
                self._answers.popitem(last=False)
        return reply, actions

    def breach(self, dev: DeviceRun, msg: SafetyBreach, now: float) -> tuple[bool, list[Action]]:
        """The device's agent breached one of its owner's safety budgets: cordon it, durably, the
        breach its reason; a stopped device stays stopped. True if this is news (the agent
        repeats a breach on every new session until its budgets are reset)."""
        reason = f"safety budget {msg.budget} (limit {msg.limit}) exceeded: {msg.detail}"[:300]
        change = rules.breached(dev.controls(), reason)
        if change is None:
            return False, []
        log.warning("device %s breached its safety budget %s (%s)", dev.id, msg.budget, dev.admin.value)
        return True, self._take(dev, change, now, always_recorded=True)

    def owner_takeover(self, dev: DeviceRun, state: OwnerTakeoverState | None, now: float) -> list[Action]:
        """The device's owner took it over at the device, or handed it back, as its agent says (in a
        hello, or an `owner_takeover` frame): the agent is the one writer of this part, so the engine
        records the newest it reports and pauses or resumes the device's work as for an operator."""
        held = dev.owner_takeover
        before = dev.taken_over
        if state is not None and held is not None and state.gen < int(held.get("gen") or 0):
            return []  # an older report, overtaken
        if state is None or not state.taken_over:
            if held is None:
                return []
            dev.owner_takeover = None
            by, note = str(held.get("by") or "the owner"), state.note if state is not None else ""
        else:
            since = state.since.timestamp() if state.since is not None else now
            new: dict[str, Any] = {"by": state.by or "the device's owner", "since": since, "gen": state.gen}
            if held is not None and held.get("gen") == state.gen:
                return []
            dev.owner_takeover = new
            if held is not None:
                self._write(dev)
                return []  # taken over already: the newest report is kept, nothing else changes
            by, note = new["by"], ""
        self._write(dev)
        if dev.taken_over == before:
            return []  # an operator has it too: their handback decides
        return self._takeover_changed(dev, dev.taken_over, by, note, now, "owner")

    def _takeover_changed(
        self, dev: DeviceRun, taken: bool, by: str, note: str, now: float, source: str
    ) -> list[Action]:
        """History and the takeover's effect on tasks, when whether a person has the device changed."""
        words = f"taken over by {by}" if taken else f"handed back by {by}" + (f": {note}" if note else "")
        self.fleet.writer.insert(
            DeviceHistory,
            {
                "device_id": dev.id,
                "state": dev.recorded or "idle",
                "reason": f"{words} ({source})"[:300],
                "at": utc(now),
            },
        )
        self.fleet.queues.devices_changed()
        return [Takeover(dev, taken, by, note)]

    def _write(self, dev: DeviceRun) -> None:
        self.fleet.writer.update(
            Device, (dev.id,), control=control_row(dev.controls(), dev.applied_gen, dev.owner_takeover)
        )

    def _take(self, dev: DeviceRun, change: Change, now: float, always_recorded: bool = False) -> list[Action]:
        fleet = self.fleet
        before, after = dev.controls(), change.after
        taken_before = dev.taken_over
        dev.take_controls(after)
        fleet.queues.devices_changed()
        fleet.writer.update(
            Device,
            (dev.id,),
            admin_state=after.admin.value,
            cordon_reason=after.cordon_reason,
            control=control_row(after, dev.applied_gen, dev.owner_takeover),
        )
        actions: list[Action] = []
        if after.admin is not AdminState.ACTIVE and (before.admin is AdminState.ACTIVE or after.stopped):
            actions.append(Requeue(fleet.queues.unqueue_all(dev)))
        if after.stopped and not before.stopped:
            why = after.stop_reason  # most often "stopped by an operator (key ...): ..." already
            said = (
                why
                if why.startswith("stopped by an operator")
                else "stopped by an operator" + (f" ({why})" if why else "")
            )
            actions.append(Stopped(dev, f"device '{dev.name}' was {said}"))
        if dev.taken_over != taken_before:
            by = (after.taken_over_by if dev.taken_over else before.taken_over_by) or "an operator"
            note = "ended by an emergency stop" if after.stopped else change.note
            actions += self._takeover_changed(dev, dev.taken_over, by, "" if dev.taken_over else note, now, "operator")
        if change.agent_must_apply:
            self.send(dev, now)
        if always_recorded:
            dev.recorded = None  # a breach is an entry of its own, even on a device cordoned already
        fleet.record_state(dev, change.why, now)
        if after.admin is AdminState.REVOKED:
            fleet.outbox.close_after_commit(dev, CloseCode.UNAUTHORIZED, "device token revoked")
            actions += fleet.set_liveness(dev, Liveness.OFFLINE, now)
            actions.append(Revoked())
        return actions

    # ---------------------------------------------------------------- converging the agent

    def send(self, dev: DeviceRun, now: float) -> None:
        dev.control_sent_at = now
        self.fleet.outbox.frame_after_commit(dev, DeviceControl(control=wire_state(dev.controls())))

    def heard(self, dev: DeviceRun, applied: int, now: float, connected: bool = False) -> None:
        """The device reports (in a hello, `connected`, or a heartbeat) generation `applied` of
        its controls: send them again if it is behind. A device ahead of us has seen a store
        this one was restored from: the same controls go out as a generation above its own."""
        if applied != dev.applied_gen:  # shown to operators (rare: the device applied a change)
            dev.applied_gen = applied
            self._write(dev)
        if applied > dev.control_gen:
            log.warning(
                "device %s applied control generation %d, above ours (%d): sending ours above it",
                dev.id,
                applied,
                dev.control_gen,
            )
            dev.control_gen = applied + 1
            self._write(dev)
            self.send(dev, now)
        elif applied < dev.control_gen and (connected or now - dev.control_sent_at >= RESEND_AFTER_S):
            if not connected:
                log.info("device %s has control generation %d of %d: sending again", dev.id, applied, dev.control_gen)
            self.send(dev, now)
