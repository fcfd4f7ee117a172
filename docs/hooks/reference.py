"""MkDocs hook: the reference pages' tables, generated from the code at build time.

A reference page holds hand-written prose and a marker such as `<!-- generated: cli -->`; at build
time `on_page_markdown` replaces the marker with Markdown generated from the code itself (the CLI's
click tree, the OpenAPI document, the settings and config models, the DAG models, the error code
registry), so the reference cannot drift from what the code does. Importing this module does
nothing but define functions: the product is imported only when a page asks for it.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")
ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


# ---------------------------------------------------------------- MkDocs events


def on_config(config: Any) -> Any:
    """The checkout the site is built from comes first on sys.path, so the pages describe this
    code and not another install of it."""
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return fill(markdown, where=getattr(getattr(page, "file", None), "src_uri", "?"))


def fill(markdown: str, where: str = "?") -> str:
    """`markdown` with every generator marker replaced by its generated Markdown."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{where}: unknown generated section '{name}' (known: {', '.join(sorted(GENERATORS))})")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)


# ---------------------------------------------------------------- Markdown helpers


def plain(text: str) -> str:
    """`text` with `<`, `>` and `&` escaped outside code spans, so `<data dir>` shows as text and
    not as an HTML tag, and `{` so that `{nodes, edges}` is not read as an attribute list; code
    spans stay as they are (Markdown shows them literally)."""
    parts = re.split(r"(`[^`\n]*`)", text)
    return "".join(
        part if i % 2 else part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("{", "\\{")
        for i, part in enumerate(parts)
    )


def esc(text: Any) -> str:
    """Text for a Markdown table cell: `plain`, on one line, with `|` escaped."""
    return plain(" ".join(str(text).split())).replace("|", "\\|")


def code(text: Any) -> str:
    """Inline code for a table cell (a `|` inside would still end the cell)."""
    value = str(text).replace("|", "\\|")
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}" if value else ""


def table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def prose(text: str | None) -> str:
    """A docstring or help text as a Markdown paragraph (no HTML, click's `\\b` markers gone)."""
    if not text:
        return ""
    return plain(inspect.cleandoc(text).replace("\b", ""))


def type_name(annotation: Any) -> str:
    """A type as the reader writes it: `int`, `str | None`, `list[str]`, `Path`, `"a" | "b"`."""
    import types
    import typing
    from enum import Enum

    if annotation is None or annotation is type(None):
        return "None"
    if annotation is Any:
        return "any"
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(code(json.dumps(a)) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]" if args else name
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return " | ".join(code(m.value) for m in annotation)
        return annotation.__name__
    return str(annotation)


def constraints(metadata: Iterable[Any]) -> str:
    """A field's bounds (`ge`, `gt`, `le`, `lt`, lengths, pattern) as short text."""
    symbols = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}
    out = []
    for item in metadata:
        for attr, symbol in symbols.items():
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{symbol} {value}")
        for attr, word in (("min_length", "min length"), ("max_length", "max length"), ("pattern", "pattern")):
            value = getattr(item, attr, None)
            if value is not None:
                out.append(f"{word} {code(value) if attr == 'pattern' else value}")
    return ", ".join(out)


