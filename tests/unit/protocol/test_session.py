"""Session and channel: seq/ack numbering, duplicates, order, hello-first, versions, resume; and the
policies both sides share (resuming, standalone acks on explicit times, the heartbeat answer)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import decode, encode
from protocol.errors import CloseCode, ErrorCode, ProtocolError
from protocol.messages import (
    BatchAccepted,
    Cancel,
    Command,
    CommandBatch,
    Heartbeat,
    Hello,
    Message,
    Result,
    ResultBatch,
    Resume,
    Welcome,
)
from protocol.session import ACK_DELAY_S, AckPolicy, Channel, Role, Session, negotiate_version


def _welcome(resumed: bool = False, session_id: str = "s_1") -> Welcome:
    return Welcome(
        session_id=session_id,
        version=1,
        heartbeat_interval_s=10,
        heartbeat_timeout_s=50,
        max_frame_bytes=1 << 20,
        resumed=resumed,
    )


def _hello(**kw: object) -> Hello:
    return Hello(device_id="dev", versions=[1], **kw)  # type: ignore[arg-type]


def test_reliable_frames_are_numbered_and_carry_the_confirmed_ack() -> None:
    s = Session("s")
    a = s.stamp(Cancel(batch_id="b1"))
    b = s.stamp(Cancel(batch_id="b2"))
    hb = s.stamp(Heartbeat(state="idle"))
    assert (a.seq, b.seq, hb.seq) == (1, 2, 0)
    assert s.unacked_count == 2


def test_ack_advances_only_when_the_application_confirms() -> None:
    s = Session("s")
    s.receive(BatchAccepted(seq=1, batch_id="b"))
    assert s.stamp(Heartbeat(state="idle")).ack == 0
    s.confirm(1)
    assert s.stamp(Heartbeat(state="idle")).ack == 1


def test_an_ack_releases_unacked_frames() -> None:
    s = Session("s")
    for i in range(3):
        s.stamp(Cancel(batch_id=f"b{i}"))
    s.receive(Heartbeat(state="idle", ack=2))
    assert [m.seq for m in s.unacked()] == [3]


def test_a_duplicate_reliable_frame_is_dropped() -> None:
    s = Session("s")
    assert s.receive(BatchAccepted(seq=1, batch_id="b")) is not None
    assert s.receive(BatchAccepted(seq=1, batch_id="b")) is None


def test_a_gap_in_seq_is_out_of_order_4400() -> None:
    s = Session("s")
    with pytest.raises(ProtocolError) as info:
        s.receive(BatchAccepted(seq=2, batch_id="b"))
    assert info.value.code is ErrorCode.OUT_OF_ORDER
    assert info.value.close_code is CloseCode.MALFORMED


def test_an_ack_for_a_frame_never_sent_is_refused() -> None:
    with pytest.raises(ProtocolError):
        Session("s").receive(Heartbeat(state="idle", ack=5))


def test_server_channel_requires_hello_first() -> None:
    ch = Channel(Role.SERVER)
    with pytest.raises(ProtocolError) as info:
        ch.receive(encode(Heartbeat(state="idle")))
    assert info.value.close_code is CloseCode.MALFORMED


def test_server_channel_refuses_frames_only_servers_send() -> None:
    ch = Channel(Role.SERVER)
    with pytest.raises(ProtocolError):
        ch.receive(encode(_welcome()))


def test_a_second_hello_is_out_of_order() -> None:
    ch = Channel(Role.SERVER)
    hello = ch.receive(encode(_hello()))
    assert isinstance(hello, Hello)
    ch.accept(hello, Session("s"), _welcome())
    with pytest.raises(ProtocolError) as info:
        ch.receive(encode(_hello()))
    assert info.value.code is ErrorCode.OUT_OF_ORDER


def test_version_negotiation_picks_the_highest_common_and_refuses_none_with_4426() -> None:
    assert negotiate_version([1, 2, 3]) == 1
    with pytest.raises(ProtocolError) as info:
        negotiate_version([7])
    assert info.value.close_code is CloseCode.NO_COMMON_VERSION


def test_resume_resends_exactly_what_the_peer_lacks() -> None:
    server = Session("s")
    for i in range(4):
        server.stamp(Cancel(batch_id=f"b{i}"))
    ch = Channel(Role.SERVER)
    hello = ch.receive(encode(_hello(resume={"session_id": "s", "last_seq": 2})))
    assert isinstance(hello, Hello)
    _welcome_text, resend = ch.accept(hello, server, _welcome(resumed=True, session_id="s"))
    assert [decode(f).seq for f in resend] == [3, 4]


# ---------------------------------------------------------------- property: exactly once, in order


class _Peer:
    """One side of a lossy link: sends reliable frames, receives, confirms at once."""

    def __init__(self, name: str) -> None:
        self.session = Session(name)
        self.delivered: list[str] = []

    def send(self, payload: str) -> Message:
        return self.session.stamp(Cancel(batch_id=payload))

    def receive(self, msg: Message) -> None:
        got = self.session.receive(msg)
        if got is not None and isinstance(got, Cancel):
            self.delivered.append(got.batch_id)
            self.session.confirm(got.seq)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=30),
    ops=st.lists(st.sampled_from(["deliver", "drop", "dup", "swap", "reconnect", "ack"]), max_size=200),
)
def test_any_mix_of_drops_duplicates_and_reorders_delivers_each_frame_once_in_order(n: int, ops: list[str]) -> None:
    """Frames cross a link that drops, duplicates and reorders. A reorder is a protocol error
    (SPEC: 4400), after which the connection is re-made and the session resumed. In the end
    every frame arrives exactly once, in order."""
    sender, receiver = _Peer("a"), _Peer("b")
    wire = [sender.send(f"m{i}") for i in range(n)]
    for op in ops:
        if not wire and op != "reconnect":
            continue
        if op == "deliver":
            msg = wire.pop(0)
            try:
                receiver.receive(msg)
            except ProtocolError:
                wire = sender.session.resume_from(receiver.session.confirmed_seq)
        elif op == "drop":
            wire.pop(0)
        elif op == "dup":
            wire.insert(0, wire[0])
        elif op == "swap" and len(wire) > 1:
            wire[0], wire[1] = wire[1], wire[0]
        elif op == "ack":
            sender.session.receive(receiver.session.stamp(Heartbeat(state="idle")))
        elif op == "reconnect":
            wire = sender.session.resume_from(receiver.session.confirmed_seq)
    # The link heals: reconnect and deliver everything left.
    for _ in range(n + 1):
        wire = sender.session.resume_from(receiver.session.confirmed_seq)
        for msg in wire:
            receiver.receive(msg)
    assert receiver.delivered == [f"m{i}" for i in range(n)]
    sender.session.receive(receiver.session.stamp(Heartbeat(state="idle")))
    assert sender.session.unacked_count == 0


def test_a_frame_received_but_never_confirmed_is_taken_again_after_a_resume() -> None:
    """Issue 12, defect 8: the server read result_batch seq 2, the engine never took it (the
    connection ended, or the engine was unavailable), the agent resumed and re-sent it. The
    re-sent copy must be delivered, and the ack must not cover it until it is confirmed."""
    server = Session("s")
    assert server.receive(BatchAccepted(seq=1, batch_id="b")) is not None
    server.confirm(1)
    assert server.receive(BatchAccepted(seq=2, batch_id="b2")) is not None  # read, never confirmed
    server.resume_from(0)  # the agent reconnects and resumes; it re-sends seq 2
    again = server.receive(BatchAccepted(seq=2, batch_id="b2"))
    assert again is not None and again.batch_id == "b2"
    assert server.stamp(Heartbeat(state="idle")).ack == 1
    server.confirm(2)
    assert server.stamp(Heartbeat(state="idle")).ack == 2


def test_after_a_resume_a_frame_already_confirmed_is_still_a_duplicate() -> None:
    server = Session("s")
    server.receive(BatchAccepted(seq=1, batch_id="b"))
    server.confirm(1)
    server.resume_from(0)
    assert server.receive(BatchAccepted(seq=1, batch_id="b")) is None


def _batch(batch_id: str) -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id, task_id="t", node_id="n", attempt=1, fence=1, commands=[Command(call_id="c", tool="x.y")]
    )


def _results(batch_id: str, seq: int) -> ResultBatch:
    return ResultBatch(seq=seq, batch_id=batch_id, fence=1, results=[Result(call_id="c", status="success")])


# ---------------------------------------------------------------- resuming


def test_a_hello_resumes_the_session_it_names_if_it_claims_no_frame_that_was_never_sent() -> None:
    server = Session("s1")
    server.stamp(_batch("b1"))
    server.stamp(_batch("b2"))
    assert server.resumes(_hello(resume=Resume(session_id="s1", last_seq=2)))
    assert server.resumes(_hello(resume=Resume(session_id="s1", last_seq=0)))
    assert not server.resumes(_hello(resume=Resume(session_id="s1", last_seq=3)))  # a peer from another life
    assert not server.resumes(_hello(resume=Resume(session_id="s2", last_seq=1)))
    assert not server.resumes(_hello())


def test_the_resume_point_is_what_the_agent_confirmed_not_what_merely_arrived() -> None:
    agent = Session("s1")
    agent.receive(_batch("b1").model_copy(update={"seq": 1}))
    agent.receive(_batch("b2").model_copy(update={"seq": 2}))
    agent.confirm(1)  # b2 arrived but was never written to the ledger
    assert agent.resume_point() == Resume(session_id="s1", last_seq=1)


def test_the_agent_keeps_its_session_only_when_the_welcome_resumes_that_very_session() -> None:
    agent = Session("s1")
    assert agent.resumed_by(_welcome(resumed=True, session_id="s1"))
    assert not agent.resumed_by(_welcome(resumed=False, session_id="s1"))
    assert not agent.resumed_by(_welcome(resumed=True, session_id="s2"))


def test_both_sides_agree_on_a_resume_and_the_server_resends_only_what_was_not_confirmed() -> None:
    server, agent = Session("s1"), Session("s1")
    sent = [server.stamp(_batch(f"b{i}")) for i in (1, 2, 3)]
    for frame in sent[:2]:
        agent.receive(frame)
    agent.confirm(2)
    hello = _hello(resume=agent.resume_point())  # the connection dropped; the agent comes back
    assert server.resumes(hello)
    channel = Channel(Role.SERVER)
    _, resend = channel.accept(hello, server, _welcome(resumed=True, session_id="s1"))
    assert len(resend) == 1 and '"batch_id":"b3"' in resend[0]
    assert agent.resumed_by(_welcome(resumed=True, session_id="s1"))


# ---------------------------------------------------------------- standalone acks


def _confirmed(session: Session, seq: int) -> None:
    session.receive(BatchAccepted(seq=seq, batch_id=f"a{seq}"))
    session.confirm(seq)


def test_nothing_confirmed_means_no_ack_is_owed() -> None:
    acks = AckPolicy(Session("s"))
    assert acks.confirmed(now=5.0) is None
    assert acks.next_ack_at is None and not acks.timer_ran(100.0)


def test_a_confirmation_owes_an_ack_delay_seconds_later() -> None:
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.5)
    _confirmed(session, 1)
    assert acks.confirmed(now=10.0) == 10.5
    assert acks.timer_ran(10.5)
    assert session.stamp(session.heartbeat_reply()).ack == 1  # the standalone ack
    assert acks.next_ack_at is None and not acks.timer_ran(10.5)  # paid: a second run sends nothing


def test_the_timer_is_trusted_with_the_time_so_float_rounding_cannot_make_it_early() -> None:
    """uvloop's clock is whole milliseconds: ms / 1000 + delay can be a hair above the clock
    reading (ms + delay_ms) / 1000 when the timer runs. Compared with the clock, the timer would
    look early and re-arm on every loop turn until the next millisecond (85 runs for one ack, in
    CI); the policy never reads a clock when the timer runs."""
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.01)
    _confirmed(session, 1)
    ms = next(m for m in range(1_000_000, 2_000_000) if (m + 10) / 1000 < m / 1000 + 0.01)
    due = acks.confirmed(now=ms / 1000)
    assert due is not None and (ms + 10) / 1000 < due  # the clock when the timer runs reads "early"
    assert acks.timer_ran(due)


def test_a_frame_that_carries_the_ack_first_makes_the_standalone_one_unnecessary() -> None:
    session = Session("s")
    acks = AckPolicy(session)
    _confirmed(session, 1)
    due = acks.confirmed(now=1.0)
    assert due == 1.0 + ACK_DELAY_S
    assert session.stamp(_batch("b1")).ack == 1  # a command batch went out meanwhile
    assert not acks.timer_ran(due)


def test_later_confirmations_ride_on_the_ack_already_waiting_and_do_not_push_it_back() -> None:
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.5)
    _confirmed(session, 1)
    assert acks.confirmed(now=1.0) == 1.5
    _confirmed(session, 2)
    assert acks.confirmed(now=1.4) is None  # the wait running covers it
    assert acks.timer_ran(1.5)
    assert session.stamp(session.heartbeat_reply()).ack == 2  # one ack for both


def test_a_confirmation_after_an_ack_went_out_starts_a_wait_of_its_own() -> None:
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.5)
    _confirmed(session, 1)
    acks.confirmed(now=1.0)
    session.stamp(Cancel(batch_id="b"))  # carries ack 1
    _confirmed(session, 2)
    assert acks.confirmed(now=1.2) == 1.7
    assert not acks.timer_ran(1.5)  # the first wait was paid; the timer set for it does nothing
    assert acks.timer_ran(1.7)


# ---------------------------------------------------------------- the server's heartbeat answer


def test_the_heartbeat_answer_names_the_batch_sent_and_not_yet_answered() -> None:
    session = Session("s")
    assert session.heartbeat_reply() == Heartbeat(state="idle")
    session.stamp(_batch("b1"))
    assert session.heartbeat_reply() == Heartbeat(state="busy", batch_id="b1")
    session.receive(BatchAccepted(seq=1, batch_id="b1"))
    assert session.heartbeat_reply().batch_id == "b1"  # accepted is not finished
    session.receive(_results("b0", seq=2))  # results of some older batch
    assert session.heartbeat_reply().batch_id == "b1"
    session.receive(_results("b1", seq=3))
    assert session.heartbeat_reply() == Heartbeat(state="idle")


def test_a_newer_batch_replaces_the_one_named_and_a_resume_keeps_it() -> None:
    session = Session("s")
    session.stamp(_batch("b1"))
    session.stamp(_batch("b2"))  # b1 was superseded (a re-plan, a new assignment)
    session.resume_from(0)
    assert session.heartbeat_reply() == Heartbeat(state="busy", batch_id="b2")
    session.receive(_results("b1", seq=1))
    assert session.heartbeat_reply().batch_id == "b2"
