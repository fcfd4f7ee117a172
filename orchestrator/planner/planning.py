"""Planning a DAG from a request, and re-planning the not-yet-run part after a failure.

A plan is checked by the same validation as an explicit DAG. When it is refused, the problems go
back to the model; after three refused rounds planning fails (SPEC section 6).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from orchestrator.domain.edits import EditList
from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem
from orchestrator.planner.llm import LLM, LlmError, parse_json
from orchestrator.planner.prompts import example_plan, render

PLAN_ROUNDS = 3
PLAN_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "nodes": DagSpec.model_json_schema()["properties"]["nodes"],
        "edges": DagSpec.model_json_schema()["properties"]["edges"],
    },
    "required": ["nodes"],
    "$defs": DagSpec.model_json_schema().get("$defs", {}),
}
EDIT_SCHEMA = EditList.model_json_schema()

Validate = Callable[[DagSpec], list[Problem]]


class PlanningFailed(Exception):
    def __init__(self, message: str, problems: list[Problem]) -> None:
        super().__init__(message)
        self.message = message
        self.problems = problems


def system_rules() -> str:
    return render("plan_system.j2", example=example_plan())


async def plan(llm: LLM, task_id: str, request: str, inventory: str, validate: Validate) -> tuple[str | None, DagSpec]:
    """(name, dag) for `request`, or `PlanningFailed` after three refused rounds."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_rules()},
        {"role": "user", "content": render("plan_user.j2", request=request, inventory=inventory)},
    ]
    problems: list[Problem] = []
    for _ in range(PLAN_ROUNDS):
        reply = await llm.chat(task_id, None, "plan", messages, schema=("dag", PLAN_SCHEMA))
        messages.append({"role": "assistant", "content": reply.content or ""})
        name, spec, problems = _read_plan(reply.content, validate)
        if spec is not None and not problems:
            return name, spec
        messages.append({"role": "user", "content": render("plan_repair.j2", problems=problems)})
    raise PlanningFailed(
        f"the model did not produce a valid plan in {PLAN_ROUNDS} rounds; last problems: "
        + "; ".join(f"{p.code}: {p.message}" for p in problems[:5]),
        problems,
    )


def _read_plan(content: str | None, validate: Validate) -> tuple[str | None, DagSpec | None, list[Problem]]:
    try:
        data = parse_json(content)
    except (ValueError, json.JSONDecodeError) as exc:
        return None, None, [Problem("invalid_json", f"the reply is not a JSON object: {exc}")]
    if not isinstance(data, dict):
        return None, None, [Problem("invalid_json", "the reply must be one JSON object with 'nodes' and 'edges'")]
    name = data.get("name") if isinstance(data.get("name"), str) else None
    try:
        spec = DagSpec.model_validate({"nodes": data.get("nodes"), "edges": data.get("edges") or []})
    except ValidationError as exc:
        return (
            name,
            None,
            [
                Problem("validation_error", f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}")
                for e in exc.errors()[:10]
            ],
        )
    return name, spec, validate(spec)


async def replan(llm: LLM, task_id: str, context: dict[str, Any]) -> EditList:
    """The edits the model proposes for a task whose node `context['failed']` failed for good."""
    messages = [
        {"role": "system", "content": render("replan_system.j2", rules=system_rules())},
        {"role": "user", "content": render("replan_user.j2", **context)},
    ]
    reply = await llm.chat(task_id, context["failed"], "replan", messages, schema=("dag_edits", EDIT_SCHEMA))
    try:
        return EditList.model_validate(parse_json(reply.content))
    except (ValueError, ValidationError) as exc:
        raise LlmError("replan_invalid", f"the re-planner's reply was not a valid edit list: {str(exc)[:300]}") from exc