def size(value: Any) -> str:
    """`4194304 (4 MiB)`: a byte count with its binary unit, when it has one."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024:
        for unit, factor in (("GiB", MiB * 1024), ("MiB", MiB), ("KiB", 1024)):
            if value % factor == 0:
                return f"{value} ({value // factor} {unit})"
    return str(value)


def default_of(field: Any, name: str = "") -> str:
    """A pydantic field's default as a table cell (`unset` for None, computed defaults called,
    byte counts of `*_bytes` settings with their unit)."""
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if hasattr(value, "value") and not isinstance(value, int | float | str):  # an enum member
        value = value.value
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json", exclude_defaults=True) or "{}"
    if isinstance(value, bool):
        return code(str(value).lower())
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float):
            return code(f"{value:g}")
        return code(size(value) if name.endswith("_bytes") else value)
    if isinstance(value, list | dict | tuple):
        return code(json.dumps(value, default=str)) if value else code("[]" if not isinstance(value, dict) else "{}")
    return code(str(value))


# ---------------------------------------------------------------- CLI


def cli_markdown() -> str:
    """Every `orrery` command and sub-command with its help, arguments and options, from the click
    tree the console script runs (`orrery.cli.command()`), and the agent's own sub-commands
    (`orrery agent kill-switch`, `approvals`, `approve`, `deny`), which its entry point dispatches."""
    import typer

    from device_agent import cli as agent_cli
    from device_agent import owner
    from orrery.cli import command

    out: list[str] = []
    root = command()
    out.append(_command_section(root, "orrery", 2))
    for name, sub in root.commands.items():
        out.append(_command_tree(sub, f"orrery {name}", 2))
        if name == "agent":
            for word, app in agent_cli.SUBCOMMANDS.items():
                out.append(_command_tree(typer.main.get_command(app), f"orrery agent {word}", 3))
            owner_group = typer.main.get_command(owner.app)
            for word, owner_cmd in getattr(owner_group, "commands", {}).items():
                out.append(_command_tree(owner_cmd, f"orrery agent {word}", 3))
    return "\n".join(out)


def cli_command_names() -> list[str]:
    """Every command line the CLI page documents (for tests: `orrery tasks submit` etc.)."""
    import typer

    from device_agent import cli as agent_cli
    from device_agent import owner
    from orrery.cli import command

    names: list[str] = []

    def walk(cmd: Any, path: str) -> None:
        names.append(path)
        for n, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {n}")

    walk(command(), "orrery")
    for word in agent_cli.SUBCOMMANDS:
        names.append(f"orrery agent {word}")
    for word in getattr(typer.main.get_command(owner.app), "commands", {}):
        names.append(f"orrery agent {word}")
    return names


def _command_tree(cmd: Any, path: str, level: int) -> str:
    parts = [_command_section(cmd, path, level)]
    for name, sub in getattr(cmd, "commands", {}).items():
        parts.append(_command_tree(sub, f"{path} {name}", min(level + 1, 4)))
    return "\n".join(parts)


def _command_section(cmd: Any, path: str, level: int) -> str:
    lines = [f"{'#' * level} `{path}`", ""]
    if cmd.help:
        lines += [prose(cmd.help), ""]
    params = [p for p in cmd.params if not getattr(p, "hidden", False)]
    usage = [path, *(["[OPTIONS]"] if any(p.param_type_name == "option" for p in params) else [])]
    usage += [
        p.name.upper() if p.required else f"[{p.name.upper()}]" for p in params if p.param_type_name == "argument"
    ]
    if getattr(cmd, "commands", None):
        usage.append("COMMAND [ARGS]...")
    lines += ["```text", " ".join(usage), "```", ""]
    if params:
        rows = []
        for p in params:
            rows.append(
                [
                    " ".join(code(o) for o in [*p.opts, *p.secondary_opts])
                    if p.param_type_name == "option"
                    else code(p.name.upper()) + " (argument)",
                    _param_type(p),
                    _param_default(p),
                    esc(p.help or "") + (f" (env {code(p.envvar)})" if p.envvar else ""),
                ]
            )
        lines.append(table(["name", "type", "default", "meaning"], rows))
    sub = getattr(cmd, "commands", None)
    if sub:
        lines.append("Commands: " + ", ".join(code(f"{path} {n}") for n in sub) + ".\n")
    return "\n".join(lines)


def _param_type(p: Any) -> str:
    if getattr(p, "is_flag", False):
        return "flag"
    descriptor = getattr(p, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    name = type_name(annotation) if annotation is not None else str(getattr(p, "type", ""))
    if p.multiple:
        name = name.removeprefix("list[").removesuffix("]") + ", repeatable"
    return esc(name)


def _param_default(p: Any) -> str:
    if p.required:
        return "required"
    value = p.default
    if value is None or value in ("", []):
        return ""
    if isinstance(value, bool):
        return code(str(value).lower())
    return code(value)


# ---------------------------------------------------------------- REST (OpenAPI)


@functools.cache
def orchestrator_app() -> Any:
    """The orchestrator's app as `orrery serve` builds it (nothing starts: no store, no server),
    with default settings whatever `ORRERY_*` variables the build runs with."""
    from orchestrator.app import create_app
    from orchestrator.config import Settings

    return create_app(Settings.model_construct(), migrate=False)


def openapi() -> dict[str, Any]:
    """The orchestrator's OpenAPI document (what `/openapi.json` serves)."""
    document: dict[str, Any] = orchestrator_app().openapi()
    return document


