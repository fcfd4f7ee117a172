"""A device may only report on batches sent to it, with their current fence (SPEC section 4)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.support import Fleet, fleet, wait_until

TOOLS = [{"name": "raw.echo", "namespace": "raw", "annotations": {"read_only": True}, "tool_type": "data_collection"}]


class RawDevice:
    """A hand-driven device: the protocol spoken frame by frame."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.enrolled = fleet.enroll(name, {"raw": name})
        self.ws: ClientConnection | None = None
        self.seq = 0
        self.ack = 0

    async def connect(self) -> dict[str, Any]:
        url = self.fleet.server.url.replace("http://", "ws://") + "/v1/agent"
        self.ws = await connect(url, additional_headers={"Authorization": f"Bearer {self.enrolled['token']}"})
        await self.send(
            "hello", seq=0, device_id=self.enrolled["id"], versions=[1], tools=TOOLS, info={"platform": "linux"}
        )
        return await self.recv("welcome")

    async def send(self, type_: str, seq: int | None = None, **payload: Any) -> None:
        assert self.ws is not None
        if seq is None:
            self.seq += 1
            seq = self.seq
        await self.ws.send(json.dumps({"v": 1, "type": type_, "seq": seq, "ack": self.ack, **payload}))

    async def recv(self, type_: str) -> dict[str, Any]:
        """The next frame of `type_`, skipping heartbeats; reliable frames are acknowledged."""
        assert self.ws is not None
        async with asyncio.timeout(30):
            while True:
                frame = json.loads(await self.ws.recv())
                if frame["seq"]:
                    self.ack = frame["seq"]
                if frame["type"] == type_:
                    return frame

    def result(self, batch: dict[str, Any], fence: int, batch_id: str | None = None) -> dict[str, Any]:
        return {
            "batch_id": batch_id or batch["batch_id"],
            "fence": fence,
            "results": [
                {"call_id": c["call_id"], "status": "success", "result": "echoed", "namespace": "raw"}
                for c in batch["commands"]
            ],
        }


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
