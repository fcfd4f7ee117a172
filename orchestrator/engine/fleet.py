"""The devices as the engine knows them: what devices say (hello, acceptances, tool changes),
what replicas report of their links (liveness, periodic link reports, hearing), the sweep for
devices nobody reports any more, and what the API changes in their rows (enrollments, labels,
tokens). Their controls (drain, cordon, stop, resume, revoke, safety breaches) are the one
writer's in `controls`, a part of the fleet.

The fleet keeps the device records, their fences and their history. What a change means for
tasks (queued nodes made ready again, attempts of a lost device ended, nodes no device can run
any more) it returns as actions for the engine to apply."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from orchestrator.config import Settings
from orchestrator.domain import placement
from orchestrator.domain.lifecycle import history_state
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.engine.actions import Action, Lost, Requeue
from orchestrator.engine.attempts import Attempts
from orchestrator.engine.controls import DeviceControls
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.queues import Queues
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceHello, DeviceRun, LinkReport
from orchestrator.engine.restore import device_from_row
from orchestrator.engine.times import utc
from orchestrator.engine.validation import known_tools
from orchestrator.engine.writer import StepWriter
from orchestrator.store.models import Attempt, Device, DeviceHistory
from protocol.errors import CloseCode
from protocol.messages import Cancel, Hello, ToolsChanged

log = logging.getLogger("orrery.engine")

RESEND_AFTER_S = 3.0  # an unaccepted batch its idle, heartbeating device does not have goes again

_LIVENESS_REASONS = {
    Liveness.ENROLLED: "enrolled",
    Liveness.ONLINE: "connected",
    Liveness.SUSPECT: "heartbeats are late",
    Liveness.OFFLINE: "connection lost",
}


class DeviceRows(Protocol):
    async def get_device(self, device_id: str) -> Device | None: ...


class Fleet:
    def __init__(
        self,
        settings: Settings,
        store: DeviceRows,
        writer: StepWriter,
        queues: Queues,
        attempts: Attempts,
        outbox: Outbox,
        devices: dict[str, DeviceRun],
    ) -> None:
        self.settings = settings
        self.store = store
        self.writer = writer
        self.queues = queues
        self.attempts = attempts
        self.outbox = outbox
        self.devices = devices
        self.replica_id = "local"  # the replica this engine runs on (its own devices need no bus)
        self.deaf = False  # cannot hear other replicas now (see `Hearing`)
        self.history_written: set[str] = set()  # devices whose history grew since it was last pruned
        self.controls = DeviceControls(self)  # the one writer of the devices' controls

    # ---------------------------------------------------------------- connections

    def hello(self, item: DeviceHello, now: float) -> tuple[bool, list[Action]]:
        """A device connected or resumed. False if a newer connection of it exists elsewhere
        (its gateway then closes this one: only the newest speaks for the device)."""
        dev = self.devices.get(item.device_id)
        hello = item.hello
        if dev is None or not isinstance(hello, Hello):
            return False, []
        if not self._current(dev, item.epoch, item.replica, now):
            log.info("ignored a hello of device %s from an older connection (epoch %d)", dev.id, item.epoch)
            return False, []
        dev.reported_labels = dict(hello.labels)
        dev.platform = hello.info.platform
        dev.tools = {t.name: t.model_dump() for t in hello.tools}
        dev.features = frozenset(hello.features)
        self.queues.devices_changed()
        self.writer.update(
            Device,
            (dev.id,),
            reported_labels=dev.reported_labels,
            platform=dev.platform,
            # What its agent can do beyond the base protocol is read from here by every replica.
            info=hello.info.model_dump() | {"features": sorted(dev.features)},
            tools=list(dev.tools.values()),
            last_seen=utc(now),
        )
        self.raise_fence(dev, hello.fence_seen)
        recovering, dev.recovering = dev.recovering, False
        actions = self.set_liveness(dev, Liveness.ONLINE, now)
        self.controls.heard(dev, hello.control_gen, now, connected=True)
        actions += self.controls.owner_takeover(dev, hello.owner_takeover, now)
        if not item.resumed or recovering:
            # A new session knows nothing of earlier frames, and an engine that (re)started since
            # the session began does not know what reached it: re-send every open attempt from
            # the store's truth. The agent's ledger answers a batch it already has.
            self._redispatch(dev)
        return True, actions

    def _current(self, dev: DeviceRun, epoch: int, replica: str, now: float) -> bool:
        """Is connection `epoch` (on `replica`) the device's newest? Adopt it if it is newer."""
        if epoch < dev.epoch:
            return False
        if epoch > dev.epoch or dev.replica != replica:
            dev.epoch, dev.replica = epoch, replica or None
        dev.heard_at = now
        return True

    def raise_fence(self, dev: DeviceRun, seen: int) -> None:
        """The device has seen fences up to `seen` (our store may have been restored from a
        backup): fences only grow, so the next assignment goes above it (SPEC section 4)."""
        if seen > dev.fence:
            log.warning("device %s has seen fence %d, above ours (%d): raising ours", dev.id, seen, dev.fence)
            dev.fence = seen
            self.writer.update(Device, (dev.id,), fence=dev.fence)

    def next_fence(self, dev: DeviceRun) -> int:
        dev.fence += 1
        self.writer.update(Device, (dev.id,), fence=dev.fence)
        return dev.fence

    def _redispatch(self, dev: DeviceRun) -> None:
        for att in self.attempts.on_device(dev.id):
            if att.kind is not AttemptKind.AGENT:
                self.outbox.dispatch_after_commit(att)
                if att.cancel_reason:
                    self.outbox.cancel_again_after_commit(att)

    # ---------------------------------------------------------------- what replicas report

    def liveness(
        self, device_id: str, liveness: Liveness, now: float, epoch: int = 0, replica: str = ""
    ) -> list[Action]:
        """What the replica holding connection `epoch` judges; ignored from an older connection
        (a replica the device left must not declare it offline)."""
        dev = self.devices.get(device_id)
        if dev is None or not self._current(dev, epoch, replica, now):
            return []
        if liveness is Liveness.SUSPECT and dev.liveness is Liveness.OFFLINE:
            # "Late" is no sign of life: a report taken before the link ended, or a notice that
            # crossed the engine's own judgement, must not bring an offline device back to
            # suspect. Only a frame (online) or a new connection does.
            return []
        if liveness is Liveness.ONLINE and dev.recovering:
            # Announced by the replica holding its socket after an engine (re)start: frames sent
            # before may be lost, so every open batch goes again (the agent de-duplicates).
            dev.recovering = False
            self._redispatch(dev)
        return self.set_liveness(dev, liveness, now)

    def report(self, report: LinkReport, now: float) -> list[Action]:
        """A replica's periodic account of its links: the liveness view, acceptances and busy
        states are re-derived from it, so a lost notification costs one report interval."""
        actions: list[Action] = []
        replica = report.replica or None
        for link in report.links:
            dev = self.devices.get(link.device_id)
            if dev is None or link.epoch < dev.epoch:
                continue  # not its newest connection
            if link.liveness is not dev.liveness or link.epoch != dev.epoch or dev.replica != replica or dev.recovering:
                actions += self.liveness(link.device_id, link.liveness, now, link.epoch, report.replica)
            # else: the usual case at scale (nothing changed), without the general path's work
            dev.heard_at = now - max(0.0, link.silent_s)
            if link.control_gen != dev.applied_gen or link.control_gen < dev.control_gen:
                self.controls.heard(dev, link.control_gen, now)
            if link.batch_id is not None or dev.current_batch is not None:  # an idle device has nothing to reconcile
                self._reconcile_batch(dev, link.batch_id, now)
        return actions

    def _reconcile_batch(self, dev: DeviceRun, running: str | None, now: float) -> None:
        """The device said (heartbeat) it is running `running`: that batch was accepted, even if
        its `batch_accepted` was lost; and a device that is idle or on other work is not busy
        with a batch the engine already closed. A cancel is desired state too: a batch the engine
        cancelled or already ended that the device says it still runs is told again to stop."""
        att = self.attempts.get(running)
        if att is not None and att.device_id == dev.id:
            self.accepted(att, now)
        if running is not None and (att is None or att.device_id != dev.id or att.cancel_reason is not None):
            self._cancel_again(dev, running, att.cancel_reason if att is not None and att.cancel_reason else None, now)
        waiting = self.attempts.get(dev.current_batch)
        if (
            running is None
            and waiting is not None
            and waiting.kind in (AttemptKind.TOOL, AttemptKind.VERIFY)
            and now - max(waiting.started, waiting.resent_at) > RESEND_AFTER_S
        ):
            # It heartbeats and runs nothing, but a batch sent a while ago is open on it: the
            # frame was lost on its way (a relay dropped while Redis restarted), or the agent
            # restarted after accepting it and the batch sent again at its hello was lost too (a
            # batch waiting for an approval keeps no deadline: it would wait for ever). Send it
            # again; a device that has it answers from its ledger (its results, or it goes on).
            log.info("re-sending batch %s to device %s, which says it runs nothing", waiting.batch_id, dev.id)
            waiting.resent_at = now  # at most once per interval
            self.outbox.dispatch_after_commit(waiting)
        current = dev.current_batch
        if current is not None and current != running and self.attempts.get(current) is None:
            self.set_current(dev, None, now)

    def _cancel_again(self, dev: DeviceRun, batch_id: str, reason: str | None, now: float) -> None:
        last = dev.cancel_sent
        if last is not None and last[0] == batch_id and now - last[1] < RESEND_AFTER_S:
            return
        if last is None or last[0] != batch_id:
            dev.cancel_sent = (batch_id, now)  # the first sighting: the cancel sent with its end may still land
            return
        dev.cancel_sent = (batch_id, now)
        why = reason or "ended"
        log.info(
            "device %s still runs batch %s (%s by the orchestrator): telling it again to stop", dev.id, batch_id, why
        )
        self.outbox.send(dev.id, Cancel(batch_id=batch_id, reason=why))

    def accepted(self, att: AttemptRun, now: float) -> None:
        if att.accepted:
            return
        att.accepted = True
        # Informational only (retry safety never depends on it), so it rides along with the next
        # commit instead of costing one of its own on the hot path.
        self.writer.soft_update(Attempt, (att.batch_id,), now, status="accepted", accepted_at=utc(now))

    def tools_changed(self, dev: DeviceRun, msg: ToolsChanged) -> None:
        dev.tools = {t.name: t.model_dump() for t in msg.tools}
        self.queues.devices_changed()
        self.writer.update(Device, (dev.id,), tools=list(dev.tools.values()))

    def hearing(self, up: bool, now: float) -> None:
        """While the bus is down, devices on other replicas cannot be heard, so their silence
        proves nothing; once it is back, each gets a full heartbeat timeout to be reported."""
        self.deaf = not up
        if up:
            for dev in self.devices.values():
                if dev.replica != self.replica_id and dev.heard_at is not None:
                    dev.heard_at = max(dev.heard_at, now)

    def sweep(self, now: float) -> list[Action]:
        """Devices nobody has reported for a heartbeat timeout are offline (their replica died,
        or their link ended and its notice was lost). The gateway holding a link judges it first;
        this is the backstop that needs no message to arrive."""
        timeout = self.settings.heartbeat_timeout_s
        actions: list[Action] = []
        cutoff = now - timeout
        for dev in list(self.devices.values()):
            if dev.heard_at is None or dev.heard_at >= cutoff:
                continue  # heard from lately (most devices: checked first, it is the cheapest test)
            if dev.liveness not in (Liveness.ONLINE, Liveness.SUSPECT):
                continue
            if self.deaf and dev.replica != self.replica_id:
                continue
            if now - dev.heard_at > timeout:
                log.warning("device %s not reported for %.0fs: offline", dev.id, now - dev.heard_at)
                dev.recovering = False
                reason = f"not heard from for {now - dev.heard_at:.0f}s"
                actions += self.set_liveness(dev, Liveness.OFFLINE, now, reason)
        return actions

    # ---------------------------------------------------------------- state and history

    def set_current(self, dev: DeviceRun, batch_id: str | None, now: float) -> None:
        if dev.current_batch != batch_id:
            dev.current_batch = batch_id
            self.writer.update(Device, (dev.id,), current_batch_id=batch_id)
            if batch_id is None and dev.admin is AdminState.DRAINING:
                self.record_state(dev, "its last batch ended", now)

    def set_liveness(self, dev: DeviceRun, liveness: Liveness, now: float, reason: str = "") -> list[Action]:
        if dev.liveness is liveness:
            return []
        dev.liveness = liveness
        self.writer.update(Device, (dev.id,), liveness=liveness.value, last_seen=utc(now))
        actions: list[Action] = []
        if liveness in (Liveness.SUSPECT, Liveness.OFFLINE):
            actions.append(Requeue(self.queues.unqueue_all(dev)))
        if liveness is Liveness.OFFLINE:
            actions.append(self._lose(dev, now))
        if dev.admin is not AdminState.REVOKED:  # revoking is recorded where the operator did it
            self.record_state(dev, reason or _LIVENESS_REASONS[liveness], now)
        return actions

    def record_state(self, dev: DeviceRun, reason: str, now: float) -> None:
        """Add the device's state to its history, in the commit of the change that made it
        (liveness and admin changes; running a batch or not is no change of state there)."""
        state = history_state(dev.admin, dev.liveness, dev.current_batch is not None, len(dev.queue))
        if state.value == dev.recorded:
            return
        dev.recorded = state.value
        self.history_written.add(dev.id)
        self.writer.insert(
            DeviceHistory, {"device_id": dev.id, "state": state.value, "reason": reason[:300], "at": utc(now)}
        )

    def _lose(self, dev: DeviceRun, now: float) -> Lost:
        """A new fencing epoch: anything the lost session still says carries an older fence and
        is refused (SPEC section 4: a stale session cannot act); its batches end `device_lost`."""
        self.next_fence(dev)
        self.set_current(dev, None, now)
        return Lost(dev, f"device '{dev.name}' went offline while running this batch; it was re-placed if retry-safe")

    # ---------------------------------------------------------------- read side

    def known_tools(self) -> dict[str, dict[str, Any]]:
        return known_tools(self.devices.values())

    def inventory(self) -> list[dict[str, Any]]:
        """Devices a planner may use: id, name, platform, labels, state and tool catalogue."""
        return [
            {
                "id": d.id,
                "name": d.name,
                "platform": d.platform,
                "labels": d.merged_labels(),
                "state": placement.state_of(d.view()).value,
                "tools": list(d.tools.values()),
            }
            for d in self.devices.values()
            if d.admin is AdminState.ACTIVE and d.tools
        ]

    def take_history_written(self) -> list[str]:
        written, self.history_written = self.history_written, set()
        return sorted(written)

    # ---------------------------------------------------------------- what operators change

    async def changed(self, device_id: str, now: float) -> list[Action]:
        """Adopt what the API changed in a device row: a new enrollment, its labels, name or
        token. Its admin state and controls are the engine's own (`controls`), never read back."""
        row = await self.store.get_device(device_id)
        if row is None:
            return []
        self.queues.devices_changed()
        dev = self.devices.get(device_id)
        if dev is None:
            self.devices[device_id] = device_from_row(row)
            return []
        old_token = dev.token_hash
        dev.labels = dict(row.labels or {})
        dev.name = row.name
        dev.token_hash = row.token_hash
        if old_token and dev.token_hash != old_token and dev.admin is not AdminState.REVOKED:
            self.outbox.close_after_commit(dev, CloseCode.UNAUTHORIZED, "device token rotated")
        return []
