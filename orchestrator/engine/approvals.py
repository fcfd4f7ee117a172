"""Approvals in the engine: a running node whose device waits for a person.

The device's ledger is the one arbiter of every approval: a decision given at the device lands
there first, and only the device knows whether the command ran. So:

- A device asks (`approval_request`, before anything of the command has run): the approval row
  is inserted and the node goes `waiting_approval` in the same commit, its attempt's deadline
  stops counting, and an expiry timer is set at `approval_timeout_s`.
- Every other decider makes a request of the device: an operator (`DecideApproval`, from the
  API), the expiry, and the end of the attempt (`cancelled`: nothing of an ended attempt may
  run). A request is stored with the step (`requested_*`), sent after its commit, and sent
  again until the device reports the approval decided: when the device asks again (it does on
  every new session), and while its replica reports it connected (every few seconds).
- The device reports the decision that holds (`approval_decision`), whoever made it, until the
  server acknowledges it. Only then is it the approval's `state`, written in a step commit under
  the lease together with what it does: the node running again and the attempt's deadline moved
  on by the time waited (the later of our measure and the device's). A decision for an attempt
  that is no longer current is recorded and wakes nothing.

So the store never holds a decision the device did not take, and an operator learns the outcome
that actually holds (the API waits for it: `orchestrator.api.approvals`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.config import Settings
from orchestrator.domain.model import Liveness
from orchestrator.domain.run import TaskRun, Transition
from orchestrator.engine.attempts import Attempts
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.records import AttemptRun, DecideApproval, DeviceRun
from orchestrator.engine.timers import ApprovalExpiry, AttemptDeadline, Timers
from orchestrator.engine.times import utc
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store.models import Approval, Attempt
from protocol.messages import ApprovalDecision, ApprovalRequest

log = logging.getLogger("orrery.engine")

MAX_SCREENSHOT_B64 = 3_000_000
RESEND_AFTER_S = 3.0  # a request the device has not confirmed goes again after this, while it waits
DECISIONS = ("approved", "denied", "expired", "cancelled")
# A decision that refuses the command: its attempt ends with this code (never retried).
REFUSALS = {"denied": "approval_denied", "expired": "approval_timeout"}
ASK_PERSON = "approval.ask_person"  # a model asks a person; approved with their answer as the reason

Reply = dict[str, Any]


class ApprovalRows(Protocol):
    async def find_approval(self, approval_id: str) -> Approval | None: ...


@dataclass(slots=True)
class Entry:
    """An approval nobody's decision has reached the store for yet (its device has not reported)."""

    approval_id: str
    batch_id: str
    task_id: str
    node_id: str
    device_id: str
    since: float  # engine clock: when the device asked
    local_only: bool
    requested: str | None = None  # the decision asked of the device, not confirmed yet
    requested_by: str = ""
    requested_reason: str = ""
    sent_at: float = -math.inf  # engine clock: when the request last went to the device
    tool: str = ""  # `ASK_PERSON`: a model's question, answered by a person's words


