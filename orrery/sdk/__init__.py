"""Orrery's Python SDK: `Client` and `AsyncClient` over the REST API, typed answers, one error
tree, and the `Dag` builder (docs/sdk.md). It needs only httpx2 and pydantic, so it runs on a
device install too, and imports nothing of the orchestrator or the agent.

Its names are imported on first use (as `orrery`'s are): a program that needs only `Client`
never imports `AsyncClient` (anyio), and the CLI starts no slower than with a client of its own."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orrery.sdk.aio import AsyncClient
    from orrery.sdk.client import Client
    from orrery.sdk.config import default_api_key, default_server, server_url
    from orrery.sdk.dag import Command, Dag, ForEach, NodeRef, Ref, Retry, call
    from orrery.sdk.errors import (
        Conflict,
        DagError,
        Forbidden,
        InvalidRequest,
        NotFound,
        OrreryError,
        PayloadTooLarge,
        RateLimited,
        ServerError,
        Unauthorized,
        Unavailable,
        WaitTimeout,
    )
    from orrery.sdk.models import (
        Approval,
        Artifact,
        Attempt,
        Cancelling,
        Child,
        Device,
        Edge,
        Enrollment,
        Event,
        Frame,
        InputSent,
        LiveView,
        Node,
        Page,
        PlannedNode,
        Problem,
        Task,
        TaskWarning,
        Tool,
        ToolAnnotations,
        Validation,
        ViewEnd,
    )

__all__ = [
    "Approval",
    "Artifact",
    "AsyncClient",
    "Attempt",
    "Cancelling",
    "Child",
    "Client",
    "Command",
    "Conflict",
    "Dag",
    "DagError",
    "Device",
    "Edge",
    "Enrollment",
    "Event",
    "ForEach",
    "Forbidden",
    "Frame",
    "InputSent",
    "InvalidRequest",
    "LiveView",
    "Node",
    "NodeRef",
    "NotFound",
    "OrreryError",
    "Page",
    "PayloadTooLarge",
    "PlannedNode",
    "Problem",
    "RateLimited",
    "Ref",
    "Retry",
    "ServerError",
    "Takeover",
    "Task",
    "TaskWarning",
    "Tool",
    "ToolAnnotations",
    "Unauthorized",
    "Unavailable",
    "Validation",
    "ViewEnd",
    "WaitTimeout",
    "call",
    "default_api_key",
    "default_server",
    "server_url",
]

# Each name and the module it comes from.
_WHERE = {
    "Approval": "orrery.sdk.models",
    "Artifact": "orrery.sdk.models",
    "AsyncClient": "orrery.sdk.aio",
    "Attempt": "orrery.sdk.models",
    "Cancelling": "orrery.sdk.models",
    "Child": "orrery.sdk.models",
    "Client": "orrery.sdk.client",
    "Command": "orrery.sdk.dag",
    "Conflict": "orrery.sdk.errors",
    "Dag": "orrery.sdk.dag",
    "DagError": "orrery.sdk.errors",
    "Device": "orrery.sdk.models",
    "Takeover": "orrery.sdk.models",
    "Edge": "orrery.sdk.models",
    "Enrollment": "orrery.sdk.models",
    "Event": "orrery.sdk.models",
    "ForEach": "orrery.sdk.dag",
    "Forbidden": "orrery.sdk.errors",
    "Frame": "orrery.sdk.models",
    "InputSent": "orrery.sdk.models",
    "InvalidRequest": "orrery.sdk.errors",
    "LiveView": "orrery.sdk.models",
    "Node": "orrery.sdk.models",
    "NodeRef": "orrery.sdk.dag",
    "NotFound": "orrery.sdk.errors",
    "OrreryError": "orrery.sdk.errors",
    "Page": "orrery.sdk.models",
    "PayloadTooLarge": "orrery.sdk.errors",
    "PlannedNode": "orrery.sdk.models",
    "Problem": "orrery.sdk.models",
    "RateLimited": "orrery.sdk.errors",
    "Ref": "orrery.sdk.dag",
    "Retry": "orrery.sdk.dag",
    "ServerError": "orrery.sdk.errors",
    "Task": "orrery.sdk.models",
    "TaskWarning": "orrery.sdk.models",
    "Tool": "orrery.sdk.models",
    "ToolAnnotations": "orrery.sdk.models",
    "Unauthorized": "orrery.sdk.errors",
    "Unavailable": "orrery.sdk.errors",
    "Validation": "orrery.sdk.models",
    "ViewEnd": "orrery.sdk.models",
    "WaitTimeout": "orrery.sdk.errors",
    "call": "orrery.sdk.dag",
    "default_api_key": "orrery.sdk.config",
    "default_server": "orrery.sdk.config",
    "server_url": "orrery.sdk.config",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'orrery.sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value
