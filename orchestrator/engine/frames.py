"""What the engine does with each reliable frame a device sends (SPEC section 4): results are
checked against their open attempt and applied, acceptances and tool changes recorded, approvals
asked and reported, the owner's takeover at the device and safety breaches turned into controls."""

from __future__ import annotations

import logging

from orchestrator.engine.approvals import ApprovalBook
from orchestrator.engine.attempts import Applied, Attempts, Duplicate
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.records import DeviceRun, FrameIn
from orchestrator.engine.runs import Runs
from orchestrator.metrics import Metrics
from protocol.messages import (
    ApprovalDecision,
    ApprovalRequest,
    BatchAccepted,
    Error,
    OwnerTakeover,
    ResultBatch,
    SafetyBreach,
    ToolsChanged,
)

log = logging.getLogger("orrery.engine")


class DeviceFrames:
    def __init__(
        self, fleet: Fleet, attempts: Attempts, runs: Runs, approvals: ApprovalBook, outbox: Outbox, metrics: Metrics
    ) -> None:
        self.fleet = fleet
        self.attempts = attempts
        self.runs = runs
        self.approvals = approvals
        self.outbox = outbox
        self.metrics = metrics

    async def take(self, item: FrameIn, now: float) -> None:
        dev = self.fleet.devices.get(item.device_id)
        msg = item.message
        if dev is None:
            return
        if isinstance(msg, ResultBatch):
            await self._results(dev, msg, now)
        elif isinstance(msg, BatchAccepted):
            att = self.attempts.get(msg.batch_id)
            if att is not None and att.device_id == dev.id:
                self.fleet.accepted(att, now)
        elif isinstance(msg, ToolsChanged):
            self.fleet.tools_changed(dev, msg)
        elif isinstance(msg, ApprovalRequest):
            await self.approvals.requested(dev, msg, now)
        elif isinstance(msg, ApprovalDecision):
            self.approvals.reported(dev, msg, now)
        elif isinstance(msg, OwnerTakeover):  # the owner took the device over at the device, or handed it back
            self.runs.carry_out(self.fleet.controls.owner_takeover(dev, msg.state, now), now)
        elif isinstance(msg, SafetyBreach):  # a breached safety budget cordons the device
            news, actions = self.fleet.controls.breach(dev, msg, now)
            if news:
                self.metrics.safety_breaches.labels(msg.budget).inc()
            self.runs.carry_out(actions, now)

    async def _results(self, dev: DeviceRun, msg: ResultBatch, now: float) -> None:
        self.fleet.raise_fence(dev, msg.fence_seen)  # a device refusing a batch as stale says why
        verdict = await self.attempts.accept(dev, msg)
        if isinstance(verdict, Applied):
            self.runs.end_attempt(verdict.attempt, verdict.outcome, now, verdict.results)
            return
        if dev.current_batch == msg.batch_id:
            self.fleet.set_current(dev, None, now)  # the device finished work we had already given up on
        if isinstance(verdict, Duplicate):
            return  # a re-send of results already recorded: the ack it gets is all it needs
        log.warning("refused results from %s: %s", dev.id, verdict.message)
        self.outbox.send(dev.id, Error(code=verdict.code, message=verdict.message))
