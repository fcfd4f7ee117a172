"""A device may only report on batches sent to it, with their current fence (SPEC section 4)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from tests.rawdevice import RawDevice
from tests.support import Fleet, fleet, wait_until


def dag_for(name: str) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "echo", "placement": {"labels": {"raw": name}}, "commands": [{"tool": "raw.echo", "arguments": {}}]}
        ]
    }


async def test_results_for_another_batch_or_with_an_old_fence_are_refused_and_change_nothing(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        owner, intruder = RawDevice(f, "owner"), RawDevice(f, "intruder")
        await owner.connect()
        await intruder.connect()
        first = await asyncio.to_thread(f.submit, dag_for("owner"))
        earlier = await owner.recv("command_batch")
        await owner.send("result_batch", **owner.result(earlier, earlier["fence"]))
        await asyncio.to_thread(f.wait_task, first["id"])
        task = await asyncio.to_thread(f.submit, dag_for("owner"))
        batch = await owner.recv("command_batch")
        assert batch["fence"] > earlier["fence"]
        await owner.send("batch_accepted", batch_id=batch["batch_id"])

        await intruder.send("result_batch", **intruder.result(batch, batch["fence"]))
        assert (await intruder.recv("error"))["code"] == "unknown_batch"

        await owner.send("result_batch", **owner.result(batch, batch["fence"] - 1))
        assert (await owner.recv("error"))["code"] == "stale_fence"

        await owner.send("result_batch", **owner.result(batch, batch["fence"], batch_id="b_never_sent"))
        assert (await owner.recv("error"))["code"] == "unknown_batch"

        current = await asyncio.to_thread(f.task, task["id"])
        assert current["state"] == "running" and current["nodes"][0]["state"] == "running"

        await owner.send("result_batch", **owner.result(batch, batch["fence"]))
        done = await asyncio.to_thread(f.wait_task, task["id"])
        assert done["state"] == "succeeded" and done["nodes"][0]["output"] == "echoed"
        assert len(done["nodes"][0]["attempts"]) == 1


async def test_a_duplicate_result_after_success_is_acknowledged_not_applied_twice(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        dev = RawDevice(f, "dup")
        await dev.connect()
        task = await asyncio.to_thread(f.submit, dag_for("dup"))
        batch = await dev.recv("command_batch")
        await dev.send("result_batch", **dev.result(batch, batch["fence"]))
        await asyncio.to_thread(f.wait_task, task["id"])
        await dev.send("result_batch", **dev.result(batch, batch["fence"]))
        assert dev.ws is not None
        async with asyncio.timeout(10):  # acknowledged, and never answered with an error
            while True:
                frame = json.loads(await dev.ws.recv())
                assert frame["type"] != "error", frame
                if frame["type"] == "heartbeat" and frame["ack"] == dev.seq:
                    break
        events = await asyncio.to_thread(_events, f, task["id"])
        assert sum(1 for e in events if e == ("node.attempt", "succeeded")) == 1


async def test_a_batch_never_accepted_by_a_connected_device_times_out(tmp_path: Path) -> None:
    with fleet(tmp_path, batch_accept_timeout_s="1") as f:
        dev = RawDevice(f, "mute")
        await dev.connect()
        task = await asyncio.to_thread(f.submit, dag_for("mute"))
        await dev.recv("command_batch")  # ...and never accept it
        cancel = await dev.recv("cancel")
        assert cancel["reason"] == "timeout"
        done = await asyncio.to_thread(f.wait_task, task["id"])
        node = done["nodes"][0]
        assert node["state"] == "failed" or node["attempts"][0]["error"]["code"] == "timeout"
        assert node["attempts"][0]["error"]["code"] == "timeout"


async def test_revoking_a_device_closes_its_socket_with_4401_and_refuses_the_token(tmp_path: Path) -> None:
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    with fleet(tmp_path) as f:
        dev = RawDevice(f, "revokee")
        await dev.connect()
        with f.server.client() as c:
            assert c.delete(f"/v1/devices/{dev.enrolled['id']}").status_code == 200
        assert dev.ws is not None
        try:
            async with asyncio.timeout(10):
                while True:
                    await dev.ws.recv()
        except ConnectionClosed as exc:
            assert exc.rcvd is not None and exc.rcvd.code == 4401
        try:
            await dev.connect()
            raise AssertionError("a revoked token connected")
        except InvalidStatus as exc:
            assert exc.response.status_code == 401
        wait_until(lambda: f.device(dev.enrolled["id"])["state"] == "revoked", 10, "revoked state")


def _events(f: Fleet, task_id: str) -> list[tuple[str, str]]:
    out = []
    with f.server.client() as c, c.stream("GET", f"/v1/tasks/{task_id}/events") as resp:
        etype = ""
        for line in resp.iter_lines():
            if line.startswith("event:"):
                etype = line[6:].strip()
            elif line.startswith("data:"):
                out.append((etype, json.loads(line[5:])["state"]))
    return out
