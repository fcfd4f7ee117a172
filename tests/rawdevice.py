"""A hand-driven device that speaks the protocol frame by frame, for attack and fencing tests."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from tests.support import Fleet

TOOLS = [{"name": "raw.echo", "namespace": "raw", "annotations": {"read_only": True}, "tool_type": "data_collection"}]


class RawDevice:
    """A hand-driven device: the protocol spoken frame by frame."""

    def __init__(self, fleet: Fleet, name: str) -> None:
        self.fleet = fleet
        self.enrolled = fleet.enroll(name, {"raw": name})
        self.ws: ClientConnection | None = None
        self.seq = 0
        self.ack = 0

    async def connect(self, resume: dict[str, Any] | None = None, **hello: Any) -> dict[str, Any]:
        """Connect and say hello (`hello`: more fields of it, e.g. `features`); the welcome."""
        url = self.fleet.server.url.replace("http://", "ws://") + "/v1/agent"
        self.ws = await connect(url, additional_headers={"Authorization": f"Bearer {self.enrolled['token']}"})
        await self.send(
            "hello",
            seq=0,
            device_id=self.enrolled["id"],
            versions=[1],
            tools=TOOLS,
            resume=resume,
            info={"platform": "linux"},
            **hello,
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
