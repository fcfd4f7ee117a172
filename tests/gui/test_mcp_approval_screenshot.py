"""An AI assistant, through Orrery's MCP server, is shown the screenshot a GUI action was planned
on before it decides the action's approval: a real GUI agent under Xvfb (`gui.observe`, then a
`gui.click` on that observation waiting for approval), the official `mcp` client at `/mcp`."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ImageContent, TextContent

from tests.support import Fleet, wait_until

PNG = b"\x89PNG\r\n\x1a\n"


def test_get_approval_shows_a_gui_actions_screenshot_as_image_content(tmp_path: Path, xvfb: str) -> None:
    with Fleet(tmp_path, heartbeat_interval_s="1") as fleet:
        fleet.agent(
            "screen",
            extra_args=["--toolset", "gui", "--toolset", "system"],
            DISPLAY=xvfb,
            ORRERY_AGENT_APPROVAL_REQUIRED='["gui.click"]',
        )
        click = {"observation_id": "${nodes.look.output.observation_id}", "action_id": "mcp-click-1", "x": 5, "y": 5}
        dag = {
            "nodes": [
                {
                    "id": "look",
                    "placement": {"device": "screen"},
                    "commands": [{"tool": "gui.observe", "arguments": {}}],
                },
                {
                    "id": "n1",
                    "placement": {"device": "screen"},
                    "commands": [{"tool": "gui.click", "arguments": click}],
                },
            ],
            "edges": [{"from": "look", "to": "n1"}],
        }
        task = fleet.submit(dag)

        def pending() -> dict[str, Any] | None:
            with fleet.server.client() as c:
                items = c.get("/v1/approvals", params={"state": "pending", "task_id": task["id"]}).json()["items"]
            return items[0] if items else None

        approval = wait_until(pending, 60, "the click's approval")

        async def shown() -> list[Any]:
            headers = {"Authorization": f"Bearer {fleet.server.api_key}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as http,
                Client(streamable_http_client(f"{fleet.server.url}/mcp", http_client=http)) as mcp,
            ):
                result = await mcp.call_tool("get_approval", {"approval": approval["id"]})
                assert not result.is_error, result.content
                return list(result.content)

        content = anyio.run(shown)
        texts = [c for c in content if isinstance(c, TextContent)]
        images = [c for c in content if isinstance(c, ImageContent)]
        assert texts and '"tool":"gui.click"' in texts[0].text.replace(" ", "")
        assert len(images) == 1 and images[0].mime_type == "image/png"
        png = base64.b64decode(images[0].data)
        with fleet.server.client() as c:
            assert png == c.get(approval["screenshot_url"]).content  # the very image the action was planned on
        assert png.startswith(PNG)
        with fleet.server.client() as c:
            c.post(f"/v1/approvals/{approval['id']}/deny", json={"reason": "test over"})
