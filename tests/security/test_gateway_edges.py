"""Issue 14, the device gateway's edges: frames SPEC section 4 refuses (binary, an unknown protocol
version, oversized at any size) end with their documented close code, and what a device chooses
(error codes) cannot grow the orchestrator's metric series or fleet-wide messages."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.rawdevice import RawDevice
from tests.support import Fleet

LIMIT = 65536  # max_frame_bytes of the shared fleet (tests/conftest.py)


@pytest.fixture
def f(shared_fleet: Fleet) -> Iterator[Fleet]:
    yield shared_fleet


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Fleet, str], RawDevice]]:
    """Make raw devices; their sockets are closed at the end of the test."""
    made: list[RawDevice] = []

    def make(fleet: Fleet, name: str) -> RawDevice:
        made.append(RawDevice(fleet, name))
        return made[-1]

    yield make
    for dev in made:
        if dev.ws is not None:
            await dev.ws.close()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def refused(ws: Any) -> tuple[list[dict[str, Any]], int | None, str]:
    """The frames received until the server closed, and its close code and reason."""
    frames = []
    try:
        async with asyncio.timeout(15):
            while True:
                frames.append(json.loads(await ws.recv()))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None, exc.rcvd.reason if exc.rcvd else ""


def heartbeat(**fields: Any) -> dict[str, Any]:
    return {"v": 1, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle", **fields}


async def test_a_binary_frame_is_refused_with_4400_even_when_it_holds_a_valid_frame(
    raw: Callable[[Fleet, str], RawDevice], f: Fleet
) -> None:
    dev = raw(f, unique("bin"))
    await dev.connect()
    assert dev.ws is not None
    await dev.ws.send(json.dumps(heartbeat()).encode())  # a binary frame
    frames, code, _ = await refused(dev.ws)
    assert code == 4400
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "malformed_frame"
    assert all(fr["type"] != "heartbeat" for fr in frames)  # it was not answered as a heartbeat


@pytest.mark.parametrize("when", ["hello", "after the welcome"])
async def test_a_frame_in_an_unknown_protocol_version_is_refused_with_4426(
    raw: Callable[[Fleet, str], RawDevice], f: Fleet, when: str
) -> None:
    dev = raw(f, unique("v99"))
    if when == "hello":
        url = f.server.url.replace("http://", "ws://") + "/v1/agent"
        ws = await connect(url, additional_headers={"Authorization": f"Bearer {dev.enrolled['token']}"})
        hello = {"v": 99, "type": "hello", "seq": 0, "ack": 0, "device_id": dev.enrolled["id"], "versions": [1]}
        await ws.send(json.dumps(hello))
    else:
        await dev.connect()
        assert dev.ws is not None
        ws = dev.ws
        await ws.send(json.dumps(heartbeat(v=99)))
    frames, code, _ = await refused(ws)
    assert code == 4426
    assert frames[-1]["code"] == "no_common_version" and "99" in frames[-1]["message"]
    if when == "hello":
        assert f.device(dev.enrolled["id"])["state"] == "enrolled"  # no session was opened


@pytest.mark.parametrize("factor", [1.5, 3, 40])
async def test_an_oversized_frame_closes_4413_with_a_problem_whatever_its_size(
    raw: Callable[[Fleet, str], RawDevice], f: Fleet, factor: float
) -> None:
    """Between 1 and 2 times the limit the codec refused it (4413); above, websockets closed 1009
    before the gateway saw it. Now the library refuses at the limit itself, unread, with 4413."""
    dev = raw(f, unique("big"))
    await dev.connect()
    assert dev.ws is not None
    await dev.ws.send(json.dumps(heartbeat(pad="x" * int(LIMIT * factor))))
    frames, code, reason = await refused(dev.ws)
    assert (code, reason) == (4413, "frame_too_large")
    assert frames[-1]["type"] == "error" and frames[-1]["code"] == "frame_too_large"
    assert str(LIMIT) in frames[-1]["message"]
    await dev.connect()  # the device is not punished beyond the frame: it reconnects


async def test_a_frame_at_the_limit_is_still_taken(raw: Callable[[Fleet, str], RawDevice], f: Fleet) -> None:
    dev = raw(f, unique("fit"))
    await dev.connect()
    assert dev.ws is not None
    frame = heartbeat(batch_id="")
    frame["batch_id"] = "x" * (LIMIT - len(json.dumps(frame)))
    assert len(json.dumps(frame)) == LIMIT
    await dev.ws.send(json.dumps(frame))
    assert (await dev.recv("heartbeat"))["type"] == "heartbeat"


def outcomes(f: Fleet) -> dict[str, float]:
    text = httpx.get(f"{f.server.url}/metrics").text
    return {
        s.labels["outcome"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "orrery_batches"
        for s in family.samples
        if s.name == "orrery_batches_total"
    }


async def test_invented_error_codes_add_no_metric_series_and_are_recorded_as_device_error(
    raw: Callable[[Fleet, str], RawDevice], f: Fleet
) -> None:
    name = unique("pwn")
    dev = raw(f, name)
    await dev.connect()
    before = await asyncio.to_thread(outcomes, f)
    n = 50
    dag = {
        "nodes": [
            {"id": f"n{i}", "placement": {"labels": {"raw": name}}, "commands": [{"tool": "raw.echo", "arguments": {}}]}
            for i in range(n)
        ]
    }
    task = await asyncio.to_thread(f.submit, dag)
    nasty = 'pwned"\n\x1b[31m' + "z" * 500
    for i in range(n):
        batch = await dev.recv("command_batch")
        code = nasty if i == 0 else f"pwned-{uuid.uuid4().hex}"
        results = [
            {"call_id": c["call_id"], "status": "failure", "error": {"code": code, "message": "it broke"}}
            for c in batch["commands"]
        ]
        await dev.send("result_batch", batch_id=batch["batch_id"], fence=batch["fence"], results=results)
    done = await asyncio.to_thread(f.wait_task, task["id"])
    after = await asyncio.to_thread(outcomes, f)
    assert not [label for label in after if "pwned" in label]
    assert set(after) - set(before) <= {"device_error"}
    assert after["device_error"] - before.get("device_error", 0) == n
    errors = [node["attempts"][0]["error"] for node in done["nodes"]]
    assert {e["code"] for e in errors} == {"device_error"}
    assert all("pwned" in e["message"] and "it broke" in e["message"] for e in errors)
    first = next(node for node in done["nodes"] if node["id"] == "n0")
    message = first["attempts"][0]["error"]["message"]
    assert "\n" not in message and "\x1b" not in message and "z" * 65 not in message
    assert first["attempts"][0]["results"][0]["error"]["code"] == "device_error"


async def test_a_known_toolset_code_is_kept_as_the_device_sent_it(
    raw: Callable[[Fleet, str], RawDevice], f: Fleet
) -> None:
    name = unique("gui")
    dev = raw(f, name)
    await dev.connect()
    dag = {
        "nodes": [
            {"id": "n", "placement": {"labels": {"raw": name}}, "commands": [{"tool": "raw.echo", "arguments": {}}]}
        ]
    }
    task = await asyncio.to_thread(f.submit, dag)
    batch = await dev.recv("command_batch")
    error = {"code": "stale_observation", "message": "observe again"}
    results = [{"call_id": c["call_id"], "status": "failure", "error": error} for c in batch["commands"]]
    await dev.send("result_batch", batch_id=batch["batch_id"], fence=batch["fence"], results=results)
    done = await asyncio.to_thread(f.wait_task, task["id"])
    assert done["nodes"][0]["attempts"][0]["error"] == error


async def test_no_capable_device_in_a_large_fleet_is_bounded_and_says_what_is_near(
    raw: Callable[[Fleet, str], RawDevice], tmp_path: Path
) -> None:
    """The problem used to list every enrolled device's name: unbounded, and the whole fleet."""
    with Fleet(tmp_path) as fleet:
        names = [f"web-{i:02d}" for i in range(40)]
        for n in names:
            await asyncio.to_thread(fleet.enroll, n, {"role": "web"})
        dev = raw(fleet, "echo-1")  # the one device with the tool, so validation reaches placement
        await dev.connect()
        dag = {"nodes": [{"id": "gpu", "placement": {"labels": {"role": "gpu"}}, "commands": [{"tool": "raw.echo"}]}]}
        body = await asyncio.to_thread(fleet.submit, dag, 422)
        problem = next(p for p in body["problems"] if p["code"] == "no_capable_device")
        message = problem["message"]
        assert "41 enrolled devices (1 online)" in message and "1 have the tools" in message
        assert "0 match the placement" in message and "and 36 more" in message
        assert sum(n in message for n in names) <= 5
        assert "role=web, not gpu" in message
        assert len(message) < 1000
        assert problem["devices"] == {"enrolled": 41, "online": 1, "with_tools": 1, "matching_placement": 0}
        await dev.ws.close()  # before the server stops