def route_roles() -> dict[tuple[str, str], str]:
    """(METHOD, path) -> the least API key role a route admits, read from its dependencies."""
    from fastapi.routing import APIRoute

    from orchestrator.domain.model import Role

    roles: dict[tuple[str, str], str] = {}

    def needed(dependant: Any) -> Role | None:
        for dep in dependant.dependencies:
            call = dep.call
            closure = getattr(call, "__closure__", None) or ()
            for cell in closure:
                if isinstance(cell.cell_contents, Role):
                    return cell.cell_contents
            found = needed(dep)
            if found is not None:
                return found
        return None

    def walk(routes: Iterable[Any]) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI's record of include_router
            if included is not None:
                walk(included.routes)
            elif isinstance(route, APIRoute) and route.include_in_schema:
                role = needed(route.dependant)
                for method in route.methods or ():
                    roles[(method.upper(), route.path)] = role.value if role else "none"

    walk(orchestrator_app().routes)
    return roles


def rest_markdown() -> str:
    doc = openapi()
    roles = route_roles()
    out: list[str] = []
    tags: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            tags.setdefault((op.get("tags") or ["other"])[0], []).append((method.upper(), path, op))
    for tag, operations in tags.items():
        out.append(f"## {tag}\n")
        for method, path, op in operations:
            out.append(_operation(method, path, op, roles.get((method, path), "none")))
    out.append("## Schemas\n")
    out.append("Request and response bodies named above, from `components.schemas` of `/openapi.json`.\n")
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        out.append(_schema_section(name, schema))
    return "\n".join(out)


def _schema_ref(schema: dict[str, Any]) -> str:
    """A schema as a short type: a link to a named schema, `array of X`, or its JSON type."""
    if schema.get("title") == "Problem":  # the problem+json body of every error answer
        return "[problem](error-codes.md)"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_schema_ref(s) for s in schema[key])
    if schema.get("type") == "array":
        return f"array of {_schema_ref(schema.get('items', {}))}"
    if "enum" in schema:
        return " | ".join(code(v) for v in schema["enum"])
    if schema.get("type") == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        return f"map of {_schema_ref(extra) if isinstance(extra, dict) else 'any'}"
    kind = schema.get("type", "any")
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def _anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _operation(method: str, path: str, op: dict[str, Any], role: str) -> str:
    lines = [f"### `{method} {path}`", ""]
    summary = f"**{esc(op['summary'])}**. " if op.get("summary") else ""
    lines += [f"{summary}Role: {code(role) if role != 'none' else 'none (no API key)'}.", ""]
    if op.get("description"):
        lines += [prose(op["description"]), ""]
    params = op.get("parameters", [])
    if params:
        rows = [
            [
                code(p["name"]),
                p.get("in", ""),
                esc(_schema_ref(p.get("schema", {}))),
                "yes" if p.get("required") else "no",
                esc(p.get("description", "")),
            ]
            for p in params
        ]
        lines += ["Parameters:", "", table(["name", "in", "type", "required", "meaning"], rows)]
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({code(media)}): {_schema_ref(content.get('schema', {}))}.", ""]
    rows = []
    for status, response in sorted(op.get("responses", {}).items()):
        contents = response.get("content", {})
        shapes = [f"{code(m)} {esc(_schema_ref(c.get('schema', {})))}".strip() for m, c in contents.items()]
        rows.append([code(status), esc(response.get("description", "")), "; ".join(shapes)])
    lines += ["Responses:", "", table(["status", "meaning", "body"], rows)]
    return "\n".join(lines)


