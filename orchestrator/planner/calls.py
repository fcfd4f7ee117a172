"""Turning model output into commands: its own layer, so a malformed reply is a message the model
reads on its next step, never a crash (SPEC section 6).

Tool names are normalised (case, separators, an alias table, nearest real names suggested);
arguments are validated against the tool's input schema before anything reaches a device.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

FINISH = "finish"
FAIL = "fail"

# Names models commonly reach for, mapped to the real tools (only used when the real one exists).
ALIASES = {
    "bash": "shell.run",
    "sh": "shell.run",
    "shell": "shell.run",
    "exec": "shell.run",
    "run": "shell.run",
    "run_command": "shell.run",
    "execute": "shell.run",
    "shell.exec": "shell.run",
    "shell.execute": "shell.run",
    "read_file": "files.read",
    "cat": "files.read",
    "file.read": "files.read",
    "files.get": "files.read",
    "write_file": "files.write",
    "file.write": "files.write",
    "save_file": "files.write",
    "list_files": "files.list",
    "ls": "files.list",
    "list_dir": "files.list",
    "file.list": "files.list",
    "delete_file": "files.delete",
    "rm": "files.delete",
    "screenshot": "gui.observe",
    "take_screenshot": "gui.observe",
    "observe": "gui.observe",
    "click": "gui.click",
    "type": "gui.type",
    "type_text": "gui.type",
    "press_key": "gui.key",
    "key": "gui.key",
    "scroll": "gui.scroll",
    "system_info": "system.info",
    "info": "system.info",
}


@dataclass(frozen=True)
class Call:
    call_id: str
    tool: str  # the real `namespace.tool`, or FINISH / FAIL
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallError:
    call_id: str
    raw_name: str
    message: str  # written for the model: what was wrong and what to do instead


def function_name(tool: str) -> str:
    """OpenAI function names allow [A-Za-z0-9_-]: `shell.run` is offered as `shell__run`."""
    return tool.replace(".", "__")


def normalise(raw: str, known: set[str]) -> str | None:
    """The real tool a model meant by `raw`, or None."""
    candidates = [raw, raw.replace("__", "."), raw.strip().lower()]
    candidates.append(re.sub(r"[\s/:\-]+|__", ".", raw.strip().lower()))
    candidates.append(re.sub(r"[\s/:\-]+|__", "_", raw.strip().lower()))
    for c in candidates:
        if c in known:
            return c
        alias = ALIASES.get(c)
        if alias in known:
            return alias
    return None


def suggest(raw: str, known: set[str]) -> str:
    near = difflib.get_close_matches(raw.replace("__", "."), sorted(known), n=3, cutoff=0.4)
    return f"; the nearest are: {', '.join(near)}" if near else f"; available: {', '.join(sorted(known)[:30])}"


def validation_errors(arguments: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    if not schema:
        return []
    try:
        validator = Draft202012Validator(schema)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    except SchemaError:
        return []  # a device's broken schema is not the model's fault; the device will check
    out = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.path) or "(arguments)"
        out.append(f"{where}: {e.message}")
    return out


def parse(tool_calls: list[dict[str, Any]], schemas: dict[str, dict[str, Any]]) -> tuple[list[Call], list[CallError]]:
    """Model tool calls -> valid calls and errors. `schemas` maps real tool names to input schemas."""
    known = set(schemas)
    calls: list[Call] = []
    errors: list[CallError] = []
    for i, tc in enumerate(tool_calls):
        call_id = str(tc.get("id") or f"call_{i}")
        raw_name = str(tc.get("name") or "")
        try:
            args = json.loads(tc.get("arguments") or "{}")
        except json.JSONDecodeError as exc:
            errors.append(
                CallError(
                    call_id, raw_name, f"the arguments of {raw_name} are not valid JSON ({exc.msg}); send a JSON object"
                )
            )
            continue
        if not isinstance(args, dict):
            errors.append(CallError(call_id, raw_name, f"the arguments of {raw_name} must be a JSON object"))
            continue
        lowered = raw_name.lower()
        if lowered in (FINISH, FAIL):
            calls.append(Call(call_id, lowered, args))
            continue
        tool = normalise(raw_name, known)
        if tool is None:
            errors.append(
                CallError(call_id, raw_name, f"there is no tool '{raw_name}' on this device{suggest(raw_name, known)}")
            )
            continue
        problems = validation_errors(args, schemas[tool])
        if problems:
            errors.append(
                CallError(
                    call_id,
                    raw_name,
                    f"{tool} was called with invalid arguments: " + "; ".join(problems) + ". Fix them and call again.",
                )
            )
            continue
        calls.append(Call(call_id, tool, args))
    return calls, errors


def function_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The device catalogue as OpenAI function tools, plus `finish` and `fail`."""
    out = [
        {
            "type": "function",
            "function": {
                "name": function_name(t["name"]),
                "description": (t.get("description") or "")[:1000],
                "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ]
    out.append(
        {
            "type": "function",
            "function": {
                "name": FINISH,
                "description": "The task is done: give the answer it asked for.",
                "parameters": {
                    "type": "object",
                    "properties": {"answer": {"description": "the result"}},
                    "required": ["answer"],
                },
            },
        }
    )
    out.append(
        {
            "type": "function",
            "function": {
                "name": FAIL,
                "description": "The task cannot be done: say why.",
                "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]},
            },
        }
    )
    return out
