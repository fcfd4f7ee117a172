"""Protocol errors: one tree, each error carrying a stable wire code and a close code."""

from __future__ import annotations

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
    DEVICE_LOST = "device_lost"
    POLICY_DENIED = "policy_denied"
    QUEUE_TIMEOUT = "queue_timeout"
    NO_CAPABLE_DEVICE = "no_capable_device"
    TEMPLATE_ERROR = "template_error"
    UNCERTAIN = "uncertain"
    INTERNAL = "internal_error"


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
