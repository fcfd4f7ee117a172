"""The device endpoint refuses bad handshakes and bad frames with the documented codes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support import Fleet


def ws_url(fleet: Fleet) -> str:
    return fleet.server.url.replace("http://", "ws://") + "/v1/agent"


def hello(device_id: str, **extra: Any) -> str:
    return json.dumps({"v": 1, "type": "hello", "seq": 0, "ack": 0, "device_id": device_id, "versions": [1], **extra})


async def open_ws(fleet: Fleet, token: str | None) -> ClientConnection:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return await connect(ws_url(fleet), additional_headers=headers, max_size=None, open_timeout=10)


async def close_code(ws: ClientConnection) -> int | None:
    """Read until the server closes; the close code it sent."""
    try:
        async with asyncio.timeout(20):
            while True:
                await ws.recv()
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None


@pytest.fixture(scope="module")
def device(shared_fleet: Fleet) -> dict[str, Any]:
    return shared_fleet.enroll("raw-device")


@pytest.mark.parametrize("token", [None, "garbage", "orrd_dev_x.nope", "orrk_not-a-device-token"])
async def test_a_missing_or_bad_token_is_refused_with_http_401_before_any_frame(
    shared_fleet: Fleet, token: str | None
) -> None:
    with pytest.raises(InvalidStatus) as info:
        await open_ws(shared_fleet, token)
    assert info.value.response.status_code == 401
    assert json.loads(info.value.response.body or b"{}")["code"] == "unauthorized"


async def test_no_hello_in_time_closes_with_4408(shared_fleet: Fleet, device: dict[str, Any]) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    assert await close_code(ws) == 4408


async def test_malformed_json_closes_with_4400(shared_fleet: Fleet, device: dict[str, Any]) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    await ws.send("{this is not json")
    assert await close_code(ws) == 4400


async def test_a_frame_other_than_hello_first_closes_with_4400(shared_fleet: Fleet, device: dict[str, Any]) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    await ws.send(json.dumps({"v": 1, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle"}))
    assert await close_code(ws) == 4400


async def test_an_oversize_frame_closes_with_4413(shared_fleet: Fleet, device: dict[str, Any]) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    await ws.send(hello(device["id"], labels={"pad": "x" * 70_000}))
    assert await close_code(ws) == 4413


async def test_a_device_id_that_is_not_the_tokens_closes_with_4403(shared_fleet: Fleet, device: dict[str, Any]) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    await ws.send(hello("dev_someone_else"))
    assert await close_code(ws) == 4403


async def test_no_common_protocol_version_closes_with_4426(shared_fleet: Fleet, device: dict[str, Any]) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    await ws.send(hello(device["id"], versions=[9]))
    assert await close_code(ws) == 4426


async def test_a_good_hello_is_welcomed_and_heartbeats_are_answered(
    shared_fleet: Fleet, device: dict[str, Any]
) -> None:
    ws = await open_ws(shared_fleet, device["token"])
    await ws.send(hello(device["id"], info={"platform": "linux"}))
    welcome = json.loads(await ws.recv())
    assert welcome["type"] == "welcome" and welcome["version"] == 1 and welcome["resumed"] is False
    assert welcome["heartbeat_interval_s"] == 1.0
    await ws.send(json.dumps({"v": 1, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle", "batch_id": None}))
    reply = json.loads(await ws.recv())
    assert reply["type"] == "heartbeat" and reply["seq"] == 0
    assert shared_fleet.device(device["id"])["state"] == "idle"
    await ws.close()


async def test_a_second_connection_supersedes_the_first_with_4409(shared_fleet: Fleet) -> None:
    dev = shared_fleet.enroll("twice")
    first = await open_ws(shared_fleet, dev["token"])
    await first.send(hello(dev["id"]))
    assert json.loads(await first.recv())["type"] == "welcome"
    second = await open_ws(shared_fleet, dev["token"])
    await second.send(hello(dev["id"]))
    assert json.loads(await second.recv())["type"] == "welcome"
    assert await close_code(first) == 4409
    await second.close()
