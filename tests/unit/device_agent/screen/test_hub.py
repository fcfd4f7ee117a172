"""The hub: what an agent announces, and the views it refuses before any capture."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from device_agent.config import AgentConfig
from device_agent.runner import check
from device_agent.screen.assembly import NO_FFMPEG
from device_agent.screen.hub import ScreenHub
from protocol.messages import Message, View, ViewEnded
from tests.unit.device_agent.screen.screens import DrawnScreen


def refusal(hub: ScreenHub, sent: list[Message]) -> ViewEnded:
    asyncio.run(hub.on_message(View(stream_id="v1")))
    (ended,) = sent
    assert isinstance(ended, ViewEnded)
    return ended


def test_a_device_without_a_screen_announces_nothing_and_answers_no_screen() -> None:
    sent: list[Message] = []

    async def send(m: Message) -> None:
        sent.append(m)

    hub = ScreenHub(send)
    assert hub.features() == []
    assert refusal(hub, sent).code == "no_screen"


def test_a_screen_is_announced_and_an_owner_who_forbids_watching_gets_views_refused() -> None:
    sent: list[Message] = []

    async def send(m: Message) -> None:
        sent.append(m)

    hub = ScreenHub(send, DrawnScreen(), allow_watching=False)
    assert hub.features() == ["view"]  # no recorder: no "record"
    assert refusal(hub, sent).code == "watch_disallowed"


def test_check_says_recordings_are_off_on_a_device_without_ffmpeg(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no ffmpeg on it
    config = AgentConfig(data_dir=tmp_path / "agent", toolsets=["system", "browser"], browser={"command": ["true"]})  # type: ignore[arg-type]
    report = asyncio.run(check(config))
    assert report["recording"] == {"ready": False, "reason": NO_FFMPEG}
