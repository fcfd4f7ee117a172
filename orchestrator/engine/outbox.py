"""Frames the engine sends devices (through the gateways, found by the cluster): batches, cancels,
closes. Each is an effect of the step that decided it, so it leaves only once that step is stored."""

from __future__ import annotations

import functools
from typing import Protocol

from orchestrator.engine.attempts import Attempts
from orchestrator.engine.records import AttemptRun, DeviceRun, Route
from orchestrator.engine.times import utc
from orchestrator.engine.writer import StepWriter
from orchestrator.store.models import Attempt
from protocol.messages import Cancel, CommandBatch, Message


class DeviceLinks(Protocol):
    """What the engine needs from the gateway (through the cluster, which finds the replica)."""

    def send(self, device_id: str, message: Message, route: Route) -> bool:
        """Queue a frame for the device's current session; False only if it certainly cannot
        reach the device (no session holds it), True if it may."""
        ...

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None: ...


class Outbox:
    def __init__(self, devices: dict[str, DeviceRun], attempts: Attempts, writer: StepWriter) -> None:
        self.devices = devices
        self.attempts = attempts
        self.writer = writer
        self.links: DeviceLinks | None = None

    def send(self, device_id: str, message: Message) -> bool:
        """Now (not after the commit): only for answers that change nothing stored."""
        dev = self.devices.get(device_id)
        if self.links is None or dev is None:
            return False
        return self.links.send(device_id, message, dev.route)

    def dispatch_after_commit(self, att: AttemptRun) -> None:
        self.writer.effect(functools.partial(self._dispatch, att))

    def _dispatch(self, att: AttemptRun) -> None:
        if self.attempts.get(att.batch_id) is None:
            return  # it ended before its frame could leave
        frame = CommandBatch(
            batch_id=att.batch_id,
            task_id=att.task_id,
            node_id=att.node_id,
            attempt=att.n,
            fence=att.fence,
            deadline=utc(att.deadline) if att.deadline else None,
            commands=att.commands,
            record=att.record,
        )
        att.sent = self.send(att.device_id, frame) or att.sent

    def cancel(self, att: AttemptRun, reason: str) -> None:
        """Tell the device to stop `att` (once; the reason is stored with the attempt)."""
        if att.cancel_reason is None:
            att.cancel_reason = reason
            self.writer.update(Attempt, (att.batch_id,), cancel_reason=reason)
            self.cancel_again_after_commit(att)

    def cancel_again_after_commit(self, att: AttemptRun) -> None:
        self.writer.effect(functools.partial(self._send_cancel, att))

    def _send_cancel(self, att: AttemptRun) -> None:
        self.send(att.device_id, Cancel(batch_id=att.batch_id, reason=att.cancel_reason or "cancelled"))

    def frame_after_commit(self, dev: DeviceRun, message: Message) -> None:
        """A device-level frame (emergency stop, resume) once the step that decided it is stored."""
        self.writer.effect(functools.partial(self._send_frame, dev.id, message))

    def _send_frame(self, device_id: str, message: Message) -> None:
        self.send(device_id, message)

    def close_after_commit(self, dev: DeviceRun, code: int, reason: str) -> None:
        links, device_id, route = self.links, dev.id, dev.route
        if links is not None:
            self.writer.effect(lambda: links.close(device_id, code, reason, route))
