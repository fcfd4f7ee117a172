"""Wall-clock conversions used for stored and emitted timestamps (UTC, ISO 8601 with offset)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def iso(ts: float) -> str:
    return utc(ts).isoformat()
