"""The live view and recordings on a real X display (Xvfb) with the instrumented Tk app.

The hub, the X11 source, the recorder and ffmpeg are the agent's own; only the server's side is
played by the test (what the hub sends lands in a queue). The Tk app's state file is the ground
truth of what a forwarded click did.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
from pathlib import Path

import pytest

from device_agent.screen.hub import ScreenHub
from device_agent.screen.inputs import Inputs
from device_agent.screen.recorder import Recorder
from device_agent.screen.source import X11Source, ffmpeg_path
from device_agent.takeover import Takeover
from protocol.messages import Command, CommandBatch, Message, RecordingEnd, View, ViewFrame, ViewInput, ViewInputResult
from tests.gui.conftest import TkApp


class Server:
    """The server's end of the hub: every frame the hub sends, in order."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[Message] = asyncio.Queue()

    async def __call__(self, message: Message) -> None:
        await self.frames.put(message)

    async def next(self, kind: type[Message], timeout: float = 10) -> Message:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.frames.get()
                if isinstance(frame, kind):
                    return frame


def hub_on(display: str, takeover: Takeover) -> tuple[ScreenHub, Server]:
    server = Server()
    source = X11Source(display)
    hub = ScreenHub(server, source)
    hub.inputs = Inputs(source, lambda: hub.screen, lambda: takeover, lambda: False)
    return hub, server


def test_frames_follow_the_screen_when_the_app_changes(xvfb: str, tk_app: TkApp) -> None:
    async def watch() -> tuple[ViewFrame, ViewFrame]:
        hub, server = hub_on(xvfb, Takeover())
        try:
            await hub.on_message(View(stream_id="v1", fps=10, max_side=640))
            first = await server.next(ViewFrame)
            assert isinstance(first, ViewFrame)
            # A person at the device types into the entry: the next frames show it.
            typing = ["xdotool", "type", "hello there"]
            await asyncio.to_thread(subprocess.run, typing, env={**os.environ, "DISPLAY": xvfb}, check=True)
            await asyncio.to_thread(tk_app.wait_for, lambda s: s["entry"] == "hello there", "the typed text")
            while True:
                later = await server.next(ViewFrame)
                assert isinstance(later, ViewFrame)
                if later.image_b64 != first.image_b64:
                    return first, later
        finally:
            await hub.close()

    first, later = asyncio.run(watch())
    assert (first.width, first.height, first.screen_width, first.screen_height) == (640, 400, 1280, 800)
    assert later.n > first.n
    assert base64.b64decode(later.image_b64)[:2] == b"\xff\xd8"  # a JPEG


def test_a_click_through_the_live_view_reaches_the_app_only_while_taken_over(xvfb: str, tk_app: TkApp) -> None:
    x, y, w, h = tk_app.state()["widgets"]["button"]
    # The button's centre in the pixels of a half-size frame.
    at = {"x": (x + w // 2) // 2, "y": (y + h // 2) // 2, "frame_width": 640, "frame_height": 400}
    takeover = Takeover()

    async def click(input_id: str) -> ViewInputResult:
        hub, server = hub_on(xvfb, takeover)
        try:
            await hub.on_message(ViewInput(input_id=input_id, kind="click", by="alice", **at))  # type: ignore[arg-type]
            result = await server.next(ViewInputResult)
            assert isinstance(result, ViewInputResult)
            return result
        finally:
            await hub.close()

    refused = asyncio.run(click("i1"))
    assert (refused.ok, refused.code) == (False, "not_taken_over")
    assert tk_app.state()["clicks"] == 0  # refused before any input was sent
    takeover.operator, takeover.operator_by = True, "alice"
    taken = asyncio.run(click("i2"))
    assert taken.ok
    tk_app.wait_for(lambda s: s["clicks"] == 1, "the forwarded click to press the button")


needs_ffmpeg = pytest.mark.skipif(ffmpeg_path() is None, reason="recordings need ffmpeg (apt-get install ffmpeg)")


def batch(batch_id: str) -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id,
        task_id="t1",
        node_id="n1",
        attempt=1,
        fence=1,
        commands=[Command(call_id="c1", tool="gui.click", arguments={"x": 100, "y": 60})],
        record="failures",
    )


async def record_while_typing(recorder: Recorder, display: str, tk_app: TkApp, text: str) -> None:
    """A 'batch' that types into the app while the recorder runs, long enough for several frames."""
    frames = recorder.root / "t1.n1.1"
    async with recorder.recording(batch("b1")):
        recorder.action("gui.click", (100, 60))
        await asyncio.to_thread(
            subprocess.run,
            ["xdotool", "type", "--delay", "30", text],
            env={**os.environ, "DISPLAY": display},
            check=True,
        )
        async with asyncio.timeout(10):
            while len(list(frames.glob("frame-*.jpg"))) < 4:
                await asyncio.sleep(0.05)
    tk_app.wait_for(lambda s: s["entry"].endswith(text), "the typed text")


def ffprobe_frames(path: Path) -> tuple[str, int]:
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,codec_name:format=format_name", "-of", "default=nw=1", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    fields = dict(line.split("=", 1) for line in probe.stdout.split())
    return fields["format_name"], int(fields["nb_read_frames"])


@needs_ffmpeg
def test_a_kept_recording_is_a_webm_that_ffprobe_reads_with_more_than_one_frame(
    xvfb: str, tk_app: TkApp, tmp_path: Path
) -> None:
    ffmpeg = ffmpeg_path()
    assert ffmpeg is not None
    probed: list[tuple[str, str, int]] = []

    async def upload(batch_id: str, path: Path, name: str) -> None:
        kind, frames = await asyncio.to_thread(ffprobe_frames, path)
        probed.append((name, kind, frames))

    async def attempt() -> None:
        recorder = Recorder(X11Source(xvfb), tmp_path / "rec", ffmpeg, upload, fps=8)
        await record_while_typing(recorder, xvfb, tk_app, "recorded")
        await recorder.end(RecordingEnd(task_id="t1", node_id="n1", attempt=1, keep=True))

    asyncio.run(attempt())
    ((name, kind, frames),) = probed
    assert name == "recording-n1-1.webm"
    assert "webm" in kind
    assert frames > 1
    assert list((tmp_path / "rec").iterdir()) == []


@needs_ffmpeg
def test_a_discarded_recording_leaves_no_file(xvfb: str, tk_app: TkApp, tmp_path: Path) -> None:
    ffmpeg = ffmpeg_path()
    assert ffmpeg is not None
    uploaded: list[str] = []

    async def upload(batch_id: str, path: Path, name: str) -> None:
        uploaded.append(name)

    async def attempt() -> None:
        recorder = Recorder(X11Source(xvfb), tmp_path / "rec", ffmpeg, upload, fps=8)
        await record_while_typing(recorder, xvfb, tk_app, "forgotten")
        assert list((tmp_path / "rec").rglob("frame-*.jpg"))  # it did record
        await recorder.end(RecordingEnd(task_id="t1", node_id="n1", attempt=1, keep=False))

    asyncio.run(attempt())
    assert uploaded == []
    assert list((tmp_path / "rec").rglob("*")) == []