def _schema_section(name: str, schema: dict[str, Any]) -> str:
    lines = [f"### {name} {{#{_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [prose(schema["description"]), ""]
    if "enum" in schema:
        lines += ["One of " + ", ".join(code(v) for v in schema["enum"]) + ".", ""]
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if props:
        rows = [
            [code(key), esc(_schema_ref(value)), "yes" if key in required else "no", esc(value.get("description", ""))]
            for key, value in props.items()
        ]
        lines.append(table(["field", "type", "required", "meaning"], rows))
    return "\n".join(lines)


# ---------------------------------------------------------------- server settings


def server_settings_markdown() -> str:
    from orchestrator.config import Settings

    rows = []
    for name, field in Settings.model_fields.items():
        rows.append(
            [
                code(f"ORRERY_{name.upper()}") + "<br>" + code(f"--{name.replace('_', '-')}"),
                esc(type_name(field.annotation)) + (f" ({esc(constraints(field.metadata))})" if field.metadata else ""),
                default_of(field, name),
                esc(field.description or ""),
            ]
        )
    return table(["variable and `orrery serve` flag", "type", "default", "meaning"], rows)


# ---------------------------------------------------------------- agent configuration


def agent_flags() -> dict[str, str]:
    """Agent setting -> its `orrery agent` flag, read from the command: the `overrides` mapping
    of `device_agent.cli.agent` names, for each setting, the parameter that sets it."""
    import typer

    from device_agent import cli as agent_cli

    tree = ast.parse(textwrap.dedent(inspect.getsource(agent_cli.agent)))
    params: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "overrides" for t in targets) and isinstance(
                node.value, ast.Dict
            ):
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    arg = value.args[0] if isinstance(value, ast.Call) and value.args else value
                    if isinstance(key, ast.Constant) and isinstance(arg, ast.Name):
                        params[str(key.value)] = arg.id
    click_cmd = typer.main.get_command(agent_cli.app)
    opts = {p.name: p.opts[0] for p in click_cmd.params if p.param_type_name == "option"}
    return {setting: opts[param] for setting, param in params.items() if param in opts}


def agent_config_markdown() -> str:
    from device_agent.config import (
        AgentConfig,
        BrowserProfile,
        McpOAuthConfig,
        McpServerConfig,
        RecordingSettings,
        ViewSettings,
    )

    flags = agent_flags()
    rows = []
    for name, field in AgentConfig.model_fields.items():
        rows.append(
            [
                "<br>".join(
                    [code(name), *([code(flags[name])] if name in flags else []), code(f"ORRERY_AGENT_{name.upper()}")]
                ),
                esc(type_name(field.annotation)) + (f" ({esc(constraints(field.metadata))})" if field.metadata else ""),
                default_of(field, name) if name not in ("browser", "view", "recording") else "see below",
                esc(field.description or ""),
            ]
        )
    out = [
        "### `[agent]`\n",
        table(["TOML key, flag and variable", "type", "default", "meaning"], rows),
        "\n### `[[agent.mcp_servers]]`\n",
        prose(McpServerConfig.__doc__) + "\n",
        _model_table(McpServerConfig),
        "\n### `[agent.mcp_servers.oauth]`\n",
        prose(McpOAuthConfig.__doc__) + "\n",
        _model_table(McpOAuthConfig),
        "\n### `[agent.browser]`\n",
        prose(BrowserProfile.__doc__) + "\n",
        _model_table(BrowserProfile),
        "\n### `[agent.view]`\n",
        prose(ViewSettings.__doc__) + "\n",
        _model_table(ViewSettings),
        "\n### `[agent.recording]`\n",
        prose(RecordingSettings.__doc__) + "\n",
        _model_table(RecordingSettings),
    ]
    return "\n".join(out)


