"""Orrery's neutral layer: what the orchestrator and the device agent share, and the `orrery` entry point.

`orrery.logs` and `orrery.exits` import nothing of the project's: both `orchestrator` and `device_agent`
use them, and neither imports the other. `orrery.cli` is the one place above both: it imports the
agent's CLI or the server's lazily, so a device install (no `server` extra) runs `orrery agent`.

`orrery.Client`, `orrery.AsyncClient`, `orrery.Dag` and the SDK's errors (orrery/sdk/) are the
REST API for Python programs; they need only the base install, and are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orrery.sdk import (
        AsyncClient,
        Client,
        Conflict,
        Dag,
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
        call,
    )

# The SDK (orrery/sdk/, docs/sdk.md), imported on first use: `import orrery` stays as light as
# the agent and the logs need it (no httpx2, no pydantic models built).
__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "Dag",
    "DagError",
    "Forbidden",
    "InvalidRequest",
    "NotFound",
    "OrreryError",
    "PayloadTooLarge",
    "RateLimited",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
    "call",
]
_SDK = frozenset(__all__)


def __getattr__(name: str) -> Any:
    if name in _SDK:
        from orrery import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'orrery' has no attribute {name!r}")
