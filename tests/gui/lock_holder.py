"""A second agent process for the gui tests: `python -m tests.gui.lock_holder DISPLAY LOCK_DIR DATA_DIR`.

It builds its own `gui` toolset on DISPLAY and calls `observe` through a real MCP client, prints
`{"is_error", "code"}` as one JSON line, and then, if it got the display, holds it until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from mcp import Client

from device_agent.policy import Policy
from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.gui import build
from device_agent.toolsets.gui.x11 import X11Backend


async def main(display: str, lock_dir: Path, data_dir: Path) -> None:
    ctx = ToolsetContext(workspace=data_dir, policy=Policy(), data_dir=data_dir)
    async with Client(build(ctx, backend=X11Backend(display), lock_dir=lock_dir)) as client:
        result = await client.call_tool("observe", {})
        content = result.structured_content or {}
        print(json.dumps({"is_error": bool(result.is_error), "code": content.get("code")}), flush=True)
        if not result.is_error:
            await asyncio.Event().wait()  # hold the display until the test kills this process


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
