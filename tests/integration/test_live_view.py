"""Live views and input through them, with a real server and a raw protocol device that streams
its screen (tests/screendevice.py): frames reach the viewer, the device's lease is renewed while
someone watches and ended when they leave, views are scoped to one device and one key, and the
device's answers (a refused watch, a refused input) reach the caller with its codes."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from orrery.sdk import AsyncClient, Conflict, Frame
from tests.screendevice import WAIT_S, ScreenDevice
from tests.support import Fleet


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("views")) as f:
        yield f


@pytest.fixture(scope="module")
def keys(fleet: Fleet) -> dict[str, str]:
    with fleet.server.client() as c:
        return {
            role: c.post("/v1/api-keys", json={"name": role, "role": role}).json()["key"]
            for role in ("viewer", "operator")
        }


def api(fleet: Fleet, key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=fleet.server.url, headers={"Authorization": f"Bearer {key or fleet.server.api_key}"}, timeout=30
    )


@asynccontextmanager
async def screen(fleet: Fleet, name: str, **kw: Any) -> AsyncIterator[ScreenDevice]:
    enrolled = fleet.enroll(name)
    async with ScreenDevice(fleet.server.url, enrolled["id"], enrolled["token"], **kw) as device:
        yield device


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The (event, data) pairs of a Server-Sent Events response."""
    kind = ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield kind, json.loads(line.removeprefix("data: "))


async def open_view(client: httpx.AsyncClient, device_id: str) -> dict[str, Any]:
    r = await client.post(f"/v1/devices/{device_id}/views", json={"fps": 10})
    assert r.status_code == 201, r.text
    view: dict[str, Any] = r.json()
    return view


async def test_a_viewer_gets_frames_while_the_device_is_renewed_its_lease_and_told_to_stop_when_it_leaves(
    fleet: Fleet, keys: dict[str, str]
) -> None:
    async with screen(fleet, "desk-live") as device, api(fleet, keys["viewer"]) as client:
        view = await open_view(client, device.device_id)
        assert view["device_id"] == device.device_id and view["expires_at"]
        frames: list[dict[str, Any]] = []
        async with asyncio.timeout(WAIT_S), client.stream("GET", view["frames_url"]) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse(r)  # read with anext: leaving the loop would close the stream
            for _ in range(3):
                kind, data = await anext(events)
                assert kind == "frame"
                frames.append(data)
            first = await device.next_view(0, on=True)
            renewal = await device.next_view(1, on=True)  # every lease_s/3 while watched
            assert renewal["stream_id"] == first["stream_id"]
        assert [f["n"] for f in frames] == sorted(f["n"] for f in frames)
        assert frames[0]["image_b64"] != frames[1]["image_b64"]
        assert {k: frames[0][k] for k in ("mime", "width", "height", "screen_width", "screen_height")} == {
            "mime": "image/png",
            "width": 8,
            "height": 6,
            "screen_width": 1600,
            "screen_height": 1200,
        }
        assert frames[0]["marks"][0]["name"] == "OK button" and frames[0]["at"]
        stop = await device.next_view(0, on=False)  # the viewer left: the stream ends at once
        assert stop["stream_id"] == first["stream_id"]


async def test_a_view_id_used_under_another_device_or_another_key_is_refused_view_scope(
    fleet: Fleet, keys: dict[str, str]
) -> None:
    async with screen(fleet, "desk-a") as a, screen(fleet, "desk-b") as b, api(fleet, keys["viewer"]) as client:
        view = await open_view(client, a.device_id)
        r = await client.get(f"/v1/devices/{b.device_id}/views/{view['view_id']}/frames")
        assert (r.status_code, r.json()["code"]) == (403, "view_scope")
        async with api(fleet, keys["operator"]) as other:
            r = await other.get(view["frames_url"])
            assert (r.status_code, r.json()["code"]) == (403, "view_scope")
        r = await client.get(f"/v1/devices/{a.device_id}/views/not-a-view/frames")
        assert (r.status_code, r.json()["code"]) == (403, "view_scope")


async def test_a_device_without_the_view_feature_or_offline_cannot_be_watched(
    fleet: Fleet, keys: dict[str, str]
) -> None:
    async with screen(fleet, "desk-old", features=()) as old, api(fleet, keys["viewer"]) as client:
        r = await client.post(f"/v1/devices/{old.device_id}/views")
        assert (r.status_code, r.json()["code"]) == (409, "view_unsupported")
        never = fleet.enroll("desk-never")
        r = await client.post(f"/v1/devices/{never['id']}/views")
        assert (r.status_code, r.json()["code"]) == (409, "device_offline")
        r = await client.post("/v1/devices/no-such-device/views")
        assert (r.status_code, r.json()["code"]) == (404, "not_found")


async def test_a_watch_the_owner_disallows_reaches_the_viewer_as_ended(fleet: Fleet, keys: dict[str, str]) -> None:
    async with (
        screen(fleet, "desk-private", refuse_watch="watch_disallowed") as device,
        api(fleet, keys["viewer"]) as c,
    ):
        view = await open_view(c, device.device_id)
        async with asyncio.timeout(WAIT_S), c.stream("GET", view["frames_url"]) as r:
            events = [event async for event in sse(r)]
        assert events == [("ended", {"code": "watch_disallowed", "message": "the owner said no"})]


