"""When a failed attempt may run again, and after how long (SPEC section 2, retries)."""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.domain.model import RetryPolicy

# Failures that mean the attempt never started on the device.
NOT_STARTED_CODES = frozenset({"no_capable_device"})
# Never retried: the device refused on purpose, or the input is wrong and would fail again.
NEVER_RETRY_CODES = frozenset(
    {"queue_timeout", "policy_denied", "template_error", "cancelled", "invalid_arguments", "unknown_tool"}
)


def retry_safe(error_code: str, started: bool, tool_hints: Iterable[tuple[bool, bool]]) -> bool:
    """True if running the node again cannot repeat a side effect.

    `tool_hints` holds `(read_only, idempotent)` for each tool the attempt used. An attempt that
    never started is safe (queue timeouts excepted); otherwise every tool must be read-only or
    idempotent per its MCP hints.
    """
    if error_code in NEVER_RETRY_CODES:
        return False
    if not started or error_code in NOT_STARTED_CODES:
        return True
    return all(read_only or idempotent for read_only, idempotent in tool_hints)


def never_started(error_code: str, started: bool) -> bool:
    """The attempt certainly did not run on its device (it was never delivered, or the device
    refused it unrun), and nothing about the node itself forbids placing it again."""
    return not started and error_code not in NEVER_RETRY_CODES


def should_retry(attempts_made: int, policy: RetryPolicy, safe: bool) -> bool:
    return safe and attempts_made < policy.max_attempts


def backoff_s(attempts_made: int, policy: RetryPolicy, jitter: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(max, base * 2**(n-1))].

    `jitter` is a number in [0, 1) supplied by the caller, so this stays deterministic.
    """
    cap = min(policy.backoff_max_s, policy.backoff_s * (2 ** max(0, attempts_made - 1)))
    return float(cap * jitter)
