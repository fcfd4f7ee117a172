"""A model's question to a person (`approval.ask_person`) on the approvals page, in a real browser
against a real server: the question is shown as a question, "Reply" approves it with the reply as
the decision's reason, and the device (a raw protocol client that asks, then takes the decision
as its ledger would) gets the reply."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.support import Fleet, wait_until
from tests.web.conftest import Watched, shot
from tests.web.test_dashboard import sign_in

ASK = {
    "name": "approval.ask_person",
    "namespace": "approval",
    "description": "Ask a person a question and wait for the answer",
    "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
    "tool_type": "data_collection",
}
QUESTION = "Which printer should the report go to?"


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("web-ask")) as f:
        yield f


async def asking_device(fleet: Fleet, enrolled: dict[str, Any], seen: dict[str, Any], stop: asyncio.Event) -> None:
    """Answer a batch of `approval.ask_person` by asking; take the decision sent; report it."""
    url = fleet.server.url.replace("http://", "ws://") + "/v1/agent"
    async with connect(url, additional_headers={"Authorization": f"Bearer {enrolled['token']}"}) as ws:
        seq, ack = 0, 0

        async def send(type_: str, reliable: bool, **payload: Any) -> None:
            nonlocal seq
            seq += reliable
            await ws.send(json.dumps({"v": 1, "type": type_, "seq": seq if reliable else 0, "ack": ack, **payload}))

        async def beat() -> None:
            while True:
                await send("heartbeat", False, state="idle", batch_id=None)
                await asyncio.sleep(2)

        await send("hello", False, device_id=enrolled["id"], versions=[1], tools=[ASK], resume=None, info={})
        beating = asyncio.create_task(beat())
        reading = asyncio.create_task(anext(aiter(ws)))
        stopping = asyncio.create_task(stop.wait())
        batch: dict[str, Any] = {}
        try:
            while True:
                await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if stopping.done():
                    return
                frame = json.loads(reading.result())
                reading = asyncio.create_task(anext(aiter(ws)))
                ack = frame["seq"] or ack
                if frame["type"] == "command_batch":
                    batch = frame
                    call = frame["commands"][0]
                    await send("batch_accepted", True, batch_id=frame["batch_id"])
                    await send(
                        "approval_request",
                        True,
                        approval_id="apr_ask_1",
                        batch_id=frame["batch_id"],
                        call_id=call["call_id"],
                        tool=call["tool"],
                        arguments=call["arguments"],
                        reason=call["arguments"]["question"],
                    )
                elif frame["type"] == "approval_decision" and "decision" not in seen:
                    seen.update(frame)
                    await send(
                        "approval_decision", True, **{k: frame[k] for k in ("approval_id", "decision", "reason", "by")}
                    )
                    result = {
                        "call_id": batch["commands"][0]["call_id"],
                        "status": "success",
                        "result": frame["reason"],
                    }
                    await send("result_batch", True, batch_id=batch["batch_id"], fence=batch["fence"], results=[result])
        finally:
            for task in (beating, reading, stopping):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


def test_a_persons_reply_to_a_models_question_approves_it_with_the_reply(web_fleet: Fleet, watched: Watched) -> None:
    enrolled = web_fleet.enroll("asker")
    seen: dict[str, Any] = {}
    box: dict[str, Any] = {}

    def run() -> None:
        async def main() -> None:
            box["stop"], box["loop"] = asyncio.Event(), asyncio.get_running_loop()
            await asking_device(web_fleet, enrolled, seen, box["stop"])

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        web_fleet.wait_device(enrolled["id"], "idle")
        command = {"tool": "approval.ask_person", "arguments": {"question": QUESTION}}
        task = web_fleet.submit({"nodes": [{"id": "ask", "placement": {"device": "asker"}, "commands": [command]}]})
        page = sign_in(watched, web_fleet, hash_="#/approvals")
        card = "article.approval[data-ask-person=true]"
        page.wait_for_selector(card)
        assert QUESTION in page.inner_text(f"{card} .ask-person-question")
        assert page.query_selector(f"{card} .approval-args") is None  # a question, not a command
        page.click(f"{card} [data-reply]")  # no answer yet: refused here, nothing sent
        page.wait_for_selector(f"{card} .approval-error")
        assert "decision" not in seen
        page.fill(f"{card} .ask-person-reply", "The one on the second floor")
        shot(page, "approvals-ask-person")
        page.click(f"{card} [data-reply]")
        wait_until(lambda: "decision" in seen, 30, "the reply to reach the device")
        assert (seen["decision"], seen["reason"]) == ("approved", "The one on the second floor")
        done = web_fleet.wait_task(task["id"])
        assert done["state"] == "succeeded", done
        assert web_fleet.node(done, "ask")["output"] == "The one on the second floor"
    finally:
        if "loop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)
