"""Live views of devices' screens on this replica: viewers, leases and forwarded input.

The gateway hands the device's view frames here (`take`): they are not the engine's business, not
stored and not numbered (seq 0; a lost frame is replaced by the next one). Per device, this replica
has at most one `Watch`: one stream of the device (its `stream_id`) shared by every viewer here.
The first viewer starts it: `View(on=True)` goes to the device, again every `lease_s / 3` while
any viewer stays (a lease: the agent stops by itself when the copies stop coming, so a viewer or
a replica that vanished never leaves a device streaming), and `View(on=False)` when the last
viewer leaves. Each viewer holds at most one frame waiting: a slow viewer skips frames, and its
memory never grows with the device's frame rate.

Frames reach devices' viewers on other replicas through a `Relay` (`orchestrator.views.relay`).
Input (`send_input`) is forwarded as `ViewInput`; the device is the arbiter of whether it is taken
over and answers with `ViewInputResult`, which is waited for here, with a bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.engine.times import utc
from orchestrator.ids import new_id
from orchestrator.views.relay import LocalRelay, Relay
from protocol.messages import FEATURE_VIEW, Message, View, ViewEnded, ViewFrame, ViewInput, ViewInputResult

log = logging.getLogger("orrery.views")

LEASE_S = 10.0
Send = Callable[[str, Message], bool]  # (device id, frame): False if it certainly cannot reach the device

OFFLINE = "device_offline"


@dataclass(frozen=True, slots=True)
class ViewOptions:
    """What a viewer asks of the stream (the watch takes the most any of its viewers asks)."""

    fps: float = 2.0
    max_side: int = 1280
    quality: int = 70
    marks: bool = False

    def merged(self, other: ViewOptions) -> ViewOptions:
        return ViewOptions(
            max(self.fps, other.fps),
            max(self.max_side, other.max_side),
            max(self.quality, other.quality),
            self.marks or other.marks,
        )


class Viewer:
    """One viewer's mailbox: the newest frame not yet taken (older ones are skipped), then the
    end of the stream, if it ended."""

    def __init__(self) -> None:
        self._frame: dict[str, Any] | None = None
        self._ended: dict[str, Any] | None = None
        self._ready = asyncio.Event()
        self.skipped = 0  # frames replaced before this viewer took them

    def offer(self, event: dict[str, Any]) -> None:
        if self._ended is not None:
            return
        if event.get("kind") == "ended":
            self._ended = event
        else:
            if self._frame is not None:
                self.skipped += 1
            self._frame = event
        self._ready.set()

    async def next(self, timeout: float) -> dict[str, Any] | None:
        """The next event (a frame, else the end), or None when nothing came within `timeout`."""
        if not self._ready.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._ready.wait()
        if self._frame is not None:
            frame, self._frame = self._frame, None
            if self._ended is None:
                self._ready.clear()
            return frame
        return self._ended


@dataclass
class Watch:
    """This replica's stream of one device, shared by its viewers here."""

    device_id: str
    stream_id: str
    options: ViewOptions
    viewers: set[Viewer] = field(default_factory=set)
    renewer: asyncio.Task[None] | None = None


