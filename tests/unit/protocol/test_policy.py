"""The policies both sides of a session share, sans I/O: resuming, standalone acks (times passed
in, no clock read), and the server's heartbeat answer. No sockets, no sleeps."""

from __future__ import annotations

from protocol.messages import (
    BatchAccepted,
    Cancel,
    Command,
    CommandBatch,
    Heartbeat,
    Hello,
    Result,
    ResultBatch,
    Resume,
    Welcome,
)
from protocol.session import ACK_DELAY_S, AckPolicy, Channel, Role, Session


def _batch(batch_id: str) -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id, task_id="t", node_id="n", attempt=1, fence=1, commands=[Command(call_id="c", tool="x.y")]
    )


def _results(batch_id: str, seq: int) -> ResultBatch:
    return ResultBatch(seq=seq, batch_id=batch_id, fence=1, results=[Result(call_id="c", status="success")])


def _hello(resume: Resume | None) -> Hello:
    return Hello(device_id="dev", versions=[1], resume=resume)


def _welcome(session_id: str, resumed: bool) -> Welcome:
    return Welcome(
        session_id=session_id,
        version=1,
        heartbeat_interval_s=10,
        heartbeat_timeout_s=50,
        max_frame_bytes=1 << 20,
        resumed=resumed,
    )


# ---------------------------------------------------------------- resuming


def test_a_hello_resumes_the_session_it_names_if_it_claims_no_frame_that_was_never_sent() -> None:
    server = Session("s1")
    server.stamp(_batch("b1"))
    server.stamp(_batch("b2"))
    assert server.resumes(_hello(Resume(session_id="s1", last_seq=2)))
    assert server.resumes(_hello(Resume(session_id="s1", last_seq=0)))
    assert not server.resumes(_hello(Resume(session_id="s1", last_seq=3)))  # a peer from another life
    assert not server.resumes(_hello(Resume(session_id="s2", last_seq=1)))
    assert not server.resumes(_hello(None))


def test_the_resume_point_is_what_the_agent_confirmed_not_what_merely_arrived() -> None:
    agent = Session("s1")
    agent.receive(_batch("b1").model_copy(update={"seq": 1}))
    agent.receive(_batch("b2").model_copy(update={"seq": 2}))
    agent.confirm(1)  # b2 arrived but was never written to the ledger
    assert agent.resume_point() == Resume(session_id="s1", last_seq=1)


def test_the_agent_keeps_its_session_only_when_the_welcome_resumes_that_very_session() -> None:
    agent = Session("s1")
    assert agent.resumed_by(_welcome("s1", resumed=True))
    assert not agent.resumed_by(_welcome("s1", resumed=False))
    assert not agent.resumed_by(_welcome("s2", resumed=True))


def test_both_sides_agree_on_a_resume_and_the_server_resends_only_what_was_not_confirmed() -> None:
    server, agent = Session("s1"), Session("s1")
    sent = [server.stamp(_batch(f"b{i}")) for i in (1, 2, 3)]
    for frame in sent[:2]:
        agent.receive(frame)
    agent.confirm(2)
    hello = _hello(agent.resume_point())  # the connection dropped; the agent comes back
    assert server.resumes(hello)
    channel = Channel(Role.SERVER)
    _, resend = channel.accept(hello, server, _welcome("s1", resumed=True))
    assert len(resend) == 1 and '"batch_id":"b3"' in resend[0]
    assert agent.resumed_by(_welcome("s1", resumed=True))


# ---------------------------------------------------------------- standalone acks


def _confirmed(session: Session, seq: int) -> None:
    session.receive(BatchAccepted(seq=seq, batch_id=f"a{seq}"))
    session.confirm(seq)


def test_nothing_confirmed_means_no_ack_is_owed() -> None:
    acks = AckPolicy(Session("s"))
    assert acks.confirmed(now=5.0) is None
    assert acks.next_ack_at is None and not acks.ack_due(now=100.0)


def test_a_confirmation_owes_an_ack_delay_seconds_later_and_not_before() -> None:
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.5)
    _confirmed(session, 1)
    assert acks.confirmed(now=10.0) == 10.5
    assert not acks.ack_due(now=10.49)
    assert acks.ack_due(now=10.5)
    assert session.stamp(session.heartbeat_reply()).ack == 1  # the standalone ack
    assert acks.next_ack_at is None and not acks.ack_due(now=11.0)


def test_a_frame_that_carries_the_ack_first_makes_the_standalone_one_unnecessary() -> None:
    session = Session("s")
    acks = AckPolicy(session)
    _confirmed(session, 1)
    due = acks.confirmed(now=1.0)
    assert due == 1.0 + ACK_DELAY_S
    assert session.stamp(_batch("b1")).ack == 1  # a command batch went out meanwhile
    assert not acks.ack_due(now=due)


def test_later_confirmations_ride_on_the_ack_already_waiting_and_do_not_push_it_back() -> None:
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.5)
    _confirmed(session, 1)
    assert acks.confirmed(now=1.0) == 1.5
    _confirmed(session, 2)
    assert acks.confirmed(now=1.4) is None  # the wait running covers it
    assert acks.ack_due(now=1.5)
    assert session.stamp(session.heartbeat_reply()).ack == 2  # one ack for both


def test_a_confirmation_after_an_ack_went_out_starts_a_wait_of_its_own() -> None:
    session = Session("s")
    acks = AckPolicy(session, delay_s=0.5)
    _confirmed(session, 1)
    acks.confirmed(now=1.0)
    session.stamp(Cancel(batch_id="b"))  # carries ack 1
    _confirmed(session, 2)
    assert acks.confirmed(now=1.2) == 1.7
    assert not acks.ack_due(now=1.5)  # the first wait was paid; the timer set for it does nothing
    assert acks.ack_due(now=1.7)


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
