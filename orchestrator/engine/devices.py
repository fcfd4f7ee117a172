"""What devices say and what operators do to them: hello, liveness, admin changes, frames.
A mixin of `Engine`, applying each through the engine's state and records."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, cast

from orchestrator.config import Settings
from orchestrator.domain.lifecycle import history_state
from orchestrator.domain.model import AdminState, DeviceState, Liveness
from orchestrator.domain.run import AttemptOutcome, TaskRun, Transition
from orchestrator.engine import llm_work
from orchestrator.engine.records import AttemptRun, DeviceHello, DeviceRun, LinkReport, NodeKey
from orchestrator.engine.restore import device_from_row
from orchestrator.engine.times import utc
from orchestrator.store.models import Attempt, Device, DeviceHistory
from orchestrator.store.repo import ChangeSet, Store
from protocol.errors import CloseCode, ErrorCode
from protocol.messages import BatchAccepted, Hello, Message, ResultBatch, ToolsChanged

if TYPE_CHECKING:
    from orchestrator.engine.core import DeviceLinks, Engine

log = logging.getLogger("orrery.engine")

SOFT_FLUSH_S = 1.0  # informational updates wait at most this long for a commit to ride along
RESEND_AFTER_S = 3.0  # an unaccepted batch its idle, heartbeating device does not have goes again


_LIVENESS_REASONS = {
    Liveness.ENROLLED: "enrolled",
    Liveness.ONLINE: "connected",
    Liveness.SUSPECT: "heartbeats are late",
    Liveness.OFFLINE: "connection lost",
}


def _steps_first(att: AttemptRun) -> int:
    return 0 if att.kind == "step" else 1


class DeviceInputs:
    settings: Settings
    store: Store
    replica_id: str
    deaf: bool
    links: DeviceLinks | None
    devices: dict[str, DeviceRun]
    attempts: dict[str, AttemptRun]
    ready: dict[NodeKey, None]
    _changes: ChangeSet
    _soft: ChangeSet
    _soft_since: float | None
    _effects: list[Any]
    _capable_cache: dict[tuple[Any, ...], list[str]]
    history_written: set[str]

    if TYPE_CHECKING:  # provided by Engine and its other mixins (no runtime stubs: they would shadow them)

        def _apply(self, run: TaskRun, transitions: list[Transition], now: float) -> None: ...

        def _dispatch(self, att: AttemptRun) -> None: ...

        def _send_cancel_frame(self, att: AttemptRun) -> None: ...

        def _end_attempt(self, att: AttemptRun, outcome: AttemptOutcome, now: float, results: Any = None) -> None: ...

        def _end_unanswered(self, att: AttemptRun, code: str, message: str, now: float) -> None: ...

        def _set_current(self, dev: DeviceRun, batch_id: str | None) -> None: ...

        def _unqueue_all(self, dev: DeviceRun, now: float) -> None: ...

        def _maybe_fail_unplaceable(self, key: NodeKey, now: float) -> None: ...

        def _timer(self, when: float, kind: str, key: Any) -> None: ...

        async def _on_results(self, dev: DeviceRun, msg: ResultBatch, now: float) -> None: ...

    def _on_hello(self, item: DeviceHello, now: float) -> bool:
        """A device connected or resumed. False if a newer connection of it exists elsewhere
        (its gateway then closes this one: only the newest speaks for the device)."""
        dev = self.devices.get(item.device_id)
        hello = item.hello
        if dev is None or not isinstance(hello, Hello):
            return False
        if not self._current(dev, item.epoch, item.replica, now):
            log.info("ignored a hello of device %s from an older connection (epoch %d)", dev.id, item.epoch)
            return False
        dev.reported_labels = dict(hello.labels)
        dev.platform = hello.info.platform
        dev.tools = {t.name: t.model_dump() for t in hello.tools}
        self._capable_cache.clear()
        self._changes.update(
            Device,
            (dev.id,),
            reported_labels=dev.reported_labels,
            platform=dev.platform,
            info=hello.info.model_dump(),
            tools=list(dev.tools.values()),
            last_seen=utc(now),
        )
        self._raise_fence(dev, hello.fence_seen)
        recovering, dev.recovering = dev.recovering, False
        self._set_liveness(dev, Liveness.ONLINE, now)
        if not item.resumed or recovering:
            # A new session knows nothing of earlier frames, and an engine that (re)started since
            # the session began does not know what reached it: re-send every open attempt from
            # the store's truth. The agent's ledger answers a batch it already has.
            self._redispatch(dev)
        return True

    def _current(self, dev: DeviceRun, epoch: int, replica: str, now: float) -> bool:
        """Is connection `epoch` (on `replica`) the device's newest? Adopt it if it is newer."""
        if epoch < dev.epoch:
            return False
        if epoch > dev.epoch or dev.replica != replica:
            dev.epoch, dev.replica = epoch, replica or None
        dev.heard_at = now
        return True

    def _raise_fence(self, dev: DeviceRun, seen: int) -> None:
        """The device has seen fences up to `seen` (our store may have been restored from a
        backup): fences only grow, so the next assignment goes above it (SPEC section 4)."""
        if seen > dev.fence:
            log.warning("device %s has seen fence %d, above ours (%d): raising ours", dev.id, seen, dev.fence)
            dev.fence = seen
            self._changes.update(Device, (dev.id,), fence=dev.fence)

    def _redispatch(self, dev: DeviceRun) -> None:
        for att in self.attempts.values():
            if att.device_id == dev.id and att.kind != "agent":
                self._effects.append(functools.partial(self._dispatch, att))
                if att.cancel_reason:
                    self._effects.append(functools.partial(self._send_cancel_frame, att))

    def _on_liveness(self, device_id: str, liveness: Liveness, now: float, epoch: int = 0, replica: str = "") -> None:
        """What the replica holding connection `epoch` judges; ignored from an older connection
        (a replica the device left must not declare it offline)."""
        dev = self.devices.get(device_id)
        if dev is None or not self._current(dev, epoch, replica, now):
            return
        if liveness is Liveness.ONLINE and dev.recovering:
            # Announced by the replica holding its socket after an engine (re)start: frames sent
            # before may be lost, so every open batch goes again (the agent de-duplicates).
            dev.recovering = False
            self._redispatch(dev)
        self._set_liveness(dev, liveness, now)

    def _on_report(self, report: LinkReport, now: float) -> None:
        """A replica's periodic account of its links: the liveness view, acceptances and busy
        states are re-derived from it, so a lost notification costs one report interval."""
        for link in report.links:
            dev = self.devices.get(link.device_id)
            if dev is None or link.epoch < dev.epoch:
                continue  # not its newest connection
            self._on_liveness(link.device_id, link.liveness, now, link.epoch, report.replica)
            dev.heard_at = now - max(0.0, link.silent_s)
            self._reconcile_batch(dev, link.batch_id, now)

    def _reconcile_batch(self, dev: DeviceRun, running: str | None, now: float) -> None:
        """The device said (heartbeat) it is running `running`: that batch was accepted, even if
        its `batch_accepted` was lost; and a device that is idle or on other work is not busy
        with a batch the engine already closed."""
        att = self.attempts.get(running or "")
        if att is not None and att.device_id == dev.id:
            self._accepted(att, now)
        waiting = self.attempts.get(dev.current_batch or "")
        if (
            running is None
            and waiting is not None
            and waiting.kind == "tool"
            and not waiting.accepted
            and now - max(waiting.started, waiting.resent_at) > RESEND_AFTER_S
        ):
            # It heartbeats, runs nothing, and has not accepted a batch sent a while ago: the
            # frame was lost on its way (a relay dropped while Redis restarted). Send it again;
            # a device that has it after all answers from its ledger.
            log.info("re-sending batch %s to device %s, which says it runs nothing", waiting.batch_id, dev.id)
            waiting.resent_at = now  # at most once per interval
            self._effects.append(functools.partial(self._dispatch, waiting))
        current = dev.current_batch
        if current is not None and current != running and current not in self.attempts:
            self._set_current(dev, None)

    def _accepted(self, att: AttemptRun, now: float) -> None:
        if att.accepted:
            return
        att.accepted = True
        # Informational only (retry safety never depends on it), so it rides along with the next
        # commit instead of costing one of its own on the hot path.
        self._soft.update(Attempt, (att.batch_id,), status="accepted", accepted_at=utc(now))
        if self._soft_since is None:
            self._soft_since = now
            self._timer(now + SOFT_FLUSH_S, "wake", None)

    def _on_hearing(self, up: bool, now: float) -> None:
        """While the bus is down, devices on other replicas cannot be heard, so their silence
        proves nothing; once it is back, each gets a full heartbeat timeout to be reported."""
        self.deaf = not up
        if up:
            for dev in self.devices.values():
                if dev.replica != self.replica_id and dev.heard_at is not None:
                    dev.heard_at = max(dev.heard_at, now)

    def _sweep(self, now: float) -> None:
        """Devices nobody has reported for a heartbeat timeout are offline (their replica died,
        or their link ended and its notice was lost). The gateway holding a link judges it first;
        this is the backstop that needs no message to arrive."""
        timeout = self.settings.heartbeat_timeout_s
        for dev in list(self.devices.values()):
            if dev.liveness not in (Liveness.ONLINE, Liveness.SUSPECT) or dev.heard_at is None:
                continue
            if self.deaf and dev.replica != self.replica_id:
                continue
            if now - dev.heard_at > timeout:
                log.warning("device %s not reported for %.0fs: offline", dev.id, now - dev.heard_at)
                dev.recovering = False
                self._set_liveness(dev, Liveness.OFFLINE, now, f"not heard from for {now - dev.heard_at:.0f}s")

    def _set_liveness(self, dev: DeviceRun, liveness: Liveness, now: float, reason: str = "") -> None:
        if dev.liveness is liveness:
            return
        dev.liveness = liveness
        self._changes.update(Device, (dev.id,), liveness=liveness.value, last_seen=utc(now))
        if liveness in (Liveness.SUSPECT, Liveness.OFFLINE):
            self._unqueue_all(dev, now)
        if liveness is Liveness.OFFLINE:
            self._lose(dev, now)
        if dev.admin is not AdminState.REVOKED:  # revoking is recorded where the operator did it
            self._record_state(dev, reason or _LIVENESS_REASONS[liveness], now)

    def _record_state(self, dev: DeviceRun, reason: str, now: float) -> None:
        """Add the device's state to its history, in the commit of the change that made it
        (liveness and admin changes; running a batch or not is no change of state there)."""
        state = history_state(dev.admin, dev.liveness, dev.current_batch is not None, len(dev.queue))
        if state.value == dev.recorded:
            return
        dev.recorded = state.value
        self.history_written.add(dev.id)
        self._changes.insert(
            DeviceHistory, {"device_id": dev.id, "state": state.value, "reason": reason[:300], "at": utc(now)}
        )

    def _lose(self, dev: DeviceRun, now: float) -> None:
        """A new fencing epoch: anything the lost session still says carries an older fence and
        is refused (SPEC section 4: a stale session cannot act); its batches end `device_lost`."""
        dev.fence += 1
        self._changes.update(Device, (dev.id,), fence=dev.fence)
        lost = f"device '{dev.name}' went offline while running this batch; it was re-placed if retry-safe"
        for att in sorted([a for a in self.attempts.values() if a.device_id == dev.id], key=_steps_first):
            if att.kind == "agent":
                llm_work.stop_agent(cast("Engine", self), att, ErrorCode.DEVICE_LOST, lost, now, "device_lost")
                continue
            if att.batch_id not in self.attempts:
                continue
            self._end_unanswered(att, ErrorCode.DEVICE_LOST, lost, now)
        self._set_current(dev, None)

    async def _on_device_changed(self, device_id: str, now: float) -> None:
        row = await self.store.get_device(device_id)
        if row is None:
            return
        self._capable_cache.clear()
        dev = self.devices.get(device_id)
        if dev is None:
            self.devices[device_id] = device_from_row(row)
            return
        old_admin, old_token = dev.admin, dev.token_hash
        dev.admin = AdminState(row.admin_state)
        dev.labels = dict(row.labels or {})
        dev.name = row.name
        dev.token_hash = row.token_hash
        if dev.admin is not AdminState.ACTIVE and old_admin is AdminState.ACTIVE:
            self._unqueue_all(dev, now)
        # The operator's change is in the history already (written with it); this engine now
        # knows it too, and a drain that found nothing running is already drained.
        dev.recorded = history_state(dev.admin, dev.liveness, dev.current_batch is not None, len(dev.queue)).value
        if (
            dev.admin is AdminState.DRAINING
            and old_admin is not AdminState.DRAINING
            and dev.recorded == DeviceState.DRAINED
            and await self.store.last_device_state(dev.id) == DeviceState.DRAINING
        ):
            # Its last batch ended between the operator's request and now.
            dev.recorded = None
            self._record_state(dev, "its last batch ended", now)
        if old_token and dev.token_hash != old_token and dev.admin is not AdminState.REVOKED:
            links = self.links
            if links is not None:
                route = dev.route
                self._effects.append(
                    lambda: links.close(device_id, CloseCode.UNAUTHORIZED, "device token rotated", route)
                )
        if dev.admin is AdminState.REVOKED:
            links = self.links
            if links is not None:
                route = dev.route
                self._effects.append(
                    lambda: links.close(device_id, CloseCode.UNAUTHORIZED, "device token revoked", route)
                )
            self._set_liveness(dev, Liveness.OFFLINE, now)
            # A revoked device will never run anything: nodes that only it could run fail now.
            for key in list(self.ready):
                self._maybe_fail_unplaceable(key, now)

    # ---------------------------------------------------------------- frames

    async def _on_frame(self, device_id: str, msg: Message, now: float) -> None:
        dev = self.devices.get(device_id)
        if dev is None:
            return
        if isinstance(msg, ResultBatch):
            await self._on_results(dev, msg, now)
        elif isinstance(msg, BatchAccepted):
            att = self.attempts.get(msg.batch_id)
            if att is not None and att.device_id == device_id:
                self._accepted(att, now)
        elif isinstance(msg, ToolsChanged):
            dev.tools = {t.name: t.model_dump() for t in msg.tools}
            self._capable_cache.clear()
            self._changes.update(Device, (dev.id,), tools=list(dev.tools.values()))
