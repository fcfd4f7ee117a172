"""The SDK's models and requests against the OpenAPI document the server serves: every field an
SDK model requires is in the server's schema with a type the SDK accepts, and every request the
SDK makes is a route of the API. A field renamed or removed on the server fails here."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
from pydantic import BaseModel

from orchestrator.app import create_app
from orchestrator.config import Settings
from orrery import sdk
from orrery.sdk import calls
from orrery.sdk.models import Answer
from protocol.messages import ToolAnnotations as WireToolAnnotations
from protocol.messages import ToolSpec

# SDK model -> the schema of the same thing on the server: an OpenAPI component, or (a device's
# tools are plain objects in the API) the protocol's model they are made from.
SERVER_SCHEMA: dict[type[BaseModel], str | type[BaseModel]] = {
    sdk.Task: "TaskOut",
    sdk.Node: "NodeOut",
    sdk.Attempt: "AttemptOut",
    sdk.Child: "ChildOut",
    sdk.Edge: "EdgeOut",
    sdk.TaskWarning: "WarningOut",
    sdk.Validation: "DryRunOut",
    sdk.Problem: "ProblemOut",
    sdk.PlannedNode: "DryRunNode",
    sdk.Device: "DeviceOut",
    sdk.Enrollment: "DeviceEnrolled",
    sdk.Approval: "ApprovalOut",
    sdk.Artifact: "ArtifactOut",
    sdk.Page: "Page",
    sdk.LiveView: "ViewOut",
    sdk.InputSent: "ViewInputOut",
    sdk.Tool: ToolSpec,
    sdk.ToolAnnotations: WireToolAnnotations,
}
NO_SCHEMA = {
    sdk.Event: "an event of the SSE stream: the OpenAPI document describes the stream in words only",
    sdk.Cancelling: "the cancel route answers a plain object (task_id, state) with no schema",
    sdk.Frame: "an event of a live view's SSE stream: the OpenAPI document describes it in words only",
    sdk.ViewEnd: "the last event of a live view's SSE stream: described in words only",
}
ANY = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})


@cache
def document() -> dict[str, Any]:
    return create_app(Settings.model_construct(), migrate=False).openapi()


def component(name: str) -> dict[str, Any]:
    schemas = document()["components"]["schemas"]
    found: dict[str, Any] = schemas.get(f"{name}-Output") or schemas[name]
    return found


def server_schema(target: str | type[BaseModel]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's schema for `target` and where its `$ref`s point."""
    if isinstance(target, str):
        return component(target), document()["components"]["schemas"]
    schema = target.model_json_schema(mode="serialization")
    return schema, schema.get("$defs", {})


def types(schema: dict[str, Any], defs: dict[str, Any]) -> frozenset[str]:
    """The JSON types a value valid for `schema` may have (every type when it says none)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return types(defs.get(name) or defs.get(name.removesuffix("-Output"), {}), defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return frozenset().union(*(types(s, defs) for s in schema[key]))
    if "allOf" in schema:
        return frozenset.intersection(*(types(s, defs) for s in schema["allOf"]))
    given = schema.get("type")
    if given is None:
        if "properties" in schema:
            return frozenset({"object"})
        if "const" in schema or "enum" in schema:
            values = schema.get("enum", [schema.get("const")])
            return frozenset({_json_type(v) for v in values})
        return ANY
    found = frozenset(given if isinstance(given, list) else [given])
    return found | {"integer"} if "number" in found else found


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}.get(
        type(value), "object" if isinstance(value, dict) else "array"
    )


def mismatches(model: type[BaseModel], schema: dict[str, Any], defs: dict[str, Any]) -> list[str]:
    """What the server's `schema` lacks or types otherwise than `model` needs."""
    own = model.model_json_schema(mode="validation")
    own_defs = own.get("$defs", {})
    server = schema.get("properties", {})
    found = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in server:
            if field.is_required():
                found.append(f"{model.__name__}.{key}: required by the SDK, not in the server's schema")
            continue
        sent = types(server[key], defs)
        taken = types(own["properties"][key], own_defs)
        if not sent <= taken:
            found.append(f"{model.__name__}.{key}: the server sends {sorted(sent)}, the SDK takes {sorted(taken)}")
    return found


def public_models() -> set[type[BaseModel]]:
    return {
        v
        for v in vars(sdk).values()
        if isinstance(v, type) and issubclass(v, Answer) and v is not Answer and "[" not in v.__name__
    }


@pytest.mark.parametrize("model", list(SERVER_SCHEMA), ids=lambda m: m.__name__)
def test_every_field_the_sdk_needs_is_in_the_servers_schema_with_a_type_it_takes(model: type[BaseModel]) -> None:
    schema, defs = server_schema(SERVER_SCHEMA[model])
    assert mismatches(model, schema, defs) == []


def test_every_public_model_is_checked_against_the_server_or_says_why_not() -> None:
    assert public_models() == set(SERVER_SCHEMA) | set(NO_SCHEMA)


def test_the_checker_sees_a_renamed_and_a_retyped_field() -> None:
    """Guard against a check that passes because it reads nothing."""
    schema, defs = server_schema("TaskOut")
    renamed = {**schema, "properties": {**schema["properties"]}}
    renamed["properties"]["status"] = renamed["properties"].pop("state")
    renamed["properties"]["created_at"] = {"type": "integer"}
    assert mismatches(sdk.Task, renamed, defs) == [
        "Task.state: required by the SDK, not in the server's schema",
        "Task.created_at: the server sends ['integer'], the SDK takes ['string']",
    ]


def test_a_newer_servers_extra_fields_are_kept_not_refused() -> None:
    task = sdk.Task.model_validate(
        {"id": "t1", "name": "n", "state": "running", "created_at": "2026-01-01T00:00:00+00:00", "shiny": {"new": 1}}
    )
    assert task.model_extra == {"shiny": {"new": 1}}
    assert not task.ended


# ---------------------------------------------------------------- requests


def _route(path: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$")


SAMPLE_CALLS: list[calls.Call[Any]] = [
    calls.submit({"dag": {}}, "key"),
    calls.validate({"dag": {}}),
    calls.task("t"),
    calls.tasks_page("running", 10, "c"),
    calls.cancel("t"),
    calls.rerun("t", "n"),
    calls.devices(),
    calls.device("d"),
    calls.enroll("d", {"k": "v"}),
    calls.approvals_page("pending", "t", "newest", 10, "c"),
    calls.approval("a"),
    calls.decide("a", "approve", "ok"),
    calls.decide("a", "deny"),
    calls.artifacts_page("t", True, 10, "c"),
    calls.artifact("t", "out.txt", 2),
    calls.artifact_content("t", "out.txt"),
    calls.Call("GET", calls.events_path("t"), lambda data: data),
    calls.open_view("d", 5, 640, 60, True),
    calls.send_input("d", "click", x=1, y=2, frame_width=8, frame_height=6),
]


@pytest.mark.parametrize("call", SAMPLE_CALLS, ids=lambda c: f"{c.method} {c.path}")
def test_every_request_the_sdk_makes_is_a_route_with_those_parameters(call: calls.Call[Any]) -> None:
    routes = [
        (ops[call.method.lower()], path)
        for path, ops in document()["paths"].items()
        if _route(path).match(call.path) and call.method.lower() in ops
    ]
    assert routes, f"no route {call.method} {call.path}"
    operation, _path = min(routes, key=lambda r: r[1].count("{"))  # the most literal template
    taken = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    assert set(call.params) <= taken
    headers = {p["name"].lower() for p in operation.get("parameters", []) if p["in"] == "header"}
    assert {h.lower() for h in call.headers} <= headers