def _model_table(model: Any, notes: dict[str, str] | None = None) -> str:
    rows = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        description = field.description or (notes or {}).get(f"{model.__name__}.{name}", "")
        rows.append(
            [
                code(key),
                esc(type_name(field.annotation)),
                default_of(field, name),
                esc(constraints(field.metadata)),
                esc(description),
            ]
        )
    return table(["key", "type", "default", "allowed", "meaning"], rows)


# ---------------------------------------------------------------- DAG format

# What each field of the submission models means. The models carry names, types, defaults and
# bounds; these sentences carry the meaning (tests/docs check every field has one).
DAG_NOTES = {
    "TaskCreate.name": "the task's name, shown in lists (default: `task-` and the end of its id)",
    "TaskCreate.request": "plain text for the planner (needs an LLM); exactly one of `request` or `dag`",
    "TaskCreate.dag": "the nodes and edges to run; exactly one of `request` or `dag`",
    "TaskCreate.priority": "added to each node's own priority: higher runs first when devices are busy",
    "TaskCreate.labels": "free-form labels kept with the task",
    "TaskCreate.replan": (
        "let the planner re-plan the rest after a node fails (up to `ORRERY_MAX_REPLANS` times; needs an LLM); "
        "always on for a `request`"
    ),
    "DagSpec.nodes": "the nodes, at least one; ids unique in the task",
    "DagSpec.edges": "the edges between nodes; none means every node may run at once",
    "NodeSpec.id": "the node's id: a slug, unique in its task, used by edges and `${nodes.<id>...}` references",
    "NodeSpec.kind": "`tool` runs `commands`; `agent` runs an LLM step loop driven by `instruction`",
    "NodeSpec.placement": "which device runs the node; left out: any device whose catalogue has every tool it uses",
    "NodeSpec.commands": "a `tool` node's commands, run in order on one device; after a failure the rest are skipped",
    "NodeSpec.instruction": "an `agent` node's task in plain text, instead of `commands`",
    "NodeSpec.max_steps": "an `agent` node's step budget",
    "NodeSpec.retry": "how often and how soon a failed attempt is retried (only when a retry is safe)",
    "NodeSpec.queue_timeout_s": "a node no device took within this fails with `queue_timeout` (default: the server's)",
    "NodeSpec.timeout_s": "the whole attempt's deadline on its device",
    "NodeSpec.priority": "added to the task's priority: higher runs first in a device's queue",
    "NodeSpec.for_each": "fan-out: run the node once on every matching device (replaces `placement`)",
    "NodeSpec.verify": (
        "read-only commands that decide whether the node succeeded: after its commands, or when their "
        "outcome is unknown (the device died mid-command); a failing check fails the node"
    ),
    "NodeSpec.record": (
        "screen recordings of its attempts on a GUI or browser device: `failures` keeps one only when the "
        "attempt fails, is uncertain or is cancelled (the default for agent nodes and nodes using `gui`/`browser` "
        "tools), `always` keeps each, `off` records nothing; kept as the attempt's artifact (WebM)"
    ),
    "EdgeSpec.source": "the upstream node's id",
    "EdgeSpec.target": "the downstream node's id",
    "EdgeSpec.on": (
        "`success`: run `to` only if `from` succeeded; `failure`: only if it failed (compensation); "
        "`always`: either way"
    ),
    "Placement.device": "a device's id or name: only that device runs the node",
    "Placement.labels": "every label must match the device's",
    "Placement.platform": "the device's platform",
    "CommandSpec.tool": "`namespace.tool`, e.g. `shell.run`, `files.read`, `git.git_status`",
    "CommandSpec.arguments": (
        "the tool's arguments (its input schema); strings may hold `${nodes.<id>.output}` references"
    ),
    "CommandSpec.timeout_s": "the command's own timeout on the device",
    "CommandSpec.idempotent": (
        "the submitter vouches that running it twice does no harm, so a failure after it started may be retried"
    ),
    "RetryPolicy.max_attempts": "attempts in all, the first included",
    "RetryPolicy.backoff_s": "the base wait between attempts, doubling each time (full jitter: a random wait up to it)",
    "RetryPolicy.backoff_max_s": "the longest wait between attempts",
    "ForEach.labels": "every device whose labels match (with `platform`), found when the node becomes ready",
    "ForEach.platform": "every device of this platform (with `labels`)",
    "ForEach.devices": "devices named (names or ids), in this order; not with `labels`/`platform`",
    "ForEach.max_parallel": "at most this many children run at once (default: all)",
    "ForEach.canary": "this many devices run first; the rest only if all of them succeed",
    "ForEach.failure_budget": "K tolerates fewer than K failed children; the K-th failure stops the rollout",
}


