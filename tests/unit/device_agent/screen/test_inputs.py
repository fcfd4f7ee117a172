"""Forwarded input: who may send it, once per id, in the screen's pixels, audited without text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from device_agent.audit import AuditLog
from device_agent.screen.inputs import Inputs
from device_agent.screen.source import Action
from device_agent.takeover import Takeover
from protocol.messages import ViewInput
from tests.unit.device_agent.screen.screens import DrawnScreen


def desk(
    screen: DrawnScreen,
    takeover: Takeover,
    *,
    stopped: bool = False,
    allowed: bool = True,
    audit: AuditLog | None = None,
) -> Inputs:
    return Inputs(screen, lambda: (1280, 800), lambda: takeover, lambda: stopped, allowed=allowed, audit=audit)


def click(input_id: str = "in-1", x: int = 320, y: int = 200, **fields: object) -> ViewInput:
    return ViewInput(
        input_id=input_id,
        kind="click",
        x=x,
        y=y,
        frame_width=640,
        frame_height=400,
        **fields,  # type: ignore[arg-type]
    )


def taken() -> Takeover:
    return Takeover(operator=True, operator_by="alice")


def test_input_is_refused_unless_someone_has_taken_the_device_over() -> None:
    screen = DrawnScreen()
    result = asyncio.run(desk(screen, Takeover()).take(click()))
    assert (result.ok, result.code) == (False, "not_taken_over")
    assert screen.received == []


def test_while_the_owner_has_the_device_at_the_device_no_input_comes_from_afar() -> None:
    screen = DrawnScreen()
    result = asyncio.run(desk(screen, Takeover(owner=True, owner_by="owner")).take(click()))
    assert (result.ok, result.code) == (False, "not_taken_over") and "owner" in result.message
    assert screen.received == []


def test_the_owner_can_forbid_input_and_a_stopped_device_takes_none() -> None:
    screen = DrawnScreen()
    forbidden = asyncio.run(desk(screen, taken(), allowed=False).take(click()))
    stopped = asyncio.run(desk(screen, taken(), stopped=True).take(click()))
    assert (forbidden.code, stopped.code) == ("input_disallowed", "device_stopped")
    assert screen.received == []


def test_a_click_lands_on_the_screen_pixel_under_the_frame_pixel() -> None:
    screen = DrawnScreen()
    result = asyncio.run(desk(screen, taken()).take(click(x=10, y=10)))
    assert result.ok
    # A half-size frame: pixel 10 covers screen pixels 20 and 21; its centre is 21.
    assert screen.received == [Action("click", 21, 21)]


def test_a_repeated_input_id_answers_the_first_result_and_acts_once() -> None:
    screen = DrawnScreen()
    inputs = desk(screen, taken())

    async def twice() -> tuple[bool, bool]:
        first, second = await asyncio.gather(inputs.take(click("same")), inputs.take(click("same")))
        third = await inputs.take(click("same"))
        return first == second == third, third.ok

    assert asyncio.run(twice()) == (True, True)
    assert len(screen.received) == 1


def test_keys_outside_the_gui_key_grammar_and_points_outside_the_frame_are_refused() -> None:
    screen = DrawnScreen()
    inputs = desk(screen, taken())
    bad_key = asyncio.run(inputs.take(ViewInput(input_id="k1", kind="key", keys="ctrl+;rm")))
    outside = asyncio.run(inputs.take(click("c1", x=640, y=10)))
    good_key = asyncio.run(inputs.take(ViewInput(input_id="k2", kind="key", keys="ctrl+s")))
    assert (bad_key.code, outside.code, good_key.ok) == ("invalid_arguments", "invalid_arguments", True)
    assert screen.received == [Action("key", keys="ctrl+s")]


def test_forwarded_input_is_audited_with_its_kind_and_sender_but_never_the_text(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl")
    inputs = desk(DrawnScreen(), taken(), audit=audit)
    asyncio.run(inputs.take(ViewInput(input_id="t1", kind="type", text="hunter2-secret")))
    audit.close()
    text = (tmp_path / "audit.jsonl").read_text()
    line = json.loads(text)
    assert (line["kind"], line["by"], line["status"], line["tool"]) == ("type", "alice", "success", "view.type")
    assert "hunter2" not in text


def test_inputs_sent_together_reach_the_screen_in_the_order_they_came() -> None:
    from device_agent.screen.hub import ScreenHub
    from protocol.messages import Message, ViewInputResult

    screen = DrawnScreen()
    answers: list[str] = []
    done = asyncio.Event()

    async def send(m: Message) -> None:
        if isinstance(m, ViewInputResult):
            answers.append(m.input_id)
            if len(answers) == 3:
                done.set()

    async def run() -> None:
        hub = ScreenHub(send, screen)
        hub.inputs = desk(screen, taken())
        await hub.on_message(click("first"))
        await hub.on_message(ViewInput(input_id="second", kind="type", text="abc"))
        await hub.on_message(ViewInput(input_id="third", kind="key", keys="enter"))
        async with asyncio.timeout(5):
            await done.wait()
        await hub.close()

    asyncio.run(run())
    assert answers == ["first", "second", "third"]
    assert [a.kind for a in screen.received] == ["click", "type", "key"]
