"""Session and channel: seq/ack numbering, duplicates, order, hello-first, versions, resume."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import decode, encode
from protocol.errors import CloseCode, ErrorCode, ProtocolError
from protocol.messages import BatchAccepted, Cancel, Heartbeat, Hello, Message, Welcome
from protocol.session import Channel, Role, Session, negotiate_version


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