def dag_models() -> list[Any]:
    """The submission's models, outermost first: the task, then each model a field of it names."""
    from pydantic import BaseModel

    from orchestrator.api.schemas import TaskCreate

    seen: list[Any] = []

    def visit(model: Any) -> None:
        if model in seen:
            return
        seen.append(model)
        for field in model.model_fields.values():
            for inner in _models_in(field.annotation, BaseModel):
                visit(inner)

    visit(TaskCreate)
    return seen


def _models_in(annotation: Any, base: type) -> list[Any]:
    if isinstance(annotation, type) and issubclass(annotation, base):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg, base)]


DAG_TITLES = {
    "TaskCreate": "Task (`POST /v1/tasks` body; `orrery submit` takes its `dag` with an optional `name`)",
    "DagSpec": "DAG (`dag`)",
    "NodeSpec": "Node (`dag.nodes[]`)",
    "Placement": "Placement (`placement`)",
    "CommandSpec": "Command (`commands[]`, `verify[]`)",
    "RetryPolicy": "Retry (`retry`)",
    "ForEach": "Fan-out (`for_each`)",
    "EdgeSpec": "Edge (`dag.edges[]`)",
}


def dag_markdown() -> str:
    out = []
    for model in dag_models():
        title = DAG_TITLES.get(model.__name__, model.__name__)
        out += [f"### {title}\n", _model_table(model, DAG_NOTES)]
    return "\n".join(out)


# ---------------------------------------------------------------- error codes


def error_codes_markdown() -> str:
    from orrery import error_codes

    out = []
    for kind, title in error_codes.KINDS.items():
        entries = [c for c in error_codes.CODES if c.kind == kind]
        out.append(f"## {title} {{#{kind}}}\n")
        out.append(prose(error_codes.KIND_NOTES.get(kind, "")) + "\n")
        if kind == "rest":
            rows = [[code(c.code), code(c.status) if c.status else "", esc(c.meaning)] for c in entries]
            out.append(table(["code", "HTTP status", "meaning"], rows))
        else:
            rows = [[code(c.code), esc(c.meaning)] for c in entries]
            out.append(table(["code", "meaning"], rows))
    out.append("## WebSocket close codes {#close}\n")
    out.append(prose(error_codes.KIND_NOTES["close"]) + "\n")
    rows = [[code(n), code(name), esc(meaning)] for n, (name, meaning) in error_codes.CLOSE_CODES.items()]
    out.append(table(["close code", "name", "meaning"], rows))
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_markdown,
    "rest": rest_markdown,
    "server-settings": server_settings_markdown,
    "agent-config": agent_config_markdown,
    "dag": dag_markdown,
    "error-codes": error_codes_markdown,
}
