"""The `approval` toolset: `approval.request`, a model's way to ask a person before a step.

Every call of it waits for a person's decision like any command that needs approval (see
`device_agent.approvals`): the body below runs only once the request was approved, so its
answer is always `approved: true`; a denial or the expiry ends the call with `approval_denied`
or `approval_timeout` before it runs. It changes nothing on the device.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult
from pydantic import Field
from typing_extensions import TypedDict

from device_agent.toolsets.base import READ_ONLY, Toolkit, ToolsetContext, success, tool


class RequestResult(TypedDict):
    approved: bool
    note: str


def build(_ctx: ToolsetContext) -> MCPServer:
    kit = Toolkit("approval")

    @tool(kit, READ_ONLY)
    async def request(
        reason: Annotated[
            str,
            Field(
                min_length=1,
                max_length=2000,
                description="What you are about to do and why a person should confirm it first "
                "(shown to the person who decides).",
            ),
        ],
    ) -> Annotated[CallToolResult, RequestResult]:
        """Ask a person to confirm before a sensitive step (deleting data, sending a message,
        paying, anything hard to undo). The call waits until someone approves or denies it. If
        it returns, it was approved: go on with the step you described. A denial ends the call
        with error `approval_denied` (its message says why): do not do that step."""
        return success({"approved": True, "note": f"approved: {reason[:200]}"})

    return kit.server()
