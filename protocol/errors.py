"""Protocol errors: one tree, each error carrying a stable wire code and a close code."""

from __future__ import annotations

import re
from enum import IntEnum, StrEnum


class CloseCode(IntEnum):
    """WebSocket close codes of SPEC section 4."""

    NORMAL = 1000
    GOING_AWAY = 1001
    TRY_AGAIN_LATER = 1013  # RFC 6455 registry: the server cannot take frames now; reconnect
    MALFORMED = 4400
    UNAUTHORIZED = 4401
    FORBIDDEN = 4403
    HELLO_TIMEOUT = 4408
    SUPERSEDED = 4409
    TOO_LARGE = 4413
    NO_COMMON_VERSION = 4426


class ErrorCode(StrEnum):
    """Codes carried by `error` frames and by result / attempt errors (SPEC section 4)."""

    # channel
    MALFORMED_FRAME = "malformed_frame"
    OUT_OF_ORDER = "out_of_order"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    HELLO_TIMEOUT = "hello_timeout"
    SUPERSEDED = "superseded"
    FRAME_TOO_LARGE = "frame_too_large"
    NO_COMMON_VERSION = "no_common_version"
    STALE_FENCE = "stale_fence"
    UNKNOWN_BATCH = "unknown_batch"
    # results and attempts
    TOOL_ERROR = "tool_error"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    # the command did not run: an earlier command of its batch failed (early exit) or the batch
    # was cancelled before it started (the agent's own code for what it skipped)
    SKIPPED = "skipped"
    DEVICE_LOST = "device_lost"
    POLICY_DENIED = "policy_denied"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_CAPABLE_DEVICE = "no_capable_device"
    TEMPLATE_ERROR = "template_error"
    UNCERTAIN = "uncertain"
    INTERNAL = "internal_error"
    DEVICE_ERROR = "device_error"  # a device reported a code outside RESULT_ERROR_CODES
    INPUT_REFUSED = "input_refused"  # the store refused what its device reported: the work ends here
    # ---- approvals
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_TIMEOUT = "approval_timeout"
    # ---- safety budgets: the agent's own refusals
    BUDGET_EXCEEDED = "budget_exceeded"  # a per-device safety budget was breached (agent config)
    AUDIT_UNAVAILABLE = "audit_unavailable"  # the audit line could not be written before the action
    # emergency stop
    DEVICE_STOPPED = "device_stopped"  # an operator stopped the device; only a device resume lifts it


# Codes a device may put in a result's `error.code`: the ones above plus those the built-in
# toolsets document (the GUI's observation rules, SPEC section 5). Anything else a device invents
# is stored and counted as `device_error`, its own code kept only inside the message, so a device
# cannot grow the orchestrator's metric label sets or its list of node error codes at will.
TOOLSET_ERROR_CODES = frozenset({"stale_observation", "id_conflict", "busy", "stopped", "action_limit"}) | {
    # ---- accessibility-grounded GUI: inputs aimed at an element (gui.click/type/set_value)
    "element_mismatch",  # the element_id does not carry the name the caller gave: nothing was done
    "element_not_actionable",  # the element is disabled or not visible now: nothing was done
}
# ---- artifacts: the codes of files.publish_artifact and files.fetch_artifact
TOOLSET_ERROR_CODES |= {
    "artifact_too_large",  # over the device's or the orchestrator's limit: nothing was sent
    "quota_exceeded",  # over the task's or the device's artifact quota: nothing was sent
    "artifact_not_found",  # the task has no artifact by that name or sha256
    "integrity_error",  # the bytes did not have their sha256: nothing was recorded or written
    "transfer_failed",  # the orchestrator refused the transfer (the batch ended, the token)
}
RESULT_ERROR_CODES = frozenset(c.value for c in ErrorCode) | TOOLSET_ERROR_CODES
MAX_REPORTED_CODE_CHARS = 64
MAX_ERROR_MESSAGE_CHARS = 4000
_UNSAFE_IN_CODE = re.compile(r"[^A-Za-z0-9_.:/-]")


def bounded_result_error(code: str, message: str) -> tuple[str, str]:
    """A device-reported result error as the orchestrator records it: a known code as is, any
    other as `device_error` with the original (truncated, reduced to safe characters) quoted in
    the message; the message capped to `MAX_ERROR_MESSAGE_CHARS`."""
    if code not in RESULT_ERROR_CODES:
        shown = _UNSAFE_IN_CODE.sub("?", code[:MAX_REPORTED_CODE_CHARS])
        if len(code) > MAX_REPORTED_CODE_CHARS:
            shown += "..."
        message = f"the device reported error code '{shown}', which Orrery does not know: {message}"
        code = ErrorCode.DEVICE_ERROR.value
    if len(message) > MAX_ERROR_MESSAGE_CHARS:
        message = message[: MAX_ERROR_MESSAGE_CHARS - 3] + "..."
    return code, message


class ProtocolError(Exception):
    """A violation of the device protocol. Fatal ones end the connection with `close_code`."""

    code: ErrorCode = ErrorCode.MALFORMED_FRAME
    close_code: CloseCode = CloseCode.MALFORMED
    fatal: bool = True

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedFrame(ProtocolError):
    code = ErrorCode.MALFORMED_FRAME
    close_code = CloseCode.MALFORMED


class OutOfOrder(ProtocolError):
    code = ErrorCode.OUT_OF_ORDER
    close_code = CloseCode.MALFORMED


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE
    close_code = CloseCode.TOO_LARGE


class NoCommonVersion(ProtocolError):
    code = ErrorCode.NO_COMMON_VERSION
    close_code = CloseCode.NO_COMMON_VERSION