async def test_a_device_that_goes_offline_ends_its_viewers_streams(fleet: Fleet, keys: dict[str, str]) -> None:
    async with screen(fleet, "desk-leaving") as device, api(fleet, keys["viewer"]) as client:
        view = await open_view(client, device.device_id)
        async with asyncio.timeout(WAIT_S), client.stream("GET", view["frames_url"]) as r:
            events = sse(r)
            assert (await anext(events))[0] == "frame"
            await device.leave()
            async for kind, data in events:
                if kind == "ended":
                    assert data["code"] == "device_offline"
                    break


async def test_input_is_forwarded_and_the_devices_refusal_code_comes_back(fleet: Fleet, keys: dict[str, str]) -> None:
    async with screen(fleet, "desk-input") as device, api(fleet, keys["operator"]) as client:
        url = f"/v1/devices/{device.device_id}/input"
        click = {"kind": "click", "x": 3, "y": 4, "frame_width": 8, "frame_height": 6, "button": "right"}
        device.input_answer = (False, "not_taken_over")
        r = await client.post(url, json=click)
        assert (r.status_code, r.json()["code"]) == (409, "not_taken_over")
        device.input_answer = (True, "")
        r = await client.post(url, json={"kind": "type", "text": "hello"})
        assert r.status_code == 200 and r.json()["ok"] is True
        sent = await device.next_input(0)
        assert {k: sent[k] for k in ("kind", "x", "y", "frame_width", "frame_height", "button")} == click
        assert sent["by"] and sent["input_id"] != (await device.next_input(1))["input_id"]
        assert (await device.next_input(1))["text"] == "hello"


async def test_only_the_operator_who_took_the_device_over_sends_it_input(fleet: Fleet, keys: dict[str, str]) -> None:
    async with screen(fleet, "desk-held") as device, api(fleet) as admin, api(fleet, keys["operator"]) as other:
        taken = await admin.post(f"/v1/devices/{device.device_id}/takeover", json={"reason": "mine"})
        assert taken.status_code == 200, taken.text
        url = f"/v1/devices/{device.device_id}/input"
        r = await other.post(url, json={"kind": "key", "keys": "Return"})
        assert (r.status_code, r.json()["code"]) == (409, "conflict") and "taken over by" in r.json()["detail"]
        assert device.inputs == [], "refused before anything reached the device"
        device.input_answer = (True, "")
        assert (await admin.post(url, json={"kind": "key", "keys": "Return"})).status_code == 200
        assert (await device.next_input(0))["keys"] == "Return"
        assert (await admin.post(f"/v1/devices/{device.device_id}/handback", json={"note": ""})).status_code == 200


async def test_input_is_validated_and_needs_the_operator_role(fleet: Fleet, keys: dict[str, str]) -> None:
    async with screen(fleet, "desk-checks") as device, api(fleet, keys["operator"]) as client:
        url = f"/v1/devices/{device.device_id}/input"
        for body in (
            {"kind": "click", "x": 1},
            {"kind": "key"},
            {"kind": "wave"},
            {"kind": "click", "x": 9, "y": 1, "frame_width": 8, "frame_height": 6},
        ):
            r = await client.post(url, json=body)
            assert (r.status_code, r.json()["code"]) == (422, "validation_error"), body
        async with api(fleet, keys["viewer"]) as viewer:
            r = await viewer.post(url, json={"kind": "key", "keys": "Return"})
            assert (r.status_code, r.json()["code"]) == (403, "forbidden")
        assert device.inputs == []


async def test_an_input_the_device_never_answers_is_504_device_no_answer(fleet: Fleet, keys: dict[str, str]) -> None:
    async with screen(fleet, "desk-mute") as device, api(fleet, keys["operator"]) as client:
        device.input_answer = None
        r = await client.post(f"/v1/devices/{device.device_id}/input", json={"kind": "key", "keys": "Return"})
        assert (r.status_code, r.json()["code"]) == (504, "device_no_answer")
        assert "may or may not" in r.json()["detail"]


def test_the_routes_are_in_the_openapi_document(fleet: Fleet, tmp_path: Path) -> None:
    paths = httpx.get(f"{fleet.server.url}/openapi.json").json()["paths"]
    assert {
        "/v1/devices/{device_id}/views",
        "/v1/devices/{device_id}/views/{view_id}/frames",
        "/v1/devices/{device_id}/input",
    } <= set(paths)


async def test_the_sdk_opens_a_view_reads_its_frames_and_sends_input(fleet: Fleet, keys: dict[str, str]) -> None:
    async with screen(fleet, "desk-sdk") as device, AsyncClient(fleet.server.url, keys["operator"]) as client:
        view = await client.open_view(device.device_id, fps=10, marks=True)
        assert view.marks and view.device_id == device.device_id
        frames: list[Frame] = []
        async with asyncio.timeout(WAIT_S), contextlib.aclosing(client.view_frames(view)) as items:
            async for item in items:
                assert isinstance(item, Frame), item
                frames.append(item)
                if len(frames) == 2:
                    break
        assert frames[0].image.startswith(b"\x89PNG") and frames[0].marks
        assert (await device.next_view(0, on=True))["marks"] is True
        assert (await client.send_input(device.device_id, "key", keys="Return")).ok
        device.input_answer = (False, "input_disallowed")
        with pytest.raises(Conflict) as refused:
            await client.send_input(device.device_id, "click", x=1, y=1, frame_width=8, frame_height=6)
        assert refused.value.code == "input_disallowed"
        with pytest.raises(Conflict) as unsupported:
            await client.open_view(fleet.enroll("desk-sdk-away")["id"])
        assert unsupported.value.code == "device_offline"
