"""Screen recordings of attempts: frames while a batch that asks for it runs, a video at the end.

One recording per attempt (task, node, attempt): an agent node's attempt runs many step batches
with one key, and each appends to the same recording. Frames are JPEGs at a low rate in a
directory of their own under the data dir, each with the action running then drawn on it (the
tool's name, and a ring at the point of a pointer action). The server's `recording_end` decides:
keep -> one WebM (VP8, which browsers play) encoded by ffmpeg, never larger than `max_bytes`
(fewer frames a second and a lower bitrate until it fits), uploaded as the attempt's artifact,
then the frames go; discard -> the frames go. The directory is the state: an agent restarted
between batches goes on appending, and a `recording_end` after a restart still finds its frames.
A recording nobody ended within `STALE_S` is deleted, so the disk stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from device_agent.screen.frames import overlay, to_frame
from device_agent.screen.source import ScreenSource, SourceFailed
from protocol.messages import CommandBatch, RecordingEnd

log = logging.getLogger("orrery.agent.screen")

STALE_S = 3600.0  # a recording with no `recording_end` this long after its last frame is deleted
SWEEP_EVERY_S = 60.0  # stale recordings are looked for at most this often (as batches start)
MAX_SIDE = 1024
QUALITY = 60
DISK_FACTOR = 10  # the frames of one recording take at most this many times `max_bytes` on disk
ENCODE_TRIES = 5
BATCH_FILE = "batch"  # the id of the attempt's newest batch

Upload = Callable[[str, Path, str], Awaitable[None]]


@dataclass(frozen=True)
class Key:
    task_id: str
    node_id: str
    attempt: int

    @property
    def dir_name(self) -> str:
        return f"{self.task_id}.{self.node_id}.{self.attempt}"

    @property
    def artifact_name(self) -> str:
        return f"recording-{self.node_id}-{self.attempt}.webm"


class Recorder:
    def __init__(
        self,
        source: ScreenSource,
        root: Path,
        ffmpeg: str,
        upload: Upload,
        fps: float = 2.0,
        max_bytes: int = 20_000_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.root = root
        self.ffmpeg = ffmpeg
        self.upload = upload
        self.fps = fps
        self.max_bytes = max_bytes
        self.clock = clock  # wall time: compared with the directories' mtimes across restarts
        self._caption = ""
        self._point: tuple[int, int] | None = None  # screen pixels
        # When each recording's next frame is due (monotonic): an attempt's many short step
        # batches keep to `fps` across them, not a frame at the start of each.
        self._next_at: dict[str, float] = {}
        self._taken: dict[str, int] = {}  # frames taken per recording, by this process
        self._swept_at: float | None = None

    def action(self, tool: str, point: tuple[int, int] | None) -> None:
        """The action running now, drawn on the frames until the next one."""
        self._caption, self._point = tool, point

    @contextlib.asynccontextmanager
    async def recording(self, batch: CommandBatch) -> AsyncIterator[None]:
        """Record the screen while the body runs (the batch's commands)."""
        key = Key(batch.task_id, batch.node_id, batch.attempt)
        folder = self.root / key.dir_name
        await anyio.to_thread.run_sync(self._open, folder, batch.batch_id)
        self.action("", None)
        before = self._taken.get(folder.name, 0)
        task = asyncio.create_task(self._capture(folder), name=f"recording-{key.dir_name}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            held = len(await anyio.to_thread.run_sync(frames_in, folder))
            due = time.monotonic() >= self._next_at.get(folder.name, 0.0)
            if self._taken.get(folder.name, 0) == before and (held == 0 or due):
                # A recording whose batch was shorter than a frame's time (a command refused at
                # once) still gets a frame: the screen as it ended, often what explains a failure.
                with contextlib.suppress(SourceFailed, OSError):
                    await self._keep_frame(folder, held + 1)
                    self._next_at[folder.name] = time.monotonic() + 1 / self.fps
            self.action("", None)

    def _open(self, folder: Path, batch_id: str) -> None:
        if self._swept_at is None or time.monotonic() - self._swept_at >= SWEEP_EVERY_S:
            self._swept_at = time.monotonic()
            self.sweep()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        (folder / BATCH_FILE).write_text(batch_id)  # the newest batch of the attempt uploads it

    async def _capture(self, folder: Path) -> None:
        interval = 1 / self.fps
        held = await anyio.to_thread.run_sync(frames_in, folder)
        n, used = len(held), sum(size for _, size in held)
        full = False
        while True:
            wait = self._next_at.get(folder.name, 0.0) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._next_at[folder.name] = time.monotonic() + interval
            if used < DISK_FACTOR * self.max_bytes:
                try:
                    used += await self._keep_frame(folder, n + 1)
                except SourceFailed as exc:
                    log.debug("a recording frame was not taken: %s", exc)
                else:
                    n += 1
            elif not full:
                full = True
                log.warning("recording %s reached its disk cap; no more frames are kept", folder.name)

    async def _keep_frame(self, folder: Path, n: int) -> int:
        """Take frame number `n` of the recording in `folder`; its size."""
        data = await self._frame()
        await anyio.to_thread.run_sync((folder / f"frame-{n:06d}.jpg").write_bytes, data)
        self._taken[folder.name] = self._taken.get(folder.name, 0) + 1
        return len(data)

    async def _frame(self) -> bytes:
        frame = await self.source.grab(MAX_SIDE, QUALITY)
        caption, point = self._caption, self._point
        if not caption and point is None:
            return frame.image
        at = to_frame(*point, (frame.width, frame.height), (frame.screen_width, frame.screen_height)) if point else None
        return await anyio.to_thread.run_sync(overlay, frame.image, caption, at, QUALITY)

    async def end(self, msg: RecordingEnd) -> Path | None:
        """Finish the attempt's recording: encode and upload it (`keep`), or delete it. The video's
        path if one was uploaded (deleted by then)."""
        key = Key(msg.task_id, msg.node_id, msg.attempt)
        folder = self.root / key.dir_name
        self._next_at.pop(key.dir_name, None)
        self._taken.pop(key.dir_name, None)
        if not folder.is_dir():
            return None
        try:
            if not msg.keep:
                return None
            video = await self.encode(folder, key)
            if video is None:
                return None
            batch_id = (folder / BATCH_FILE).read_text().strip()
            await self.upload(batch_id, video, key.artifact_name)
            log.info("recording %s uploaded (%d bytes)", key.artifact_name, video.stat().st_size)
            return video
        finally:
            await anyio.to_thread.run_sync(shutil.rmtree, folder, True)

    async def encode(self, folder: Path, key: Key) -> Path | None:
        """A WebM of the folder's frames no larger than `max_bytes`, or None (no frames, or it
        could not be made to fit)."""
        frames = [path for path, _ in await anyio.to_thread.run_sync(frames_in, folder)]
        if not frames:
            return None
        out = folder / key.artifact_name
        seconds = len(frames) / self.fps
        bitrate = min(2_000_000, int(self.max_bytes * 8 * 0.8 / max(seconds, 1.0)))
        step = 1
        for _ in range(ENCODE_TRIES):
            kept = frames[::step]
            await self._ffmpeg(folder, kept, self.fps / step, bitrate, out)
            size = out.stat().st_size
            if size <= self.max_bytes:
                return out
            log.info("recording %s was %d bytes, over %d: encoding it smaller", out.name, size, self.max_bytes)
            bitrate //= 2
            step *= 2
        out.unlink()
        log.warning("recording %s cannot fit in %d bytes: not uploaded", key.artifact_name, self.max_bytes)
        return None

    async def _ffmpeg(self, folder: Path, frames: list[Path], fps: float, bitrate: int, out: Path) -> None:
        listing = folder / "frames.txt"
        # The concat demuxer takes a list of files, each shown 1/fps s (frames dropped to fit leave gaps).
        lines = [f"file '{p.name}'\nduration {1 / fps:.6f}\n" for p in frames] + [f"file '{frames[-1].name}'\n"]
        listing.write_text("".join(lines))
        argv = [
            self.ffmpeg,
            *("-nostdin", "-y", "-loglevel", "error", "-f", "concat", "-safe", "0", "-i", str(listing)),
            *("-vf", "scale=trunc(iw/2)*2:trunc(ih/2)*2,format=yuv420p", "-r", f"{max(fps, 0.1):g}"),
            *("-c:v", "libvpx", "-b:v", str(max(bitrate, 20_000)), "-deadline", "realtime", "-cpu-used", "8"),
            *("-an", str(out)),
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        _, err = await proc.communicate()
        if proc.returncode != 0:
            raise SourceFailed(f"ffmpeg exited with {proc.returncode}: {err.decode(errors='replace').strip()[:300]}")

    def sweep(self) -> list[str]:
        """Delete the recordings nobody ended within `STALE_S` of their last frame; their names."""
        if not self.root.is_dir():
            return []
        gone = []
        now = self.clock()
        for folder in self.root.iterdir():
            if folder.is_dir() and now - folder.stat().st_mtime > STALE_S:
                shutil.rmtree(folder, ignore_errors=True)
                self._next_at.pop(folder.name, None)
                self._taken.pop(folder.name, None)
                gone.append(folder.name)
        if gone:
            log.info("deleted %d recording(s) no recording_end came for within an hour: %s", len(gone), gone)
        return gone


def frames_in(folder: Path) -> list[tuple[Path, int]]:
    """A recording's frames in order, with their sizes (blocking)."""
    return [(p, p.stat().st_size) for p in sorted(folder.glob("frame-*.jpg"))]
