"""Build the agent's `ScreenHub` from its settings: which screen, whether it records, who may act."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from device_agent import artifacts
from device_agent.config import AgentConfig, browser_output_dir
from device_agent.router import Router
from device_agent.screen.hub import ScreenHub, Send, marks_from, recordings_dir
from device_agent.screen.inputs import Inputs
from device_agent.screen.recorder import Recorder
from device_agent.screen.source import ScreenSource, X11Source, ffmpeg_path
from device_agent.takeover import Takeover
from device_agent.toolsets.base import ToolsetContext
from device_agent.transfer import Connection

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("orrery.agent.screen")

UPLOAD_DEADLINE_S = 600.0
NO_FFMPEG = "screen recordings are off: ffmpeg was not found (apt-get install ffmpeg)"


def has_screen(config: AgentConfig) -> bool:
    """Whether `screen_source` finds a screen (without starting anything)."""
    return ("gui" in config.builtin_toolsets() and bool(os.environ.get("DISPLAY"))) or "browser" in config.toolsets


def screen_source(config: AgentConfig, ctx: ToolsetContext, router: Router) -> ScreenSource | None:
    """The X display of the gui toolset, else the browser profile's page, else None."""
    if "gui" in config.builtin_toolsets():
        source = X11Source.find(marks_from(ctx))
        if source is not None:
            return source
    if "browser" in config.toolsets:
        from device_agent.screen.browser import BrowserSource

        return BrowserSource(router, browser_output_dir(config.resolved_data_dir))
    return None


def recording_problem(config: AgentConfig, has_screen: bool) -> str | None:
    """Why this agent cannot record (`orrery agent --check` reports it), or None."""
    if not config.recording.enabled:
        return "recordings are turned off ([agent.recording] enabled = false)"
    if not has_screen:
        return "no screen to record (the gui toolset with a DISPLAY, or the browser profile)"
    if ffmpeg_path() is None:
        return NO_FFMPEG
    return None


def build_hub(
    config: AgentConfig,
    ctx: ToolsetContext,
    router: Router,
    send: Send,
    takeover: Callable[[], Takeover],
) -> ScreenHub:
    source = screen_source(config, ctx, router)
    recorder = None
    problem = recording_problem(config, source is not None)
    ffmpeg = ffmpeg_path()
    if source is not None and ffmpeg is not None and problem is None:
        link = config.artifact_link()

        async def upload(batch_id: str, path: Path, name: str) -> None:
            async with Connection(link, time.monotonic() + UPLOAD_DEADLINE_S) as conn:
                await artifacts.publish(conn, batch_id, path, name)

        recorder = Recorder(
            source,
            recordings_dir(config.resolved_data_dir),
            ffmpeg,
            upload,
            config.recording.fps,
            config.recording.max_bytes,
        )
    elif source is not None and config.recording.enabled:
        log.warning("%s", problem)
    hub = ScreenHub(send, source, allow_watching=config.view.allow_watching, recorder=recorder)
    hub.inputs = Inputs(
        source,
        lambda: hub.screen,
        takeover,
        lambda: router.stop_latch.stopped,
        allowed=config.view.allow_input,
        audit=router.audit,
    )
    return hub
