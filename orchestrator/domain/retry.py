"""When a failed attempt may run again, and after how long (SPEC section 2, retries)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from orchestrator.domain.model import RetryPolicy

# Failures that mean the attempt never started on the device.
NOT_STARTED_CODES = frozenset({"no_capable_device"})
# Never retried: the device refused on purpose, or the input is wrong and would fail again.
NEVER_RETRY_CODES = frozenset(
    {
        "queue_timeout",
        "policy_denied",
        "template_error",
        "cancelled",
        "invalid_arguments",
        "unknown_tool",
        "approval_denied",
        "approval_timeout",
    }
)

# Safety budgets: a device that refused work because its owner's budget was breached
# refused on purpose; the work must not bounce on to other devices by itself.
NEVER_RETRY_CODES = NEVER_RETRY_CODES | {"budget_exceeded"}

# A node whose verify commands failed after its commands succeeded ran to the end and
# did not have the effect verify checks for: running it again would do the same.
NEVER_RETRY_CODES = NEVER_RETRY_CODES | {"verification_failed"}

# The model's context: a prompt template (ORRERY_PROMPTS_DIR) that fails to render fails
# every try on every device the same way until someone fixes the template.
NEVER_RETRY_CODES = NEVER_RETRY_CODES | {"prompt_error"}


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


_NEVER_RETRY_REASONS = {
    "queue_timeout": "no device took it within its queue_timeout_s",
    "policy_denied": "the device's policy refused it and would refuse it again",
    "template_error": "a reference in its arguments cannot be resolved, and would not be on another try",
    "cancelled": "it was cancelled",
    "invalid_arguments": "the tool refused its arguments and would refuse them again",
    "unknown_tool": "the device does not offer the tool",
    "no_capable_device": "no device can run it any more (placement or tools)",
    "planner_unavailable": "it needs an LLM and none is configured",
    "approval_denied": "a person denied it",
    "approval_timeout": "nobody decided on its approval within approval_timeout_s",
}
_NEVER_RETRY_REASONS["budget_exceeded"] = "the device refused it: one of its owner's safety budgets was breached"
_NEVER_RETRY_REASONS["verification_failed"] = "its commands ran and its verify commands showed they did not take effect"
_NEVER_RETRY_REASONS["no_matching_device"] = "no device matched its for_each when it became ready"
_NEVER_RETRY_REASONS["input_refused"] = "the store refused what its device reported, and would again"
_NEVER_RETRY_REASONS["prompt_error"] = "a prompt template failed to render, and would again until it is fixed"


def declared_hints(hints: Iterable[tuple[bool, bool]], declared: Iterable[bool]) -> tuple[tuple[bool, bool], ...]:
    """Tool hints with the submitter's word added: a command marked `idempotent: true` counts as
    idempotent whatever its tool says (SPEC section 2, retries)."""
    marks = list(declared)
    return tuple((ro, idem or (k < len(marks) and marks[k])) for k, (ro, idem) in enumerate(hints))


def not_retried(
    error_code: str, tools: Sequence[str] = (), hints: Sequence[tuple[bool, bool]] = (), agent: bool = False
) -> str:
    """Why a failed node with tries left was not run again: one sentence for its `error.not_retried`."""
    reason = _NEVER_RETRY_REASONS.get(error_code)
    if reason is not None:
        return f"not retried: {reason}"
    unsafe = list(dict.fromkeys(t for t, (ro, idem) in zip(tools, hints, strict=False) if not (ro or idem)))
    if not unsafe:
        return f"not retried: a '{error_code or 'failed'}' failure is final"
    names = ", ".join(unsafe)
    verb = "is" if len(unsafe) == 1 else "are"
    if agent:
        return f"not retried: the agent used {names}, which {verb} neither read-only nor idempotent"
    return (
        f"not retried: {names} {verb} neither read-only nor idempotent; "
        "mark the command idempotent: true if it is safe to repeat"
    )


def backoff_s(attempts_made: int, policy: RetryPolicy, jitter: float) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(max, base * 2**(n-1))].

    `jitter` is a number in [0, 1) supplied by the caller, so this stays deterministic.
    """
    cap = min(policy.backoff_max_s, policy.backoff_s * (2 ** max(0, attempts_made - 1)))
    return float(cap * jitter)