class ApprovalBook:
    def __init__(
        self,
        settings: Settings,
        store: ApprovalRows,
        tasks: dict[str, TaskRun],
        writer: StepWriter,
        timers: Timers,
        attempts: Attempts,
        outbox: Outbox,
        apply: Callable[[TaskRun, list[Transition], float], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.tasks = tasks
        self.writer = writer
        self.timers = timers
        self.attempts = attempts
        self.outbox = outbox
        self.apply = apply
        self.waiting: dict[str, Entry] = {}
        self._by_batch: dict[str, set[str]] = {}
        self._by_device: dict[str, set[str]] = {}

    # ---------------------------------------------------------------- a device asks

    async def requested(self, dev: DeviceRun, msg: ApprovalRequest, now: float) -> None:
        e = self.waiting.get(msg.approval_id)
        if e is not None:
            if e.device_id == dev.id and e.requested is not None:
                self._send(e, now)  # asked again (a new session): our request again
            return
        row = await self.store.find_approval(msg.approval_id)
        if row is not None:
            if row.device_id == dev.id and row.state in DECISIONS:
                # Its device confirmed a decision already but asks again (its ledger was reset):
                # the decision that held is the only one it may take.
                self._tell(dev.id, row.id, row.state, row.decided_by or "", row.decision_reason or "")
            return
        att = self.attempts.get(msg.batch_id)
        if att is None or att.device_id != dev.id:
            # Its attempt ended (timed out, cancelled, given up on): nothing may run for it. No
            # node waits, so nothing is stored; the device is asked to cancel its wait.
            why = f"batch {msg.batch_id} is no longer current on this device"
            self._tell(dev.id, msg.approval_id, "cancelled", "orchestrator", why)
            return
        expires = now + self.settings.approval_timeout_s
        screenshot = msg.screenshot_png_b64
        if screenshot is not None and len(screenshot) > MAX_SCREENSHOT_B64:
            screenshot = None
        self.writer.insert(
            Approval,
            {
                "id": msg.approval_id,
                "task_id": att.task_id,
                "node_id": att.node_id,
                "batch_id": att.batch_id,
                "call_id": msg.call_id,
                "device_id": dev.id,
                "tool": msg.tool,
                "arguments": msg.arguments,
                "reason": msg.reason,
                "local_only": msg.local_only,
                "screenshot": screenshot,
                "state": "pending",
                "created_at": utc(now),
                "expires_at": utc(expires),
            },
        )
        e = Entry(msg.approval_id, att.batch_id, att.task_id, att.node_id, dev.id, now, msg.local_only)
        e.tool = msg.tool
        self._wait(e, expires, now)
        self.writer.event(
            EventType.APPROVAL_REQUESTED,
            att.task_id,
            att.node_id,
            now,
            approval_id=msg.approval_id,
            device_id=dev.id,
            tool=msg.tool,
            local_only=msg.local_only,
            expires_at=utc(expires).isoformat(),
        )
        log.info("approval %s asked for %s on %s", msg.approval_id, msg.tool, dev.id)
        if att.cancel_reason is not None:  # asked while its attempt is being cancelled
            self._request(e, "cancelled", "orchestrator", "the attempt was cancelled before anyone decided", now)

    def _wait(self, e: Entry, expires: float, now: float) -> None:
        self.waiting[e.approval_id] = e
        self._by_batch.setdefault(e.batch_id, set()).add(e.approval_id)
        self._by_device.setdefault(e.device_id, set()).add(e.approval_id)
        self.timers.add(expires, ApprovalExpiry(e.approval_id))
        for paused in self._paused(e.batch_id):
            if paused.waiting_since is None:
                paused.waiting_since = e.since
        att = self.attempts.get(e.batch_id)
        run = self.tasks.get(e.task_id)
        if att is not None and run is not None and run.has(att.key[1]):
            self.apply(run, run.waiting_approval(att.key[1], True), now)

    def _paused(self, batch_id: str) -> list[AttemptRun]:
        """The attempt waiting, and an agent node's attempt above its step: their deadlines wait."""
        att = self.attempts.get(batch_id)
        if att is None:
            return []
        parent = self.attempts.get(att.parent) if att.parent else None
        return [att] if parent is None else [att, parent]

    # ---------------------------------------------------------------- requests of the device

    def decide(self, item: DecideApproval, now: float) -> Reply:
        """An operator's decision: asked of the device, which confirms it or reports the one that
        held (`reported`). Refused if it cannot hold: decided already, local only, its attempt
        over or cancelled, or another decision already on its way."""
        e = self.waiting.get(item.approval_id)
        if e is None:
            return {"ok": False, "code": "conflict", "detail": f"approval '{item.approval_id}' is decided already"}
        if e.local_only:
            detail = (
                f"device {e.device_id}'s owner decides its approvals on the device itself: there, run "
                f"'orrery agent approve {e.approval_id}' or 'orrery agent deny {e.approval_id}'"
            )
            return {"ok": False, "code": "approval_local_only", "detail": detail}
        att = self.attempts.get(e.batch_id)
        if att is None or att.cancel_reason is not None or e.requested == "cancelled":
            why = att.cancel_reason if att is not None and att.cancel_reason else "ended"
            detail = (
                f"approval '{e.approval_id}' can no longer be {item.decision}: its attempt was {why}, so its "
                "command will not run; the device is told to cancel the wait"
            )
            return {"ok": False, "code": "conflict", "detail": detail}
        if e.requested is not None:
            if (e.requested, e.requested_by) == (item.decision, item.by):
                return {"ok": True}  # asked again (an answer lost between replicas)
            detail = (
                f"approval '{e.approval_id}': '{e.requested}' (by {e.requested_by}) was asked of its device first "
                "and waits for the device to confirm it"
            )
            return {"ok": False, "code": "conflict", "detail": detail}
        self._request(e, item.decision, item.by, item.reason, now)
        dev = self.outbox.devices.get(e.device_id)
        # Only a device known to be gone cannot confirm soon (a suspect one, or one an engine
        # that just started has not heard from yet, usually still can).
        away = dev is None or dev.liveness in (Liveness.OFFLINE, Liveness.ENROLLED)
        return {"ok": True, "online": not away}

    def expire(self, timer: ApprovalExpiry, now: float) -> None:
        e = self.waiting.get(timer.approval_id)
        if e is not None and e.requested is None:
            why = f"nobody decided within approval_timeout_s ({self.settings.approval_timeout_s:g}s)"
            self._request(e, "expired", "orchestrator", why, now)

    def attempt_ended(self, att: AttemptRun, now: float) -> None:
        """An attempt ended while its device waited (device lost, cancelled, timed out): nothing of
        it may run, so every undecided approval of it is asked to be `cancelled`, whatever was
        asked before (an approval on its way would run a command nobody waits for)."""
        for approval_id in sorted(self._by_batch.get(att.batch_id, ())):
            e = self.waiting[approval_id]
            if e.requested != "cancelled":
                self._request(e, "cancelled", "orchestrator", "the attempt ended before the decision reached it", now)

    def answer_questions(self, device_id: str, by: str, note: str, now: float) -> None:
        """A person handed the device back with `note`: a model's question to a person on it that
        nobody answered yet is answered with the note (asked of the device, like any decision)."""
        for approval_id in sorted(self._by_device.get(device_id, ())):
            e = self.waiting[approval_id]
            if e.tool == ASK_PERSON and e.requested is None and not e.local_only:
                self._request(e, "approved", by or "a person", note, now)

    def questions_on(self, device_id: str) -> set[str]:
        """The batches on the device whose model asked a person a question nobody answered yet."""
        return {
            e.batch_id
            for approval_id in self._by_device.get(device_id, ())
            if (e := self.waiting[approval_id]).tool == ASK_PERSON and e.requested is None and not e.local_only
        }

    def waiting_for(self, batch_ids: set[str]) -> bool:
        """Whether an approval of one of these batches still waits for its device's word."""
        return any(self._by_batch.get(b) for b in batch_ids)

    def heard(self, dev: DeviceRun, now: float) -> None:
        """The device's replica reports it connected: a request for one of its approvals that it
        has not confirmed goes again (a frame lost on its way, or its report lost on the way
        back: asked again, it reports what holds), at most every `RESEND_AFTER_S`."""
        for approval_id in sorted(self._by_device.get(dev.id, ())):
            e = self.waiting[approval_id]
            if e.requested is not None and now - e.sent_at >= RESEND_AFTER_S:
                log.info("approval %s: asking device %s again for '%s'", approval_id, dev.id, e.requested)
                self._send(e, now)

    def _request(self, e: Entry, state: str, by: str, reason: str, now: float) -> None:
        e.requested, e.requested_by, e.requested_reason = state, by[:200], reason[:2000]
        self.writer.update(
            Approval,
            (e.approval_id,),
            requested_state=state,
            requested_by=e.requested_by,
            requested_reason=e.requested_reason,
            requested_at=utc(now),
        )
        self._send(e, now)

    def _send(self, e: Entry, now: float) -> None:
        assert e.requested is not None
        e.sent_at = now
        self._tell(e.device_id, e.approval_id, e.requested, e.requested_by, e.requested_reason)

    def _tell(self, device_id: str, approval_id: str, state: str, by: str, reason: str) -> None:
        frame = ApprovalDecision.model_validate(
            {"approval_id": approval_id, "decision": state, "reason": reason[:2000], "by": by[:200]}
        )
        outbox = self.outbox

        def send() -> None:
            outbox.send(device_id, frame)

        self.writer.effect(send)

    # ---------------------------------------------------------------- the device's word

    def reported(self, dev: DeviceRun, msg: ApprovalDecision, now: float) -> None:
        """The device reports the decision that holds in its ledger: it is now the approval's."""
        e = self.waiting.get(msg.approval_id)
        if e is None or e.device_id != dev.id:
            return  # recorded already (a report sent again), or not this device's to report
        del self.waiting[e.approval_id]
        for index, key in ((self._by_batch, e.batch_id), (self._by_device, e.device_id)):
            ids = index.get(key)
            if ids is not None:
                ids.discard(e.approval_id)
                if not ids:
                    del index[key]
        by = msg.by or "the device"
        self.writer.update(
            Approval,
            (e.approval_id,),
            state=msg.decision,
            decided_by=by[:200],
            decision_reason=msg.reason,
            decided_at=utc(now),
        )
        self.writer.event(
            EventType.APPROVAL_DECIDED,
            e.task_id,
            e.node_id,
            now,
            approval_id=e.approval_id,
            decision=msg.decision,
            by=by,
            reason=msg.reason,
        )
        log.info("approval %s %s by %s (confirmed by device %s)", e.approval_id, msg.decision, by, dev.id)
        att = self.attempts.get(e.batch_id)
        if att is None or att.device_id != dev.id:
            return  # its attempt is over: the decision wakes nothing
        if msg.decision in REFUSALS:
            att.refused = REFUSALS[msg.decision]  # a denial is final, however the attempt ends
        reported = msg.deadline.timestamp() if msg.deadline is not None else None
        for paused in self._paused(e.batch_id):
            since, paused.waiting_since = paused.waiting_since, None
            if paused.deadline is None or since is None:
                continue
            moved = paused.deadline + max(0.0, now - since)
            if reported is not None and paused is att:
                moved = max(moved, reported)  # the device's own measure of the wait, if longer
            paused.deadline = moved
            self.timers.add(moved, AttemptDeadline(paused.batch_id))
            self.writer.update(Attempt, (paused.batch_id,), deadline=utc(moved))
        run = self.tasks.get(e.task_id)
        if run is not None and run.has(unit := att.key[1]):
            self.apply(run, run.waiting_approval(unit, False), now)

    # ---------------------------------------------------------------- recovery

    def forget_task(self, task_id: str) -> None:
        """Drop every entry of `task_id` (its task is about to be reloaded from the store)."""
        for approval_id in [a for a, e in self.waiting.items() if e.task_id == task_id]:
            e = self.waiting.pop(approval_id)
            for index, key in ((self._by_batch, e.batch_id), (self._by_device, e.device_id)):
                ids = index.get(key)
                if ids is not None:
                    ids.discard(approval_id)
                    if not ids:
                        del index[key]

    def restore(self, rows: list[Approval], now: float) -> None:
        """The approvals of open attempts, decided or not, and every undecided one, from the
        store after a start or a failover. An undecided one waits again, its expiry re-armed, and
        a request not yet confirmed is asked of the device again (or `cancelled` is asked, if
        its attempt is gone); a refusal keeps its open attempt refused (a denial is final)."""
        for row in rows:
            if row.state != "pending":
                att = self.attempts.get(row.batch_id)
                if att is not None and row.state in REFUSALS:
                    att.refused = REFUSALS[row.state]
                continue
            e = Entry(
                row.id,
                row.batch_id,
                row.task_id,
                row.node_id,
                row.device_id,
                row.created_at.timestamp(),
                bool(row.local_only),
                row.requested_state,
                row.requested_by or "",
                row.requested_reason or "",
            )
            e.tool = row.tool
            self._wait(e, row.expires_at.timestamp(), now)
            if self.attempts.get(row.batch_id) is None:
                if e.requested != "cancelled":
                    self._request(
                        e, "cancelled", "orchestrator", "the attempt ended before the decision reached it", now
                    )
            elif e.requested is not None:
                self._send(e, now)
