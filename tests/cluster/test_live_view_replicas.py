"""A live view across replicas (SPEC section 7): the device's socket is on one replica, the viewer
and the operator on the other. Frames cross through the device's Redis view channel, leases and
input reach the device through the cluster's routing, and the device's answers come back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from tests.cluster.replicaset import ReplicaSet
from tests.screendevice import WAIT_S, ScreenDevice


async def sse(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    kind = ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            yield kind, json.loads(line.removeprefix("data: "))


async def test_a_viewer_on_the_replica_without_the_devices_socket_watches_and_drives_it(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    rs = ReplicaSet(tmp_path, postgres_db, redis_db)
    await asyncio.to_thread(rs.__enter__)
    try:
        holder, other = rs.replicas
        enrolled = await asyncio.to_thread(rs.enroll, "desk")
        async with (
            ScreenDevice(holder.url, enrolled["id"], enrolled["token"]) as device,
            httpx.AsyncClient(
                base_url=other.url, headers={"Authorization": f"Bearer {rs.admin_key}"}, timeout=30
            ) as client,
        ):
            await asyncio.to_thread(rs.wait_device, enrolled["id"], "idle")
            r = await client.post(f"/v1/devices/{enrolled['id']}/views", json={"fps": 10})
            assert r.status_code == 201, r.text  # the other replica knows the device's features
            view = r.json()
            async with asyncio.timeout(WAIT_S), client.stream("GET", view["frames_url"]) as stream:
                events = sse(stream)
                seen = [await anext(events) for _ in range(3)]
                assert [kind for kind, _ in seen] == ["frame"] * 3
                assert len({data["n"] for _, data in seen}) == 3
                first = await device.next_view(0, on=True)
                assert (await device.next_view(1, on=True))["stream_id"] == first["stream_id"]  # renewed

                device.input_answer = (False, "not_taken_over")
                r = await client.post(f"/v1/devices/{enrolled['id']}/input", json={"kind": "key", "keys": "Return"})
                assert (r.status_code, r.json()["code"]) == (409, "not_taken_over")
                device.input_answer = (True, "")
                r = await client.post(f"/v1/devices/{enrolled['id']}/input", json={"kind": "type", "text": "hi"})
                assert r.status_code == 200, r.text
            stop = await device.next_view(0, on=False)  # the last viewer left, on the other replica
            assert stop["stream_id"] == first["stream_id"]

            r = await client.post(f"/v1/devices/{enrolled['id']}/views")
            async with asyncio.timeout(WAIT_S), client.stream("GET", r.json()["frames_url"]) as stream:
                events = sse(stream)
                assert (await anext(events))[0] == "frame"
                await device.leave()
                async for kind, data in events:
                    if kind == "ended":
                        assert data["code"] == "device_offline"
                        break
    finally:
        await asyncio.to_thread(rs.__exit__, None, None, None)
