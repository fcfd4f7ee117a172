"""The only place where wire text becomes typed frames, and back.

`decode` checks size before parsing, then JSON shape, then the frame schema, and raises a
`ProtocolError` whose close code says how the connection ends (SPEC section 4, close codes).
"""

from __future__ import annotations

import json

from pydantic import TypeAdapter, ValidationError

from protocol.errors import CloseCode, ErrorCode, FrameTooLarge, MalformedFrame, NoCommonVersion
from protocol.messages import SUPPORTED_VERSIONS, Error, Message

DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024

_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)


def decode(data: str | bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    """Parse one frame. Raises `FrameTooLarge` (4413), `MalformedFrame` (4400) or
    `NoCommonVersion` (4426, a frame written in a protocol version this side does not speak).

    A well-formed frame is parsed and checked in one pass by pydantic's JSON parser; any frame
    that fails it goes through `checked_decode`, which finds what is wrong in the order the
    contract states (size, JSON, object, type, version, schema) and says so. Both accept the same
    frames: the envelope's `v` is a strict integer in the schema too."""
    size = len(data) if isinstance(data, bytes) else utf8_len(data)
    if size > max_bytes:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {max_bytes} bytes")
    if not isinstance(data, str):
        # SPEC section 4: every frame is one JSON *text* object. A binary frame is refused even
        # when it holds valid JSON, so no peer comes to depend on a second encoding.
        raise MalformedFrame("binary frames are refused: send each frame as one JSON text message")
    try:
        message = _ADAPTER.validate_json(data)
    except ValidationError:
        return checked_decode(data)
    _check_version(message.v)
    return message


def checked_decode(data: str) -> Message:
    """Parse one frame step by step, raising the `ProtocolError` that names its first fault."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedFrame(f"frame is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise MalformedFrame("a frame must be a JSON object")
    if "type" not in raw:
        raise MalformedFrame("frame has no 'type'")
    _check_version(raw.get("v", SUPPORTED_VERSIONS[0]))
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise MalformedFrame(_describe(exc, raw.get("type"))) from None


def encode(message: Message) -> str:
    """Serialise a frame to compact JSON text (nulls kept: the shape is the contract)."""
    return message.model_dump_json()


# The WebSocket close code a library uses for a message over its size limit (RFC 6455: 1009).
WS_MESSAGE_TOO_BIG = 1009


def oversize_answer(limit: int, reason: str = "") -> tuple[str, int, str]:
    """What a side says when its WebSocket library refuses a frame over `limit` bytes: the
    `error` frame to send, and the close code and reason (SPEC section 4: 4413, not 1009)."""
    frame = encode(Error(code=ErrorCode.FRAME_TOO_LARGE, message=reason or f"frame exceeds the limit of {limit} bytes"))
    return frame, CloseCode.TOO_LARGE, ErrorCode.FRAME_TOO_LARGE.value


def _check_version(v: object) -> None:
    """The envelope's `v` names the protocol version the frame is written in (SPEC section 4)."""
    if type(v) is not int:  # not bool, float or "1": the envelope is exact
        raise MalformedFrame(f"'v' must be an integer protocol version, got {json.dumps(v)[:40]}")
    if v not in SUPPORTED_VERSIONS:
        raise NoCommonVersion(f"frame is written in protocol version {v}; this side speaks {list(SUPPORTED_VERSIONS)}")


def utf8_len(text: str) -> int:
    """The UTF-8 byte length of `text` (what a frame limit counts)."""
    # ASCII fast path: most frames are pure ASCII and len() is then the byte length.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _describe(exc: ValidationError, frame_type: object) -> str:
    problems = []
    for err in exc.errors()[:5]:
        # A key is the device's own text: shown escaped and cut, never as raw characters.
        loc = ".".join(str(p) if str(p).isprintable() else ascii(str(p))[1:41] for p in err["loc"])
        problems.append(f"{loc}: {err['msg']}")
    return f"invalid '{frame_type}' frame: " + "; ".join(problems)
