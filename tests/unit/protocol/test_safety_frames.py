"""Issue 18: the safety-budget frames round-trip, are reliable, go one way each, and refuse an
unknown budget like any malformed frame."""

from __future__ import annotations

import pytest

from protocol.codec import decode, encode
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import AGENT_TO_SERVER, RELIABLE_TYPES, SERVER_TO_AGENT, BudgetReset, SafetyBreach


@pytest.mark.parametrize(
    "message",
    [
        SafetyBreach(seq=3, budget="destructive_per_minute", limit=5, detail="6 in 60 s"),
        SafetyBreach(seq=4, budget="consecutive_bad_outcomes", limit=2),
        BudgetReset(seq=9, reason="uncordoned"),
    ],
    ids=lambda m: m.type,
)
def test_the_safety_frames_round_trip(message: SafetyBreach | BudgetReset) -> None:
    assert decode(encode(message)) == message
    assert message.type in RELIABLE_TYPES


def test_each_goes_one_way() -> None:
    assert "safety_breach" in AGENT_TO_SERVER and "safety_breach" not in SERVER_TO_AGENT
    assert "budget_reset" in SERVER_TO_AGENT and "budget_reset" not in AGENT_TO_SERVER


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "safety_breach", "seq": 1, "budget": "vibes", "limit": 1}',
        '{"type": "safety_breach", "seq": 1, "budget": "destructive_per_minute", "limit": 0}',
    ],
)
def test_an_unknown_budget_or_a_zero_limit_is_malformed(raw: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(raw)
    assert info.value.code is ErrorCode.MALFORMED_FRAME


def test_the_new_result_codes_are_known() -> None:
    assert {"budget_exceeded", "audit_unavailable", "approval_denied"} <= {c.value for c in ErrorCode}
