"""The live view of a browser device: frames and forwarded input through the agent's own session
with Playwright's MCP server (the `browser` profile with the system Chromium), no port of its own.

The page's own server records what the browser really did (the click's request)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

from device_agent.audit import AuditLog
from device_agent.config import AgentConfig, browser_output_dir
from device_agent.router import Router
from device_agent.runner import mcp_host, toolset_context
from device_agent.screen.browser import BrowserSource, playwright_key
from device_agent.screen.source import Action
from device_agent.toolset_host import ToolsetHost
from tests.integration.test_browser_device import LoopbackPage, page, playwright_mcp  # noqa: F401 (a fixture)

FPS_SECONDS = 3.0


async def browser_router(tmp_path: Path, origin: str) -> Router:
    """The agent's browser toolset as the runner builds it, started."""
    config = AgentConfig(
        token="orrd_dev_view.x",
        data_dir=tmp_path / "agent",
        toolsets=["system", "browser"],
        browser={"command": [str(playwright_mcp())], "allowed_private_origins": [origin]},  # type: ignore[arg-type]
    )
    ctx = toolset_context(config)
    router = Router(ctx.policy, AuditLog(tmp_path / "audit.jsonl"), [], 256 * 1024)
    (server,) = config.all_mcp_servers()
    router.add(mcp_host(server, ctx))
    await router.start()
    return router


async def rect_of(host: ToolsetHost, element: str) -> tuple[int, int]:
    """The centre of an element of the page, in the page's (and so the frame's) CSS pixels."""
    box = await host.call(
        "browser_evaluate", {"function": f"() => JSON.stringify({element}.getBoundingClientRect())"}, 30
    )
    text = " ".join(getattr(c, "text", "") for c in box.content)
    found = re.search(r'"\{.*?\}"', text)
    assert found, text
    rect = json.loads(json.loads(found.group(0)))
    return int(rect["x"] + rect["width"] / 2), int(rect["y"] + rect["height"] / 2)


def test_a_browser_page_is_watched_clicked_and_typed_into_through_the_agents_own_session(
    tmp_path: Path,
    page: LoopbackPage,  # noqa: F811 (the fixture)
) -> None:
    async def run() -> tuple[float, list[str]]:
        router = await browser_router(tmp_path, page.origin)
        try:
            host = router.hosts["browser"]
            assert not any("mouse" in t.name for t in host.catalogue())  # tasks never see the view's tools
            await host.call("browser_navigate", {"url": page.url}, 30)
            source = BrowserSource(router, browser_output_dir(tmp_path / "agent"))
            frame = await source.grab(max_side=640, quality=60)
            assert frame.source == "browser" and frame.image[:2] == b"\xff\xd8"
            assert max(frame.width, frame.height) <= 640
            x, y = await rect_of(host, "document.getElementById('change')")
            await source.send(Action("click", x, y))
            page.wait_for(("POST", "/clicked"), "the forwarded click's request")
            # Typed text and a key go to what has the focus: the form's field, then Enter sends it.
            field = await rect_of(host, "document.querySelector('input[name=name]')")
            await source.send(Action("click", *field))
            await source.send(Action("type", text="Ada"))
            await source.send(Action("key", keys="enter"))
            page.wait_for(("submit", "Ada"), "the form sent with the typed name")
            started, frames = time.monotonic(), 0
            while time.monotonic() - started < FPS_SECONDS:
                await source.grab(max_side=1280, quality=70)
                frames += 1
            images = sorted(p.name for p in browser_output_dir(tmp_path / "agent").glob("*.jp*g"))
            return frames / (time.monotonic() - started), images
        finally:
            await router.stop()

    fps, files = asyncio.run(run())
    print(f"browser live view: {fps:.1f} frames/s on loopback")
    assert fps >= 2.0  # the default rate, with room to spare
    assert files == ["live-view.jpeg"]  # one frame file, overwritten: watching never fills the disk


def test_keys_take_playwrights_spelling() -> None:
    assert playwright_key("ctrl+shift+t") == "Control+Shift+t"
    assert playwright_key("enter") == "Enter"
    assert playwright_key("f5") == "F5"
    assert playwright_key("super+left") == "Meta+ArrowLeft"
