"""T0: the gui toolset over a real MCP client on a fake display (device-safety note, T0 list)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import ImageContent

from device_agent.audit import AuditLog
from device_agent.policy import Policy
from device_agent.router import Router
from device_agent.toolset_host import ToolsetHost
from device_agent.toolsets.gui import build, check
from device_agent.toolsets.gui.control import Controller
from device_agent.toolsets.gui.display import DisplayLock
from device_agent.toolsets.gui.rules import Gesture, GuiError
from device_agent.toolsets.gui.screens import ScreenshotStore
from device_agent.toolsets.gui.x11 import InputFailed, Screen
from protocol.messages import Command
from tests.gui.fakes import FakeBackend, FakeClock, code, data, gui_client, make_ctx, observe


def click(oid: str, action_id: str, x: int = 10, y: int = 20, **extra: Any) -> dict[str, Any]:
    return {"observation_id": oid, "action_id": action_id, "x": x, "y": y, **extra}


async def test_observe_returns_a_png_and_the_observation(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, _, _):
        result = await client.call_tool("observe", {})
        assert not result.is_error
        image = result.content[0]
        assert isinstance(image, ImageContent) and image.mime_type == "image/png"
        obs = data(result)
        assert (obs["width"], obs["height"]) == (1280, 800)
        assert obs["focused_window"] == {"id": 0x400001, "title": "Editor"}
        shot = Path(obs["screenshot_path"])
        assert shot.parent == tmp_path / "data" / "screenshots"
        assert stat.S_IMODE(os.stat(shot).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(shot.parent).st_mode) == 0o700


async def test_annotations_make_inputs_never_blindly_retried(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, _, _):
        tools = {t.name: t.annotations for t in (await client.list_tools()).tools}
    # No `resume`: a model must not be able to lift a stop (only the device-level resume does).
    inputs = ("click", "double_click", "type", "set_value", "key", "scroll", "drag", "focus_window", "launch")
    assert set(tools) == {"observe", "windows", *inputs, "wait", "stop"}
    for name in ("observe", "wait", "windows"):
        assert tools[name] is not None and tools[name].read_only_hint and tools[name].idempotent_hint
    for name in inputs:
        ann = tools[name]
        assert ann is not None and not ann.read_only_hint and not ann.idempotent_hint
    ann = tools["stop"]
    assert ann is not None and ann.idempotent_hint and not ann.read_only_hint


async def test_an_observation_expires_after_60_s(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, clock):
        oid = await observe(client)
        clock.now += 59
        assert not (await client.call_tool("click", click(oid, "act-00001"))).is_error
        oid = await observe(client)
        clock.now += 61
        result = await client.call_tool("click", click(oid, "act-00002"))
        assert code(result) == "stale_observation"
        assert "call gui.observe and retry with the new observation_id" in data(result)["message"]
        assert len(fake.sent) == 1


async def test_an_observation_allows_one_input_and_each_input_returns_the_next(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        first = await client.call_tool("click", click(oid, "act-00001"))
        assert not first.is_error and isinstance(first.content[0], ImageContent)
        receipt = data(first)
        assert receipt["input_dispatched"] is True and receipt["retry_safe"] is False
        assert code(await client.call_tool("click", click(oid, "act-00002"))) == "stale_observation"
        nxt = receipt["observation"]["observation_id"]
        assert nxt != oid
        assert not (
            await client.call_tool("key", {"observation_id": nxt, "action_id": "act-00003", "key": "ctrl+s"})
        ).is_error
        assert [g.kind for g in fake.sent] == ["click", "key"]
        assert fake.sent[1].keys == "ctrl+s"


async def test_same_action_id_replays_and_other_arguments_conflict(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        args = {"observation_id": oid, "action_id": "type-0001", "text": "hello"}
        first = data(await client.call_tool("type", args))
        again = await client.call_tool("type", args)
        assert not again.is_error
        assert data(again) == {**first, "replayed": True}
        assert len(fake.sent) == 1  # nothing typed twice
        conflict = await client.call_tool("type", {**args, "text": "other"})
        assert code(conflict) == "id_conflict"
        assert len(fake.sent) == 1


async def test_action_limit_when_4096_live_receipts_exist(tmp_path: Path) -> None:
    fake, clock = FakeBackend(), FakeClock()
    controller = Controller(fake, ScreenshotStore(tmp_path / "shots"), DisplayLock(":9", tmp_path / "locks"), clock, 0)
    for n in range(4096):
        controller.receipts.reserve(f"fill-{n:05d}", "digest")
    observation, _ = await controller.observe()
    args = {"observation_id": observation["observation_id"], "action_id": "act-over-cap", "x": 1, "y": 1}
    with pytest.raises(GuiError) as exc:
        await controller.act("click", args, lambda o: Gesture("click", (o.point(1, 1),)))
    assert exc.value.code == "action_limit"
    assert fake.attempts == 0
    clock.now += 301  # receipts older than 5 minutes may go; the observation is stale by now too
    observation, _ = await controller.observe()
    args["observation_id"] = observation["observation_id"]
    outcome, png = await controller.act("click", args, lambda o: Gesture("click", (o.point(1, 1),)))
    assert outcome.ok and png is not None and len(controller.receipts) == 1


async def test_coordinates_are_bounds_checked_without_using_up_the_observation(tmp_path: Path) -> None:
    async with gui_client(tmp_path, FakeBackend(width=200, height=100)) as (client, fake, _):
        oid = await observe(client)
        result = await client.call_tool("click", click(oid, "act-00001", x=200, y=5))
        assert code(result) == "invalid_arguments" and "0 <= x <= 199" in data(result)["message"]
        drag = {"observation_id": oid, "action_id": "act-00002", "x": 1, "y": 1, "to_x": 5, "to_y": 100}
        assert code(await client.call_tool("drag", drag)) == "invalid_arguments"
        assert not fake.sent
        ok = await client.call_tool("click", click(oid, "act-00003", x=199, y=99))
        assert not ok.is_error
        assert fake.sent == [Gesture("click", ((199, 99),), 1)]


async def test_a_changed_focused_window_makes_the_observation_stale(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        fake.screen = Screen(1280, 800, 0x500001, "Password manager")
        result = await client.call_tool("type", {"observation_id": oid, "action_id": "act-00001", "text": "secret"})
        assert code(result) == "stale_observation"
        assert "Password manager" in data(result)["message"]
        assert not fake.sent
        # A title change alone (an unread counter) is the same window.
        oid = await observe(client)
        fake.screen = Screen(1280, 800, 0x500001, "Password manager (1)")
        assert not (await client.call_tool("click", click(oid, "act-00002"))).is_error


async def test_failed_refresh_voids_the_previous_observation(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        fake.fail_capture = True
        assert code(await client.call_tool("observe", {})) == "tool_error"
        fake.fail_capture = False
        assert code(await client.call_tool("click", click(oid, "act-00001"))) == "stale_observation"


async def test_failure_mid_input_is_uncertain_released_and_never_replayed(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        fake.fail_input = InputFailed("xdotool exited with 1")
        args = {"observation_id": oid, "action_id": "type-0001", "text": "half typed"}
        result = await client.call_tool("type", args)
        assert code(result) == "uncertain"
        assert data(result)["retry_safe"] is False
        assert fake.releases == 1
        fake.fail_input = None
        again = await client.call_tool("type", args)
        assert code(again) == "uncertain"
        assert fake.attempts == 1 and not fake.sent  # the retry touched nothing


async def test_a_concurrent_call_is_busy_not_queued(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        fake.block = anyio.Event()
        running = asyncio.create_task(client.call_tool("click", click(oid, "act-00001")))
        async with asyncio.timeout(5):
            await fake.started.wait()
        other = await client.call_tool("observe", {})
        assert code(other) == "busy"
        fake.block.set()
        assert not (await running).is_error


async def test_stop_interrupts_latches_and_resume_needs_a_new_observation(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    async with gui_client(tmp_path, ctx=ctx) as (client, fake, _):
        oid = await observe(client)
        fake.block = anyio.Event()
        running = asyncio.create_task(client.call_tool("drag", {**click(oid, "act-00001"), "to_x": 50, "to_y": 60}))
        async with asyncio.timeout(5):
            await fake.started.wait()
        stopped = data(await client.call_tool("stop", {}))
        assert stopped["stopped"] is True and stopped["interrupted_input"] is True
        assert code(await running) == "uncertain"
        assert fake.releases == 1 and not fake.sent
        fake.block = None
        oid = await observe(client)  # observing still works while stopped
        assert code(await client.call_tool("click", click(oid, "act-00002"))) == "stopped"
        assert (await client.call_tool("resume", {})).is_error  # no such tool: a model cannot lift it
        assert code(await client.call_tool("click", click(oid, "act-00003"))) == "stopped"
        ctx.stop_latch.lift()  # the device-level resume (an operator's `device_resume`)
        assert code(await client.call_tool("click", click(oid, "act-00005"))) == "stale_observation"
        oid = await observe(client)
        assert not (await client.call_tool("click", click(oid, "act-00004"))).is_error
        assert len(fake.sent) == 1


async def test_wait_observes_again_without_input(tmp_path: Path) -> None:
    async with gui_client(tmp_path) as (client, fake, _):
        oid = await observe(client)
        result = data(await client.call_tool("wait", {"observation_id": oid, "action_id": "wait-0001", "ms": 200}))
        assert result["input_dispatched"] is False and result["observation"]["observation_id"] != oid
        assert not fake.sent and fake.attempts == 0


async def test_a_second_toolset_on_the_same_display_is_busy_until_the_first_closes(tmp_path: Path) -> None:
    first = build(make_ctx(tmp_path), backend=FakeBackend(":3"), lock_dir=tmp_path / "locks")
    second = build(make_ctx(tmp_path), backend=FakeBackend(":3.0"), lock_dir=tmp_path / "locks")
    async with Client(second) as other:
        async with Client(first) as client:
            await observe(client)
            result = await other.call_tool("observe", {})
            assert code(result) == "busy"
        await observe(other)  # the first toolset's lifespan ended and gave the display up


async def test_kill_switch_refuses_input_but_not_observation(tmp_path: Path) -> None:
    async with gui_client(tmp_path, kill_switch=True) as (client, fake, _):
        oid = await observe(client)
        assert code(await client.call_tool("click", click(oid, "act-00001"))) == "policy_denied"
        assert not fake.sent


async def test_typed_text_reaches_no_log_and_no_audit_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    canary = "canary-7f3a9 s3cret 'pw'"
    caplog.set_level(logging.DEBUG)
    fake = FakeBackend()
    audit = AuditLog(tmp_path / "audit.jsonl")
    router = Router(Policy(unattended=True), audit, ["gui.*"], 256 * 1024)
    server = build(make_ctx(tmp_path), backend=fake, lock_dir=tmp_path / "locks", settle_s=0)
    router.add(ToolsetHost("gui", server))
    await router.start()
    try:
        obs = await router.call(Command(call_id="c1", tool="gui.observe"), "b1", 10)
        assert obs.status == "success", obs.error
        oid = obs.result["observation_id"]
        typed = await router.call(
            Command(
                call_id="c2",
                tool="gui.type",
                arguments={"observation_id": oid, "action_id": "t-000001", "text": canary},
            ),
            "b1",
            10,
        )
        assert typed.status == "success", typed.error
        fake.fail_input = InputFailed("boom")
        oid = typed.result["observation"]["observation_id"]
        arguments = {"observation_id": oid, "action_id": "t-000002", "text": canary}
        failed = await router.call(Command(call_id="c3", tool="gui.type", arguments=arguments), "b1", 10)
        assert failed.error is not None and failed.error.code == "uncertain"
    finally:
        await router.stop()
        audit.close()
    assert fake.sent[0].text == canary
    assert "canary" not in caplog.text
    log = (tmp_path / "audit.jsonl").read_text()
    assert "gui.type" in log and "canary" not in log


async def test_input_needs_approval_unless_unattended(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    router = Router(Policy(unattended=False), audit, ["gui.*"], 256 * 1024)
    fake = FakeBackend()
    router.add(ToolsetHost("gui", build(make_ctx(tmp_path), backend=fake, lock_dir=tmp_path / "locks")))
    await router.start()
    try:
        result = await router.call(Command(call_id="c1", tool="gui.observe"), "b1", 10)
    finally:
        await router.stop()
        audit.close()
    assert result.error is not None and result.error.code == "policy_denied"


@pytest.mark.parametrize(
    ("env", "reason"),
    [({}, "DISPLAY is not set"), ({"WAYLAND_DISPLAY": "wayland-0"}, "Wayland session without an X11 DISPLAY")],
)
def test_check_reports_no_display(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], reason: str
) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report = check(make_ctx(tmp_path))
    assert report["ready"] is False and reason in report["reason"]


async def test_tools_without_a_display_fail_cleanly(tmp_path: Path) -> None:
    async with gui_client(tmp_path, FakeBackend(display="")) as (client, _, clock):
        result = await client.call_tool("observe", {})
        assert code(result) == "tool_error" and "DISPLAY" in data(result)["message"]
        assert isinstance(clock, FakeClock)


async def test_a_cancelled_input_releases_keys_and_stays_uncertain(tmp_path: Path) -> None:
    fake = FakeBackend()
    controller = Controller(
        fake, ScreenshotStore(tmp_path / "shots"), DisplayLock(":9", tmp_path / "locks"), settle_s=0
    )
    observation, _ = await controller.observe()
    args = {"observation_id": observation["observation_id"], "action_id": "act-00001", "text": "abc"}
    fake.block = anyio.Event()
    task = asyncio.create_task(controller.act("type", args, lambda _: Gesture("type", text="abc")))
    async with asyncio.timeout(5):
        await fake.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.releases == 1 and not fake.sent
    outcome, _ = await controller.act("type", args, lambda _: Gesture("type", text="abc"))
    assert outcome.code == "uncertain" and fake.attempts == 1
