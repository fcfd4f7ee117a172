"""What devices say and what operators do to them: hello, liveness, admin changes, frames.
A mixin of `Engine`, applying each through the engine's state and records."""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, cast

from orchestrator.domain.model import AdminState, Liveness
from orchestrator.domain.run import AttemptOutcome, TaskRun, Transition
from orchestrator.engine import llm_work
from orchestrator.engine.records import AttemptRun, DeviceHello, DeviceRun, NodeKey
from orchestrator.engine.restore import device_from_row
from orchestrator.engine.times import utc
from orchestrator.store.models import Attempt, Device
from orchestrator.store.repo import ChangeSet, Store
from protocol.errors import CloseCode, ErrorCode
from protocol.messages import BatchAccepted, Hello, Message, ResultBatch, ToolsChanged

if TYPE_CHECKING:
    from orchestrator.engine.core import DeviceLinks, Engine

log = logging.getLogger("orrery.engine")

SOFT_FLUSH_S = 1.0  # informational updates wait at most this long for a commit to ride along


def _steps_first(att: AttemptRun) -> int:
    return 0 if att.kind == "step" else 1


class DeviceInputs:
    store: Store
    links: DeviceLinks | None
    devices: dict[str, DeviceRun]
    attempts: dict[str, AttemptRun]
    ready: dict[NodeKey, None]
    _changes: ChangeSet
    _soft: ChangeSet
    _soft_since: float | None
    _effects: list[Any]
    _capable_cache: dict[tuple[Any, ...], list[str]]

    if TYPE_CHECKING:  # provided by Engine and its other mixins (no runtime stubs: they would shadow them)

        def _apply(self, run: TaskRun, transitions: list[Transition], now: float) -> None: ...

        def _dispatch(self, att: AttemptRun) -> None: ...

        def _send_cancel_frame(self, att: AttemptRun) -> None: ...

        def _end_attempt(self, att: AttemptRun, outcome: AttemptOutcome, now: float, results: Any = None) -> None: ...

        def _set_current(self, dev: DeviceRun, batch_id: str | None) -> None: ...

        def _unqueue_all(self, dev: DeviceRun, now: float) -> None: ...

        def _maybe_fail_unplaceable(self, key: NodeKey, now: float) -> None: ...

        def _timer(self, when: float, kind: str, key: Any) -> None: ...

        async def _on_results(self, dev: DeviceRun, msg: ResultBatch, now: float) -> None: ...

    def _on_hello(self, item: DeviceHello, now: float) -> None:
        dev = self.devices.get(item.device_id)
        hello = item.hello
        if dev is None or not isinstance(hello, Hello):
            return
        dev.reported_labels = dict(hello.labels)
        dev.platform = hello.info.platform
        dev.tools = {t.name: t.model_dump() for t in hello.tools}
        dev.liveness = Liveness.ONLINE
        self._capable_cache.clear()
        self._changes.update(
            Device,
            (dev.id,),
            reported_labels=dev.reported_labels,
            platform=dev.platform,
            info=hello.info.model_dump(),
            tools=list(dev.tools.values()),
            liveness=dev.liveness.value,
            last_seen=utc(now),
        )
        dev.recovering = False
        if not item.resumed:
            # A new session knows nothing of earlier frames: re-send every open attempt from the
            # store's truth. The agent's ledger answers a batch it already ran with its results.
            self._redispatch(dev)

    def _redispatch(self, dev: DeviceRun) -> None:
        for att in self.attempts.values():
            if att.device_id == dev.id and att.kind != "agent":
                self._effects.append(functools.partial(self._dispatch, att))
                if att.cancel_reason:
                    self._effects.append(functools.partial(self._send_cancel_frame, att))

    def _on_liveness(self, device_id: str, liveness: Liveness, now: float) -> None:
        dev = self.devices.get(device_id)
        if dev is None:
            return
        if liveness is Liveness.ONLINE and dev.recovering:
            # Announced by the replica holding its socket after an engine (re)start: frames sent
            # before may be lost, so every open batch goes again (the agent de-duplicates).
            dev.recovering = False
            self._redispatch(dev)
        if dev.liveness is liveness:
            return
        dev.liveness = liveness
        self._changes.update(Device, (dev.id,), liveness=liveness.value, last_seen=utc(now))
        if liveness in (Liveness.SUSPECT, Liveness.OFFLINE):
            self._unqueue_all(dev, now)
        if liveness is Liveness.OFFLINE:
            # A new fencing epoch: anything the lost session still says carries an older fence
            # and is refused (SPEC section 4: a stale session cannot act).
            dev.fence += 1
            self._changes.update(Device, (dev.id,), fence=dev.fence)
            lost = f"device '{dev.name}' went offline while running this batch; it was re-placed if retry-safe"
            for att in sorted([a for a in self.attempts.values() if a.device_id == device_id], key=_steps_first):
                if att.kind == "agent":
                    llm_work.stop_agent(cast("Engine", self), att, ErrorCode.DEVICE_LOST, lost, now, "device_lost")
                    continue
                if att.batch_id not in self.attempts:
                    continue
                self._end_attempt(
                    att,
                    AttemptOutcome(
                        succeeded=False,
                        error_code=ErrorCode.DEVICE_LOST,
                        error_message=f"device '{dev.name}' went offline while running this batch; "
                        "it was re-placed if retry-safe",
                        started=att.sent,
                        tool_hints=tuple(dev.hints(c["tool"]) for c in att.commands),
                    ),
                    now,
                )
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
        old_admin = dev.admin
        dev.admin = AdminState(row.admin_state)
        dev.labels = dict(row.labels or {})
        dev.name = row.name
        if dev.admin is not AdminState.ACTIVE and old_admin is AdminState.ACTIVE:
            self._unqueue_all(dev, now)
        if dev.admin is AdminState.REVOKED:
            links = self.links
            if links is not None:
                self._effects.append(lambda: links.close(device_id, CloseCode.UNAUTHORIZED, "device token revoked"))
            self._on_liveness(device_id, Liveness.OFFLINE, now)
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
            if att is not None and att.device_id == device_id and not att.accepted:
                att.accepted = True
                # Informational only (retry safety never depends on it), so it rides along with
                # the next commit instead of costing one of its own on the hot path.
                self._soft.update(Attempt, (att.batch_id,), status="accepted", accepted_at=utc(now))
                if self._soft_since is None:
                    self._soft_since = now
                    self._timer(now + SOFT_FLUSH_S, "wake", None)
        elif isinstance(msg, ToolsChanged):
            dev.tools = {t.name: t.model_dump() for t in msg.tools}
            self._capable_cache.clear()
            self._changes.update(Device, (dev.id,), tools=list(dev.tools.values()))