class ViewHub:
    def __init__(self, lease_s: float = LEASE_S) -> None:
        self.lease_s = lease_s
        self.relay: Relay = LocalRelay()
        self._send: Send | None = None
        self.watches: dict[str, Watch] = {}
        self.inputs: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.features: dict[str, frozenset[str]] = {}  # announced in hellos on this replica

    def bind(self, send: Send, relay: Relay | None = None) -> None:
        """How frames reach devices (the cluster) and view events other replicas: the app's
        wiring calls it once, before any device connects."""
        self._send = send
        if relay is not None:
            self.relay = relay

    async def close(self) -> None:
        for watch in list(self.watches.values()):
            if watch.renewer is not None:
                watch.renewer.cancel()
        await self.relay.close()

    # ================================================================ the gateway's side

    def device_hello(self, device_id: str, features: list[str]) -> None:
        announced = frozenset(features)
        self.features[device_id] = announced
        self.relay.announce_features(device_id, announced)

    def device_gone(self, device_id: str) -> None:
        """The device's session here ended for good: its viewers, here and elsewhere, hear it."""
        event = _ended(None, OFFLINE, "the device went offline; watch again when it is back")
        self.deliver(device_id, event)
        self.relay.publish(device_id, event)

    def take(self, device_id: str, msg: ViewFrame | ViewEnded | ViewInputResult) -> None:
        """A view frame from the device's socket here: to its viewers here, else to whoever on
        another replica asked for it (a stream or an input this replica knows nothing of)."""
        event = _event(msg)
        if not self.deliver(device_id, event):
            self.relay.publish(device_id, event)

    def deliver(self, device_id: str, event: dict[str, Any]) -> bool:
        """Hand a device's view event to whoever here waits for it: True if someone did."""
        if event.get("kind") == "input_result":
            answer = self.inputs.get(str(event.get("input_id")))
            if answer is None or answer.done():
                return False
            answer.set_result(event)
            return True
        watch = self.watches.get(device_id)
        if watch is None or event.get("stream_id") not in (None, watch.stream_id):
            return False
        for viewer in list(watch.viewers):
            viewer.offer(event)
        return True

    # ================================================================ the API's side

    async def supports(self, device_id: str) -> bool:
        """Did the device's agent announce live views in its last hello (on any replica)?"""
        features = self.features.get(device_id)
        if features is None:
            features = await self.relay.features(device_id)
        return features is not None and FEATURE_VIEW in features

    @contextlib.asynccontextmanager
    async def watch(self, device_id: str, options: ViewOptions) -> AsyncIterator[Viewer]:
        """Attach a viewer to the device's stream (starting it if it is the first) for as long as
        the block runs; the stream stops when its last viewer leaves."""
        viewer = Viewer()
        watch = self.watches.get(device_id)
        if watch is None:
            watch = self.watches[device_id] = Watch(device_id, new_id("vs"), options)
        elif watch.options.merged(options) != watch.options:
            watch.options = watch.options.merged(options)
            self._view(watch, on=True)  # the stronger options now, not at the next renewal
        watch.viewers.add(viewer)
        try:
            async with self.relay.listening(device_id):
                if watch.renewer is None and self.watches.get(device_id) is watch:
                    watch.renewer = asyncio.create_task(self._renew(watch), name=f"orrery-view-lease-{device_id}")
                yield viewer
        finally:
            watch.viewers.discard(viewer)
            if not watch.viewers and self.watches.get(device_id) is watch:
                del self.watches[device_id]
                if watch.renewer is not None:
                    watch.renewer.cancel()
                self._view(watch, on=False)

    async def send_input(self, device_id: str, frame: ViewInput, timeout: float) -> dict[str, Any] | None:
        """Forward one input; the device's answer (`ok`, `code`, `message`), or None if none came
        within `timeout` (the input may or may not have been applied)."""
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.inputs[frame.input_id] = answer
        try:
            async with self.relay.listening(device_id):
                if not self._to_device(device_id, frame):
                    return None
                async with asyncio.timeout(timeout):
                    return await answer
        except TimeoutError:
            return None
        finally:
            self.inputs.pop(frame.input_id, None)

    # ================================================================ leases

    async def _renew(self, watch: Watch) -> None:
        while True:
            if not self._view(watch, on=True):
                self.deliver(watch.device_id, _ended(None, OFFLINE, "the device is not connected"))
            await asyncio.sleep(self.lease_s / 3)

    def _view(self, watch: Watch, on: bool) -> bool:
        o = watch.options
        frame = View(
            stream_id=watch.stream_id,
            on=on,
            fps=o.fps,
            max_side=o.max_side,
            quality=o.quality,
            marks=o.marks,
            lease_s=self.lease_s,
        )
        return self._to_device(watch.device_id, frame)

    def _to_device(self, device_id: str, frame: Message) -> bool:
        if self._send is None:
            raise RuntimeError("the view hub is not bound to a cluster yet (ViewHub.bind)")
        try:
            return self._send(device_id, frame)
        except Exception as exc:  # a send is a hint renewed every lease_s/3; the next one may do
            log.warning("could not send a view frame to device %s: %s", device_id, exc)
            return False


def _event(msg: ViewFrame | ViewEnded | ViewInputResult) -> dict[str, Any]:
    if isinstance(msg, ViewFrame):
        return {
            "kind": "frame",
            "stream_id": msg.stream_id,
            "n": msg.n,
            "source": msg.source,
            "mime": msg.mime,
            "image_b64": msg.image_b64,
            "width": msg.width,
            "height": msg.height,
            "screen_width": msg.screen_width,
            "screen_height": msg.screen_height,
            "marks": [m.model_dump() for m in msg.marks],
            "at": utc(time.time()).isoformat(),
        }
    if isinstance(msg, ViewEnded):
        return _ended(msg.stream_id, msg.code, msg.message)
    return {"kind": "input_result", "input_id": msg.input_id, "ok": msg.ok, "code": msg.code, "message": msg.message}


def _ended(stream_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {"kind": "ended", "stream_id": stream_id, "code": code, "message": message}
