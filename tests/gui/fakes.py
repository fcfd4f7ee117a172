"""A fake display for the controller tests: counts inputs, can block or fail mid-input."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.types import CallToolResult

from device_agent.policy import Policy
from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.gui import build
from device_agent.toolsets.gui.rules import Gesture, GuiError
from device_agent.toolsets.gui.x11 import InputFailed, Screen

# The smallest valid PNG (1x1, black): the store checks the signature, the fake needs no pixels.
TINY_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de"
    "0000000c49444154789c63606060000000040001f61738550000000049454e44ae426082"
)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Backend protocol double: records gestures, releases, and can block or fail an input."""

    def __init__(self, display: str = ":fake", width: int = 1280, height: int = 800) -> None:
        self.display = display
        self.screen = Screen(width, height, 0x400001, "Editor")
        self.sent: list[Gesture] = []
        self.attempts = 0
        self.releases = 0
        self.fail_input: Exception | None = None
        self.fail_capture = False
        self.block: anyio.Event | None = None
        self.started = anyio.Event()
        self._interrupted = False

    async def status(self) -> Screen:
        return self.screen

    async def capture(self) -> tuple[bytes, int, int]:
        if self.fail_capture:
            raise GuiError("tool_error", "capture failed")
        return TINY_PNG, self.screen.width, self.screen.height

    async def send(self, gesture: Gesture) -> None:
        self.attempts += 1
        self.started.set()
        if self.block is not None:
            await self.block.wait()
            if self._interrupted:
                raise InputFailed("killed by gui.stop")
        if self.fail_input is not None:
            raise self.fail_input
        self.sent.append(gesture)

    async def release(self) -> None:
        self.releases += 1

    def interrupt(self) -> bool:
        if self.block is None or self.block.is_set():
            return False
        self._interrupted = True
        self.block.set()
        return True


def make_ctx(tmp: Path, **policy: Any) -> ToolsetContext:
    return ToolsetContext(workspace=tmp, policy=Policy(**policy), data_dir=tmp / "data")


@asynccontextmanager
async def gui_client(
    tmp: Path,
    backend: FakeBackend | None = None,
    clock: FakeClock | None = None,
    ctx: ToolsetContext | None = None,
    **policy: Any,
) -> AsyncIterator[tuple[Client, FakeBackend, FakeClock]]:
    """A real MCP client on a `gui` server over the fake backend; lock files under `tmp`. Pass
    `ctx` to reach its `stop_latch` (the device-level stop and resume)."""
    backend = backend or FakeBackend()
    clock = clock or FakeClock()
    ctx = ctx or make_ctx(tmp, **policy)
    server = build(ctx, backend=backend, clock=clock, lock_dir=tmp / "locks", settle_s=0)
    async with Client(server) as client:
        yield client, backend, clock


def data(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result.content
    return dict(result.structured_content)


def code(result: CallToolResult) -> str | None:
    """The error code of a failed call, None for a success."""
    return data(result).get("code") if result.is_error else None


async def observe(client: Client) -> str:
    result = await client.call_tool("observe", {})
    assert not result.is_error, result.content
    return str(data(result)["observation_id"])
