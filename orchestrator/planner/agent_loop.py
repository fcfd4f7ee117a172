"""Agent nodes: a step loop that shows the model the task, the device's tools and what happened so
far, and turns its tool calls into command batches on the device (SPEC section 2, `kind: agent`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.planner import calls as calls_
from orchestrator.planner.catalogue import tool_section
from orchestrator.planner.llm import LLM
from orchestrator.planner.prompts import render

REPEATS_BEFORE_STOP = 2  # the same failing call this many times in a row stops the loop
RESULT_CHARS = 6_000  # of one tool result shown back to the model

# Runs commands [{"tool", "arguments"}] as one batch on the device, returns its results (dicts).
RunBatch = Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]]


@dataclass
class AgentOutcome:
    succeeded: bool
    output: Any = None
    error_code: str = ""
    error_message: str = ""
    steps: int = 0
    tools_used: list[str] = field(default_factory=list)


@dataclass
class AgentNode:
    task_id: str
    node_id: str
    instruction: str
    max_steps: int
    device: dict[str, Any]  # id, name, platform, tools (catalogue entries)


async def run(llm: LLM, node: AgentNode, run_batch: RunBatch) -> AgentOutcome:
    tools = node.device["tools"]
    schemas = {t["name"]: t.get("input_schema") or {} for t in tools}
    template = "agent_system_vision.j2" if llm.vision else "agent_system_text.j2"
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": render(
                template,
                device=node.device,
                instruction=node.instruction,
                max_steps=node.max_steps,
                tools=tool_section(tools),
            ),
        },
        {"role": "user", "content": node.instruction},
    ]
    offered = calls_.function_tools(tools)
    outcome = AgentOutcome(False)
    last_failure: tuple[str, str] | None = None
    repeats = 0
    for step in range(1, node.max_steps + 1):
        outcome.steps = step
        reply = await llm.chat(node.task_id, node.node_id, "agent", messages, tools=offered)
        messages.append(_assistant(reply.content, reply.tool_calls))
        if not reply.tool_calls:
            messages.append(
                {
                    "role": "user",
                    "content": "Call one of the tools, or `finish` with the answer, or "
                    "`fail` with the reason. Plain text is not an action.",
                }
            )
            continue
        valid, errors = calls_.parse(reply.tool_calls, schemas)
        for err in errors:
            messages.append(_tool_message(err.call_id, {"error": err.message}))
        final = next((c for c in valid if c.tool in (calls_.FINISH, calls_.FAIL)), None)
        actions = [c for c in valid if c.tool not in (calls_.FINISH, calls_.FAIL)]
        if final is not None and not actions and not errors:
            if final.tool == calls_.FINISH:
                outcome.succeeded, outcome.output = True, final.arguments.get("answer")
            else:
                outcome.error_code = "agent_failed"
                outcome.error_message = str(final.arguments.get("reason") or "the agent gave up without a reason")
            return outcome
        if final is not None:
            messages.append(
                _tool_message(
                    final.call_id, {"error": "finish/fail must be the only call of a step; run the tools first"}
                )
            )
        if not actions:
            continue
        results = await run_batch([{"tool": c.tool, "arguments": c.arguments} for c in actions])
        outcome.tools_used += [c.tool for c in actions]
        failure: tuple[str, str] | None = None
        images: list[dict[str, Any]] = []
        for call, result in zip(actions, results, strict=False):
            messages.append(_tool_message(call.call_id, _shown(result)))
            images += _images(result.get("result"))
            if result.get("status") not in ("success", "skipped") and failure is None:
                failure = (json.dumps([call.tool, call.arguments], sort_keys=True), json.dumps(result.get("error")))
        if images and llm.vision:
            messages.append(
                {"role": "user", "content": [{"type": "text", "text": "The latest screenshot:"}, *images[-1:]]}
            )
        repeats = repeats + 1 if failure is not None and failure == last_failure else 0
        last_failure = failure
        if repeats >= REPEATS_BEFORE_STOP - 1 and failure is not None:
            outcome.error_code = "agent_stuck"
            outcome.error_message = (
                f"the same call failed {REPEATS_BEFORE_STOP} times in a row without progress: " + failure[1]
            )
            return outcome
    outcome.error_code = "max_steps"
    outcome.error_message = f"the task was not finished within max_steps={node.max_steps}"
    return outcome


def _assistant(content: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if tool_calls:
        message["tool_calls"] = [
            {"id": tc["id"], "type": "function", "function": {"name": tc["name"], "arguments": tc["arguments"] or "{}"}}
            for tc in tool_calls
        ]
    return message


def _tool_message(call_id: str, body: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(body, default=str)[:RESULT_CHARS]}


def _shown(result: dict[str, Any]) -> dict[str, Any]:
    """A result as the model sees it: images replaced by a note (they are shown separately)."""
    return {
        "status": result.get("status"),
        "result": _without_images(result.get("result")),
        "error": result.get("error"),
    }


def _without_images(value: Any) -> Any:
    if isinstance(value, list):
        return [_without_images(v) for v in value]
    if isinstance(value, dict):
        if value.get("type") == "image":
            return {"type": "image", "mime_type": value.get("mime_type"), "note": "screenshot (shown separately)"}
        return {k: _without_images(v) for k, v in value.items()}
    return value


def _images(value: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(value, list):
        for v in value:
            found += _images(v)
    elif isinstance(value, dict):
        if value.get("type") == "image" and value.get("data"):
            url = f"data:{value.get('mime_type', 'image/png')};base64,{value['data']}"
            found.append({"type": "image_url", "image_url": {"url": url}})
        else:
            for v in value.values():
                found += _images(v)
    return found
