"""Fuzzing the wire: whatever arrives, the codec and the channel either accept a frame or refuse it with
a protocol error that carries a code; nothing else escapes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codec import decode
from protocol.errors import CloseCode, ErrorCode, ProtocolError
from protocol.messages import Hello, Welcome
from protocol.session import Channel, Role, Session

TYPES = [
    "hello",
    "welcome",
    "heartbeat",
    "command_batch",
    "batch_accepted",
    "result_batch",
    "cancel",
    "tools_changed",
    "error",
    "nope",
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=25,
)
frames = st.fixed_dictionaries(
    {"type": st.sampled_from(TYPES)},
    optional={
        "v": json_values,
        "seq": st.integers(-5, 20) | json_values,
        "ack": st.integers(-5, 20) | json_values,
        "device_id": st.text(max_size=10) | json_values,
        "versions": st.lists(st.integers(0, 3)) | json_values,
        "batch_id": st.text(max_size=10) | json_values,
        "fence": st.integers(-1, 5) | json_values,
        "commands": json_values,
        "results": json_values,
        "state": st.sampled_from(["idle", "busy", "x"]),
        "session_id": st.text(max_size=5),
        "resume": json_values,
        "tools": json_values,
        "version": st.integers(0, 2),
        "heartbeat_interval_s": st.floats(0, 20),
        "heartbeat_timeout_s": st.floats(0, 60),
        "max_frame_bytes": st.integers(0, 10**6),
        "resumed": st.booleans(),
    },
)


def refused_properly(exc: ProtocolError) -> None:
    assert isinstance(exc.code, ErrorCode)
    assert isinstance(exc.close_code, CloseCode)
    assert exc.message


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300) | st.text(max_size=300))
def test_random_bytes_and_text_are_decoded_or_refused_with_a_code(data: bytes | str) -> None:
    try:
        decode(data, max_bytes=256)
    except ProtocolError as exc:
        refused_properly(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame=frames, extra=st.dictionaries(st.text(max_size=8), json_values, max_size=3))
def test_frame_shaped_json_is_decoded_or_refused_with_a_code(frame: dict[str, Any], extra: dict[str, Any]) -> None:
    try:
        decode(json.dumps({**extra, **frame}))
    except ProtocolError as exc:
        refused_properly(exc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(frames, min_size=1, max_size=12))
def test_a_server_channel_survives_any_sequence_of_frames(sequence: list[dict[str, Any]]) -> None:
    channel = Channel(Role.SERVER)
    for frame in sequence:
        try:
            msg = channel.receive(json.dumps(frame))
        except ProtocolError as exc:
            refused_properly(exc)
            return  # a fatal protocol error ends the connection
        if isinstance(msg, Hello):
            welcome = Welcome(
                session_id="s",
                version=1,
                heartbeat_interval_s=1,
                heartbeat_timeout_s=5,
                max_frame_bytes=1 << 20,
                resumed=False,
            )
            channel.accept(msg, Session("s"), welcome)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequence=st.lists(frames, min_size=1, max_size=12))
def test_an_agent_channel_survives_any_sequence_of_frames(sequence: list[dict[str, Any]]) -> None:
    channel = Channel(Role.AGENT)
    for frame in sequence:
        try:
            msg = channel.receive(json.dumps(frame))
        except ProtocolError as exc:
            refused_properly(exc)
            return
        if isinstance(msg, Welcome):
            try:
                channel.open_agent(msg, Session(msg.session_id))
            except ProtocolError as exc:  # e.g. a "resumed" welcome acknowledging frames never sent
                refused_properly(exc)
                return
