"""Wall-clock conversions for stored and emitted timestamps (UTC, ISO 8601 with offset), and
batch deadlines."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from protocol.messages import Command


# A step stamps every row and event it writes with the same few times (its `now`, a node's
# `ready_since`), often dozens of times: each is converted once.
@lru_cache(maxsize=256)
def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


@lru_cache(maxsize=256)
def iso(ts: float) -> str:
    return utc(ts).isoformat()


BATCH_GRACE_S = 30.0  # added to a batch's command limits when its node sets no timeout_s


def batch_deadline(now: float, node_timeout_s: float | None, commands: list[Command]) -> float | None:
    """When an attempt must be over: the node's `timeout_s`, else its commands' own limits in a
    row plus a grace for delivery. Every command batch carries one, so a device that heartbeats
    but never answers cannot hold a node forever (agent steps with no commands get none)."""
    if node_timeout_s:
        return now + node_timeout_s
    if not commands:
        return None
    return now + sum(c.timeout_s for c in commands) + BATCH_GRACE_S
