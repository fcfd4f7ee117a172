"""The codec turns every frame into a typed model and back, and refuses bad input with a code."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from protocol.codec import checked_decode, decode, encode
from protocol.errors import CloseCode, ErrorCode, ProtocolError
from protocol.messages import (
    BatchAccepted,
    Cancel,
    Command,
    CommandBatch,
    DeviceInfo,
    Error,
    Heartbeat,
    Hello,
    Result,
    ResultBatch,
    Resume,
    ToolsChanged,
    ToolSpec,
    Welcome,
)

EVERY_MESSAGE = [
    Hello(
        device_id="dev_1",
        agent_version="0.1",
        versions=[1],
        info=DeviceInfo(platform="linux", hostname="h", cpu_count=2, memory_mb=100),
        labels={"role": "web"},
        tools=[ToolSpec(name="shell.run", namespace="shell", input_schema={"type": "object"})],
        resume=Resume(session_id="s_1", last_seq=3),
    ),
    Welcome(
        session_id="s_1",
        version=1,
        heartbeat_interval_s=10,
        heartbeat_timeout_s=50,
        max_frame_bytes=4096,
        resumed=False,
    ),
    Heartbeat(state="busy", batch_id="b_1"),
    CommandBatch(
        seq=1,
        batch_id="b_1",
        task_id="t",
        node_id="n",
        attempt=1,
        fence=7,
        deadline=datetime(2026, 1, 1, tzinfo=UTC),
        commands=[Command(call_id="c1", tool="shell.run", arguments={"argv": ["ls"]}, timeout_s=5)],
    ),
    BatchAccepted(seq=2, ack=1, batch_id="b_1"),
    ResultBatch(
        seq=3,
        batch_id="b_1",
        fence=7,
        results=[Result(call_id="c1", status="success", result={"exit_code": 0}, namespace="shell")],
    ),
    Cancel(seq=4, batch_id="b_1", reason="cancelled"),
    ToolsChanged(seq=5, tools=[]),
    Error(code="stale_fence", message="old"),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: m.type)
def test_every_message_round_trips(message: object) -> None:
    text = encode(message)  # type: ignore[arg-type]
    assert decode(text) == message
    assert json.loads(text)["v"] == 1


def _code(data: str | bytes, **kw: int) -> tuple[ErrorCode, CloseCode]:
    with pytest.raises(ProtocolError) as info:
        decode(data, **kw)
    return info.value.code, info.value.close_code


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[1, 2]",
        "{}",
        '{"type": "nope"}',
        '{"type": "heartbeat", "state": "asleep"}',
        '{"type": "command_batch", "batch_id": "b"}',
        '{"type": "heartbeat", "state": "idle", "extra": 1}',
        '{"type": "heartbeat", "state": "idle", "seq": -1}',
        b"\xff\xfe",
    ],
)
def test_malformed_frames_are_refused_with_4400(raw: str | bytes) -> None:
    assert _code(raw) == (ErrorCode.MALFORMED_FRAME, CloseCode.MALFORMED)


def test_an_oversize_frame_is_refused_with_4413_before_parsing() -> None:
    frame = encode(Error(code="x", message="y" * 5000))
    assert _code(frame, max_bytes=4096) == (ErrorCode.FRAME_TOO_LARGE, CloseCode.TOO_LARGE)


def test_size_is_counted_in_utf8_bytes_not_characters() -> None:
    frame = encode(Error(code="x", message="é" * 3000))  # 3000 chars, 6000 bytes
    assert len(frame) < 4096
    assert _code(frame, max_bytes=4096)[1] is CloseCode.TOO_LARGE


def test_an_error_message_names_the_bad_field() -> None:
    with pytest.raises(ProtocolError) as info:
        decode('{"type": "heartbeat", "state": "asleep"}')
    assert "state" in info.value.message


def test_a_binary_frame_is_refused_with_4400_even_when_it_holds_a_valid_frame() -> None:
    """SPEC section 4: every frame is one JSON text object."""
    frame = encode(Heartbeat(state="idle"))
    assert decode(frame) == Heartbeat(state="idle")
    assert _code(frame.encode()) == (ErrorCode.MALFORMED_FRAME, CloseCode.MALFORMED)


@pytest.mark.parametrize("v", [0, 2, 99, 2**70, -1])
def test_a_frame_in_a_protocol_version_this_side_does_not_speak_is_refused_with_4426(v: int) -> None:
    frame = json.dumps({"v": v, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle"})
    assert _code(frame) == (ErrorCode.NO_COMMON_VERSION, CloseCode.NO_COMMON_VERSION)


@pytest.mark.parametrize("v", ["1", 1.0, True, None, [1]])
def test_a_version_that_is_not_an_integer_is_refused_with_4400(v: object) -> None:
    frame = json.dumps({"v": v, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle"})
    assert _code(frame) == (ErrorCode.MALFORMED_FRAME, CloseCode.MALFORMED)


def _outcome(parse: object, frame: str) -> object:
    try:
        return ("ok", repr(parse(frame)))  # type: ignore[operator]  # repr: a NaN argument equals itself
    except ProtocolError as exc:
        return (type(exc).__name__, exc.code, exc.close_code, exc.message)


HEARTBEAT = {"v": 1, "type": "heartbeat", "seq": 0, "ack": 0, "state": "idle"}
AWKWARD_FRAMES = [
    *(encode(m) for m in EVERY_MESSAGE),
    *(json.dumps({**HEARTBEAT, "v": v}) for v in ["1", 1.0, True, None, [1], 2, 0]),
    json.dumps({k: v for k, v in HEARTBEAT.items() if k != "v"}),  # v left out: version 1
    json.dumps({k: v for k, v in HEARTBEAT.items() if k != "type"}),
    json.dumps({**HEARTBEAT, "state": "sleepy"}),
    json.dumps({**HEARTBEAT, "extra": 1}),
    json.dumps({**HEARTBEAT, "seq": "0"}),  # lax: a digit string for an int, in both paths
    '{"v": 1, "type": "heartbeat", "seq": 0, "ack": 0, "state": "busy", "state": "idle"}',  # last key wins
    '{"v": 1, "type": "cancel", "seq": 1, "ack": 0, "batch_id": "b", "reason": "\\ud800"}',  # lone surrogate
    '{"v": 1, "type": "command_batch", "seq": 1, "ack": 0, "batch_id": "b", "task_id": "t", "node_id": "n",'
    ' "attempt": 1, "fence": 1, "commands": [{"call_id": "c", "tool": "x.y", "arguments": {"n": NaN}}]}',
    "[1, 2]",
    "not json",
    "",
]


@pytest.mark.parametrize("frame", AWKWARD_FRAMES)
def test_the_one_pass_parse_accepts_and_refuses_exactly_what_the_checked_parse_does(frame: str) -> None:
    """`decode` parses a frame in one pass and falls back to `checked_decode` on any failure: the
    same frames must come out, and every refusal must keep its code, close code and message."""
    assert _outcome(decode, frame) == _outcome(checked_decode, frame)
