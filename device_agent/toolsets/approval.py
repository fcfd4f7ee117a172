"""The `approval` toolset: `approval.request`, a model's way to ask a person before a step, and
`approval.ask_person`, its way to ask a person for what it cannot do alone (a second-factor code,
a CAPTCHA, a login only the owner may type): the person answers in words, or takes the device
over, does it, and hands it back with a note (the note is the answer).

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


class AskResult(TypedDict):
    answer: str
    by: str


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

    @tool(kit, READ_ONLY)
    async def ask_person(
        question: Annotated[
            str,
            Field(
                min_length=1,
                max_length=2000,
                description="What you need from a person and why (shown in the dashboard), e.g. 'the site asks for "
                "the second-factor code sent to the owner's phone'.",
            ),
        ],
    ) -> Annotated[CallToolResult, AskResult]:
        """Ask a person for something you cannot or must not do alone: a second-factor code, a
        CAPTCHA, a password only the owner may type, a decision nobody planned for. The call waits
        until someone answers: in words (`answer`), or by taking the device over, doing it
        themselves and handing it back with a note (then `answer` is their note, and the screen
        has changed: observe it again before acting). Nobody answering in time ends the call with
        `approval_timeout`; a refusal with `approval_denied`."""
        # Never reached: the agent answers this tool itself with the person's words (approvals).
        return success({"answer": "", "by": ""})

    return kit.server()
