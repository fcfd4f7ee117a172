"""Agent nodes: a step loop that shows the model the task, the device's tools and what happened so
far, and turns its tool calls into command batches on the device (SPEC section 2, `kind: agent`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import Settings
from orchestrator.planner import calls as calls_
from orchestrator.planner.catalogue import tool_section
from orchestrator.planner.context import Context, tool_message
from orchestrator.planner.llm import LLM
from orchestrator.planner.prompts import render
from orchestrator.planner.screens import Limits

REPEATS_BEFORE_STOP = 2  # the same failing call this many times in a row stops the loop

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


def context_for(llm: LLM, settings: Settings) -> Context:
    limits = Limits(
        settings.llm_screenshot_max_side, settings.llm_screenshot_max_pixels, settings.llm_screenshot_max_bytes
    )
    return Context(llm.vision, settings.llm_screenshots_kept, limits)


async def run(llm: LLM, node: AgentNode, run_batch: RunBatch) -> AgentOutcome:
    context = context_for(llm, llm.settings)
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
        valid, outside = context.map_calls(valid)  # shown pixels -> the screenshot's
        errors += outside
        for err in errors:
            messages.append(tool_message(err.call_id, {"error": err.message}))
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
                tool_message(
                    final.call_id, {"error": "finish/fail must be the only call of a step; run the tools first"}
                )
            )
        if not actions:
            continue
        results = await run_batch([{"tool": c.tool, "arguments": c.arguments} for c in actions])
        outcome.tools_used += [c.tool for c in actions]
        await context.add_results(messages, actions, results)
        failure: tuple[str, str] | None = None
        for call, result in zip(actions, results, strict=False):
            if result.get("status") not in ("success", "skipped"):
                failure = (json.dumps([call.tool, call.arguments], sort_keys=True), json.dumps(result.get("error")))
                break
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
