"""The safety and control frames round-trip, are reliable, go one way each, and refuse an
unknown budget or a negative generation like any malformed frame."""

from __future__ import annotations

import pytest

from protocol.codec import decode, encode
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import (
    AGENT_TO_SERVER,
    RELIABLE_TYPES,
    SERVER_TO_AGENT,
    ControlState,
    DeviceControl,
    Heartbeat,
    Hello,
    SafetyBreach,
    Welcome,
)


@pytest.mark.parametrize(
    "message",
    [
        SafetyBreach(seq=3, budget="destructive_per_minute", limit=5, detail="6 in 60 s"),
        SafetyBreach(seq=4, budget="consecutive_bad_outcomes", limit=2),
        DeviceControl(seq=9, control=ControlState(gen=4, stopped=True, reason="fire", resumed=2, budgets_reset=3)),
    ],
    ids=lambda m: m.type,
)
def test_the_safety_and_control_frames_round_trip(message: SafetyBreach | DeviceControl) -> None:
    assert decode(encode(message)) == message
    assert message.type in RELIABLE_TYPES


def test_each_goes_one_way() -> None:
    assert "safety_breach" in AGENT_TO_SERVER and "safety_breach" not in SERVER_TO_AGENT
    assert "device_control" in SERVER_TO_AGENT and "device_control" not in AGENT_TO_SERVER


def test_the_applied_generation_rides_on_hellos_and_heartbeats_and_the_desired_state_on_welcomes() -> None:
    beat = Heartbeat(state="idle", control_gen=5)
    assert decode(encode(beat)) == beat
    hello = Hello(device_id="d", versions=[1], control_gen=5)
    assert decode(encode(hello)) == hello
    welcome = Welcome(
        session_id="s",
        version=1,
        heartbeat_interval_s=1,
        heartbeat_timeout_s=5,
        max_frame_bytes=1000,
        resumed=False,
        control=ControlState(gen=2, stopped=True),
    )
    assert decode(encode(welcome)) == welcome


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "safety_breach", "seq": 1, "budget": "vibes", "limit": 1}',
        '{"type": "safety_breach", "seq": 1, "budget": "destructive_per_minute", "limit": 0}',
        '{"type": "device_control", "seq": 1, "control": {"gen": -1}}',
        '{"type": "device_control", "seq": 1, "control": {"gen": 1, "stopped": "yes please"}}',
        '{"type": "heartbeat", "state": "idle", "control_gen": -3}',
    ],
)
def test_an_unknown_budget_a_zero_limit_or_a_bad_generation_is_malformed(raw: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(raw)
    assert info.value.code is ErrorCode.MALFORMED_FRAME


def test_the_new_result_codes_are_known() -> None:
    assert {"budget_exceeded", "audit_unavailable", "approval_denied"} <= {c.value for c in ErrorCode}
