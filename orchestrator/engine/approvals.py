"""Approvals in the engine (issue 18): a running node whose device waits for a person.

A device asks (`approval_request`, before anything of the command has run): the approval row
is inserted and the node goes `waiting_approval` in the same commit, its attempt's deadline
stops counting, and an expiry timer is set at `approval_timeout_s`. Decisions are made in the
store by one conditional update (`orchestrator.store.approvals.decide`), whoever makes them:
an operator over the API, the device's owner (the agent reports it), the expiry (below), or
the end of the attempt. The engine then acts on the decided row (`decided`): the node is
`running` again, the deadline moves on by the time waited, and the device is told
(`approval_decision`, after the commit). A request for an approval already decided is answered
with the decision, so a device that restarted or reconnected always converges.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from orchestrator.config import Settings
from orchestrator.domain.run import TaskRun, Transition
from orchestrator.engine.attempts import Attempts
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.records import ApprovalDecided, AttemptRun, DeviceRun, Input
from orchestrator.engine.timers import ApprovalExpiry, AttemptDeadline, Timers
from orchestrator.engine.times import utc
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store import approvals as stored
from orchestrator.store.models import Approval, Attempt
from orchestrator.store.repo import Store
from protocol.messages import ApprovalDecision, ApprovalRequest

log = logging.getLogger("orrery.engine")

MAX_SCREENSHOT_B64 = 3_000_000


@dataclass
class Waiting:
    approval_id: str
    batch_id: str
    task_id: str
    node_id: str
    device_id: str
    since: float  # engine clock


class ApprovalBook:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        tasks: dict[str, TaskRun],
        writer: StepWriter,
        timers: Timers,
        attempts: Attempts,
        outbox: Outbox,
        apply: Callable[[TaskRun, list[Transition], float], None],
        notify: Callable[[Input], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.tasks = tasks
        self.writer = writer
        self.timers = timers
        self.attempts = attempts
        self.outbox = outbox
        self.apply = apply
        self.notify = notify
        self.waiting: dict[str, Waiting] = {}
        self._chores: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- a device asks

    async def requested(self, dev: DeviceRun, msg: ApprovalRequest, now: float) -> None:
        if msg.approval_id in self.waiting:
            return  # asked again after a reconnect: still waiting
        row = await stored.get(self.store, msg.approval_id)
        if row is not None:
            if row.device_id == dev.id and row.state != "pending":
                self._tell(row.device_id, row, None)
            return
        att = self.attempts.get(msg.batch_id)
        if att is None or att.device_id != dev.id:
            # Its attempt ended (timed out, cancelled, the device was given up on): nothing may
            # run for it any more; say so, so the device stops waiting.
            self.outbox.send(
                dev.id,
                ApprovalDecision(
                    approval_id=msg.approval_id,
                    decision="cancelled",
                    reason=f"batch {msg.batch_id} is no longer current on this device",
                    by="orchestrator",
                ),
            )
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
        self._wait(Waiting(msg.approval_id, att.batch_id, att.task_id, att.node_id, dev.id, now), expires, now)
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

    def _wait(self, w: Waiting, expires: float, now: float) -> None:
        self.waiting[w.approval_id] = w
        self.timers.add(expires, ApprovalExpiry(w.approval_id))
        for att in self._paused(w.batch_id):
            if att.waiting_since is None:
                att.waiting_since = w.since
        run = self.tasks.get(w.task_id)
        if run is not None and run.has(unit := run.unit_of(w.node_id, w.device_id)):
            self.apply(run, run.waiting_approval(unit, True), now)

    def _paused(self, batch_id: str) -> list[AttemptRun]:
        """The attempt waiting, and an agent node's attempt above its step: their deadlines wait."""
        att = self.attempts.get(batch_id)
        if att is None:
            return []
        parent = self.attempts.get(att.parent) if att.parent else None
        return [att] if parent is None else [att, parent]

    # ---------------------------------------------------------------- decisions

    async def decided(self, approval_id: str, now: float) -> None:
        row = await stored.get(self.store, approval_id)
        if row is None or row.state == "pending":
            return
        w = self.waiting.pop(approval_id, None)
        deadline: float | None = None
        if w is not None:
            for att in self._paused(w.batch_id):
                since, att.waiting_since = att.waiting_since, None
                if att.deadline is not None and since is not None:
                    att.deadline += max(0.0, now - since)
                    self.timers.add(att.deadline, AttemptDeadline(att.batch_id))
                    self.writer.update(Attempt, (att.batch_id,), deadline=utc(att.deadline))
                    if att.batch_id == w.batch_id:
                        deadline = att.deadline
            run = self.tasks.get(w.task_id)
            if run is not None and run.has(unit := run.unit_of(w.node_id, w.device_id)):
                self.apply(run, run.waiting_approval(unit, False), now)
            self.writer.event(
                EventType.APPROVAL_DECIDED,
                w.task_id,
                w.node_id,
                now,
                approval_id=approval_id,
                decision=row.state,
                by=row.decided_by,
                reason=row.decision_reason,
            )
            log.info("approval %s %s by %s", approval_id, row.state, row.decided_by)
        self._tell(row.device_id, row, deadline)

    def _tell(self, device_id: str, row: Approval, deadline: float | None) -> None:
        frame = ApprovalDecision(
            approval_id=row.id,
            decision=row.state,
            reason=(row.decision_reason or "")[:2000],
            by=row.decided_by or "",
            deadline=utc(deadline) if deadline is not None else None,
        )
        self.writer.effect(functools.partial(self._send, device_id, frame))

    def _send(self, device_id: str, frame: ApprovalDecision) -> None:
        self.outbox.send(device_id, frame)

    async def reported(self, dev: DeviceRun, msg: ApprovalDecision, now: float) -> None:
        """The device's owner decided at the device (`orrery agent approve ID`)."""
        row = await stored.get(self.store, msg.approval_id)
        if row is None or row.device_id != dev.id:
            return
        if row.state == "pending":
            by = msg.by or "device owner"
            await stored.decide(self.store, row.id, msg.decision, f"{by} (at the device)", msg.reason, utc(now))
        await self.decided(row.id, now)

    def expire(self, timer: ApprovalExpiry) -> None:
        if timer.approval_id in self.waiting:
            limit = self.settings.approval_timeout_s
            why = f"nobody decided within approval_timeout_s ({limit:g}s)"
            self._decide_later(timer.approval_id, "expired", why)

    def attempt_ended(self, att: AttemptRun) -> None:
        """An attempt ended while its device waited (device lost, cancelled, timed out): its
        approval can no longer be given."""
        for w in [w for w in self.waiting.values() if w.batch_id == att.batch_id]:
            self._decide_later(w.approval_id, "cancelled", "the attempt ended before anyone decided")

    def _decide_later(self, approval_id: str, state: str, why: str) -> None:
        """Decide in the store after this step's commit, then let the engine act on the row."""

        async def chore() -> None:
            try:
                await stored.decide(self.store, approval_id, state, "orchestrator", why, utc(self.writer.clock()))
            except Exception as exc:  # the next reconcile finds it still waiting and tries again
                log.warning("could not record approval %s as %s: %s", approval_id, state, exc)
                return
            self.notify(ApprovalDecided(approval_id))

        self.writer.effect(lambda: self._spawn(chore()))

    async def drain(self) -> None:
        """Wait for the decisions being written (tests step the engine by hand)."""
        while self._chores:
            await asyncio.gather(*list(self._chores))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    # ---------------------------------------------------------------- recovery and reconciling

    def restore(self, rows: list[Approval], now: float) -> None:
        """Pending approvals from the store after a restart: waiting again, expiry re-armed."""
        for row in rows:
            since = row.created_at.timestamp()
            w = Waiting(row.id, row.batch_id, row.task_id, row.node_id, row.device_id, since)
            if self.attempts.get(row.batch_id) is None:
                self._decide_later(row.id, "cancelled", "the attempt ended before anyone decided")
                continue
            self._wait(w, row.expires_at.timestamp(), now)

    async def reconcile(self, now: float) -> None:
        """Decisions made on another replica whose hint was lost: act on them now."""
        states = await stored.pending_states(self.store, list(self.waiting))
        for approval_id, state in states.items():
            if state != "pending":
                await self.decided(approval_id, now)
