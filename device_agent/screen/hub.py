"""The agent's one handle on the screen beyond the model's tools (see the package's docstring).

The agent hands it the live view's frames (`on_message`), wraps each batch in `recording`, names
each command as it starts (`action`), and announces its `features` in the hello. Everything slow
(capture, input, encoding, uploads) runs in tasks of its own, never in the agent's read loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from device_agent.screen.frames import Frame, Mark
from device_agent.screen.inputs import Inputs
from device_agent.screen.leases import Change, Leases, Stream
from device_agent.screen.recorder import Recorder
from device_agent.screen.source import ScreenSource, SourceFailed
from device_agent.takeover import Takeover
from device_agent.toolsets.base import ToolsetContext
from protocol.messages import (
    FEATURE_RECORD,
    FEATURE_VIEW,
    MAX_VIEW_IMAGE_B64,
    Command,
    CommandBatch,
    Message,
    RecordingEnd,
    View,
    ViewEnded,
    ViewFrame,
    ViewInput,
    ViewMark,
)

log = logging.getLogger("orrery.agent.screen")

Send = Callable[[Message], Awaitable[None]]
POINTER_TOOLS = frozenset({"click", "double_click", "scroll", "drag", "browser_mouse_click_xy"})


class ScreenHub:
    def __init__(
        self,
        send: Send,
        source: ScreenSource | None = None,
        inputs: Inputs | None = None,
        recorder: Recorder | None = None,
        allow_watching: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.send = send
        self.source = source
        self.inputs = inputs or Inputs(source, lambda: None, Takeover, lambda: False, allowed=False)
        self.recorder = recorder
        self.allow_watching = allow_watching
        self.clock = clock
        self.leases = Leases()
        self.screen: tuple[int, int] | None = None  # the screen's size, as the last frame found it
        self.frames_sent = 0
        self._wake = asyncio.Event()
        self._input_order = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    def features(self) -> list[str]:
        """What to announce in the hello (`protocol.messages.FEATURES`)."""
        if self.source is None:
            return []
        return [FEATURE_VIEW, *([FEATURE_RECORD] if self.recorder is not None else [])]

    async def on_message(self, msg: View | ViewInput | RecordingEnd) -> None:
        """A live view frame from the server; returns at once (the work goes on in tasks)."""
        if isinstance(msg, View):
            await self._on_view(msg)
        elif isinstance(msg, ViewInput):
            self._spawn(self._on_input(msg), f"view-input-{msg.input_id}")
        else:
            self._spawn(self._on_recording_end(msg), f"recording-end-{msg.node_id}")

    # ---------------------------------------------------------------- the live view

    async def _on_view(self, msg: View) -> None:
        if msg.on and self.source is None:
            await self.send(ViewEnded(stream_id=msg.stream_id, code="no_screen", message="this device has no screen"))
            return
        if msg.on and not self.allow_watching:
            await self.send(
                ViewEnded(
                    stream_id=msg.stream_id,
                    code="watch_disallowed",
                    message="the device's owner does not allow watching its screen",
                )
            )
            return
        change = self.leases.view(msg, self.clock())
        if change is Change.ENDED:
            await self.send(ViewEnded(stream_id=msg.stream_id, code="ended"))
        if change is Change.STARTED and (self._pump is None or self._pump.done()):
            self._pump = asyncio.create_task(self._streaming(), name="view-stream")
        self._wake.set()

    async def _streaming(self) -> None:
        """`_stream`, and if it fails, every stream ends with `error` rather than silently."""
        try:
            await self._stream()
        except Exception as exc:
            log.exception("live view failed; its streams end")
            for stream_id in self.leases.end_all():
                await self.send(
                    ViewEnded(stream_id=stream_id, code="error", message=f"{type(exc).__name__}: {exc}"[:2000])
                )

    async def _stream(self) -> None:
        """Send each stream its frames while any is on: one capture serves every stream of one shape."""
        while self.leases:
            now = self.clock()
            for stream_id in self.leases.expire(now):
                await self.send(ViewEnded(stream_id=stream_id, code="lease_expired", message="no renewal came"))
            due = self.leases.due(now)
            shots: dict[tuple[int, int, bool], Frame | None] = {}
            for stream in due:
                if stream.shape not in shots:
                    shots[stream.shape] = await self._grab(stream)
                frame = shots[stream.shape]
                if frame is not None and stream.stream_id in self.leases.streams:
                    await self._send_frame(stream, frame)
            wait = self.leases.next_wake(self.clock())
            if wait is None:
                break
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()

    async def _grab(self, stream: Stream) -> Frame | None:
        assert self.source is not None
        try:
            frame = await self.source.grab(stream.max_side, stream.quality, stream.marks)
        except SourceFailed as exc:
            log.warning("live view: no frame (%s)", exc)
            return None
        self.screen = (frame.screen_width, frame.screen_height)
        return frame

    async def _send_frame(self, stream: Stream, frame: Frame) -> None:
        import base64

        image = base64.b64encode(frame.image).decode()
        if len(image) > MAX_VIEW_IMAGE_B64:  # a huge screen at high quality: skip it, say why
            log.warning("live view: a %d-byte frame is over the frame cap; lower max_side or quality", len(image))
            self.leases.sent(stream, self.clock())
            return
        n = self.leases.sent(stream, self.clock())
        await self.send(
            ViewFrame(
                stream_id=stream.stream_id,
                n=n,
                source=frame.source,
                mime=frame.mime,
                image_b64=image,
                width=frame.width,
                height=frame.height,
                screen_width=frame.screen_width,
                screen_height=frame.screen_height,
                marks=[ViewMark(id=m.id, name=m.name[:200], x=m.x, y=m.y, w=m.w, h=m.h) for m in frame.marks],
            )
        )
        self.frames_sent += 1

    # ---------------------------------------------------------------- input and recordings

    async def _on_input(self, msg: ViewInput) -> None:
        # One at a time, in the order they came (a click into a field, then the text typed there):
        # the lock is the task's first wait, and asyncio's locks are first come, first served.
        async with self._input_order:
            await self._input(msg)

    async def _input(self, msg: ViewInput) -> None:
        if self.screen is None and self.source is not None:  # nobody watched since the agent started
            with contextlib.suppress(SourceFailed):
                frame = await self.source.grab(64, 10)
                self.screen = (frame.screen_width, frame.screen_height)
        await self.send(await self.inputs.take(msg))

    @contextlib.asynccontextmanager
    async def recording(self, batch: CommandBatch) -> AsyncIterator[None]:
        """Record the screen while the body (the batch) runs, if the batch asks and this device can."""
        if batch.record == "off" or self.recorder is None:
            yield
            return
        async with self.recorder.recording(batch):
            yield

    def action(self, cmd: Command) -> None:
        """A command starts: what a recording draws on its frames (the tool, and the point of a
        pointer action, which the gui and browser tools give in screenshot pixels)."""
        if self.recorder is None:
            return
        tool = cmd.tool.partition(".")[2]
        x, y = cmd.arguments.get("x"), cmd.arguments.get("y")
        point = (x, y) if tool in POINTER_TOOLS and isinstance(x, int) and isinstance(y, int) else None
        self.recorder.action(cmd.tool, point)

    async def _on_recording_end(self, msg: RecordingEnd) -> None:
        if self.recorder is None:
            return
        try:
            await self.recorder.end(msg)
        except Exception as exc:  # the encoder or the upload failed: the frames are gone either way
            log.warning("recording of %s attempt %d not kept: %s", msg.node_id, msg.attempt, exc)

    def _spawn(self, work: Awaitable[None], name: str) -> None:
        async def run() -> None:
            await work

        task = asyncio.create_task(run(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """The agent stops: streams end (unannounced: the connection goes too), tasks are cancelled."""
        self.leases.end_all()
        for task in [*self._tasks, *([self._pump] if self._pump else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.source is not None:
            await self.source.close()


def marks_from(ctx: ToolsetContext) -> Callable[[], list[Mark]]:
    """The gui toolset's observation marks (`ToolsetContext.screen_marks`, read at each frame:
    the toolset sets it when it is built) as `Mark`s."""
    return lambda: [Mark(i, name, *bounds) for i, name, bounds in ctx.screen_marks()]


def recordings_dir(data_dir: Path) -> Path:
    return data_dir / "recordings"
