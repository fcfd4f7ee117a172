"""Recordings: kept ones become a WebM within the size cap and are uploaded, the rest leave nothing."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from device_agent.screen.frames import Frame
from device_agent.screen.recorder import STALE_S, Recorder
from protocol.messages import Command, CommandBatch, RecordingEnd
from tests.unit.device_agent.screen.screens import DrawnScreen

FFMPEG = shutil.which("ffmpeg")
pytestmark = pytest.mark.skipif(FFMPEG is None, reason="recordings need ffmpeg (apt-get install ffmpeg)")


class Uploads:
    """What the recorder uploaded: (batch, name, size, the video's frame count by ffprobe)."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str, int, int]] = []

    async def __call__(self, batch_id: str, path: Path, name: str) -> None:
        self.made.append(await asyncio.to_thread(described, batch_id, path, name))


def described(batch_id: str, path: Path, name: str) -> tuple[str, str, int, int]:
    return batch_id, name, path.stat().st_size, frames_of(path)


def frames_of(path: Path) -> int:
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=nb_read_frames,codec_name", "-of", "default=nw=1", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    fields = dict(line.split("=", 1) for line in probe.stdout.split())
    assert fields["codec_name"] == "vp8"
    return int(fields["nb_read_frames"])


def batch(batch_id: str, attempt: int = 1, record: str = "failures") -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id,
        task_id="t1",
        node_id="n1",
        attempt=attempt,
        fence=1,
        commands=[Command(call_id="c1", tool="gui.observe")],
        record=record,  # type: ignore[arg-type]
    )


def end(keep: bool, attempt: int = 1) -> RecordingEnd:
    return RecordingEnd(task_id="t1", node_id="n1", attempt=attempt, keep=keep)


async def record(recorder: Recorder, screen: DrawnScreen, b: CommandBatch, frames: int) -> None:
    """Run a 'batch' until the screen was captured `frames` more times (bounded)."""
    target = screen.grabs + frames
    async with asyncio.timeout(10), recorder.recording(b):
        recorder.action("gui.click", (100, 100))
        while screen.grabs < target:
            await asyncio.sleep(0.01)


def test_a_kept_recording_is_one_webm_of_every_batch_of_the_attempt_uploaded_then_deleted(tmp_path: Path) -> None:
    assert FFMPEG is not None
    screen, uploads = DrawnScreen(), Uploads()
    recorder = Recorder(screen, tmp_path / "rec", FFMPEG, uploads, fps=20)

    async def attempt() -> Path | None:
        await record(recorder, screen, batch("b1"), 4)
        await record(recorder, screen, batch("b2"), 4)  # a later step of the same attempt appends
        return await recorder.end(end(keep=True))

    assert asyncio.run(attempt()) is not None
    ((batch_id, name, size, frames),) = uploads.made
    assert (batch_id, name) == ("b2", "recording-n1-1.webm")
    assert 0 < size <= recorder.max_bytes
    assert frames > 4  # frames of both batches (the last grab of each may be cut short)
    assert list((tmp_path / "rec").iterdir()) == []


def test_a_discarded_recording_leaves_nothing_and_uploads_nothing(tmp_path: Path) -> None:
    assert FFMPEG is not None
    screen, uploads = DrawnScreen(), Uploads()
    recorder = Recorder(screen, tmp_path / "rec", FFMPEG, uploads, fps=20)

    async def attempt() -> Path | None:
        await record(recorder, screen, batch("b1"), 3)
        return await recorder.end(end(keep=False))

    assert asyncio.run(attempt()) is None
    assert uploads.made == []
    assert list((tmp_path / "rec").iterdir()) == []


def test_a_recording_over_the_size_cap_is_made_smaller_and_never_exceeds_it(tmp_path: Path) -> None:
    assert FFMPEG is not None
    screen, uploads = DrawnScreen(320, 200, noise=True), Uploads()
    recorder = Recorder(screen, tmp_path / "rec", FFMPEG, uploads, fps=20, max_bytes=100_000)

    async def attempt() -> None:
        await record(recorder, screen, batch("b1"), 8)  # ~8 x 50 kB of frames that do not compress
        await recorder.end(end(keep=True))

    asyncio.run(attempt())
    assert all(size <= 100_000 for _, _, size, _ in uploads.made)
    assert list((tmp_path / "rec").iterdir()) == []


def test_a_recording_nobody_ended_within_an_hour_is_deleted(tmp_path: Path) -> None:
    assert FFMPEG is not None
    screen = DrawnScreen()
    recorder = Recorder(screen, tmp_path / "rec", FFMPEG, Uploads(), fps=20)
    asyncio.run(record(recorder, screen, batch("b1"), 2))
    folder = tmp_path / "rec" / "t1.n1.1"
    old = folder.stat().st_mtime - STALE_S - 1
    os.utime(folder, (old, old))
    assert recorder.sweep() == ["t1.n1.1"]
    assert not folder.exists()


def test_an_attempts_many_short_batches_keep_to_the_recording_rate(tmp_path: Path) -> None:
    assert FFMPEG is not None
    screen = DrawnScreen()
    recorder = Recorder(screen, tmp_path / "rec", FFMPEG, Uploads(), fps=2)

    async def steps() -> float:
        started = asyncio.get_running_loop().time()
        for n in range(20):  # twenty quick steps of one attempt, well under a second in all
            async with recorder.recording(batch(f"b{n}")):
                await asyncio.sleep(0.01)
        return asyncio.get_running_loop().time() - started

    elapsed = asyncio.run(steps())
    # A frame when the first step starts, then one each half second: not one per step.
    assert screen.grabs <= 1 + int(elapsed * 2) + 1


class SlowScreen(DrawnScreen):
    """A screen whose capture takes longer than the batch being recorded."""

    async def grab(self, max_side: int, quality: int, marks: bool = False) -> Frame:
        await asyncio.sleep(0.2)
        return await super().grab(max_side, quality, marks)


def test_a_batch_shorter_than_a_frame_still_leaves_the_screen_it_ended_on(tmp_path: Path) -> None:
    """A command refused at once ends its batch before the first frame is in: the recording still
    gets one frame (the screen as the failure left it), and a kept one uploads a video of it."""
    assert FFMPEG is not None
    uploads = Uploads()
    recorder = Recorder(SlowScreen(), tmp_path / "rec", FFMPEG, uploads, fps=2)

    async def run() -> int:
        async with recorder.recording(batch("b1")):
            pass  # the batch ends at once
        taken = len(list((tmp_path / "rec" / "t1.n1.1").glob("frame-*.jpg")))
        await recorder.end(end(keep=True))
        return taken

    assert asyncio.run(run()) == 1
    ((batch_id, name, _, frames),) = uploads.made
    assert (batch_id, name) == ("b1", "recording-n1-1.webm") and frames >= 1
