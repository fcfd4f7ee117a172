"""Per-session sequencing and per-connection handshake, sans I/O (SPEC section 4).

Two layers, in the style of websockets' `protocol.py`:

- `Session` numbers reliable frames (`seq`), tracks what the peer acknowledged (`ack`), keeps the
  unacknowledged frames for re-sending, and drops duplicates. It outlives a connection: a
  reconnecting agent names it in `hello.resume` and both sides re-send what the other lacks.
  The `ack` we send is what the application has *confirmed* (processed durably), never merely
  what arrived, so a crash between arrival and the durable write cannot lose a frame.
- `Channel` is one connection: frame size, hello-first, frame direction, version negotiation.
  It hands in-order, de-duplicated frames to the application and stamps outgoing ones.

The policies both sides must agree on live here too, not in the code that pumps the frames:
whether a hello resumes a session (`Session.resumes`, and `Session.resumed_by` on the agent's
side of the welcome), what a resuming hello names (`Session.resume_point`), when a standalone
ack is owed (`AckPolicy`), and what the server's heartbeat says (`Session.heartbeat_reply`).

Nothing here reads a clock or touches a socket; times are passed in and deadlines are the caller's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import cast

from protocol.codec import DEFAULT_MAX_FRAME_BYTES, decode, encode
from protocol.errors import MalformedFrame, NoCommonVersion, OutOfOrder
from protocol.messages import (
    AGENT_TO_SERVER,
    SERVER_TO_AGENT,
    SUPPORTED_VERSIONS,
    CommandBatch,
    Heartbeat,
    Hello,
    Message,
    ResultBatch,
    Resume,
    Welcome,
    is_reliable,
)
from protocol.text import inbound

ACK_DELAY_S = 0.05  # how long a standalone ack waits for a frame it could ride on


class Role(StrEnum):
    AGENT = "agent"
    SERVER = "server"


class Phase(StrEnum):
    HANDSHAKE = "handshake"  # server: waiting for hello; agent: waiting for welcome
    OPEN = "open"
    CLOSED = "closed"


class Session:
    """Reliable-frame bookkeeping for one logical session (may span several connections)."""

    def __init__(self, session_id: str, version: int = SUPPORTED_VERSIONS[-1]) -> None:
        self.session_id = session_id
        self.version = version
        self.sent_seq = 0  # last seq given to an outgoing reliable frame
        self.received_seq = 0  # highest contiguous reliable seq received from the peer
        self.confirmed_seq = 0  # highest received seq the application has processed; sent as ack
        self.peer_ack = 0  # highest of our seqs the peer acknowledged
        self.ack_sent = 0  # the ack carried by the last frame we stamped
        # The last command batch this session carried to the peer that no result batch has
        # answered yet: the server's own account of what its device is busy with.
        self.open_batch: str | None = None
        self._unacked: dict[int, Message] = {}

    # ------------------------------------------------------------------ resuming

    def resume_point(self) -> Resume:
        """Agent: what its next hello names to pick this session up again. `last_seq` is what
        the agent confirmed, so frames it received but never processed are sent again."""
        return Resume(session_id=self.session_id, last_seq=self.confirmed_seq)

    def resumes(self, hello: Hello) -> bool:
        """Server: does `hello` pick this session up? Only if it names it and claims no frame
        this side never sent (else the peer's state is not this session's, and it starts afresh)."""
        return (
            hello.resume is not None
            and hello.resume.session_id == self.session_id
            and hello.resume.last_seq <= self.sent_seq
        )

    def resumed_by(self, welcome: Welcome) -> bool:
        """Agent: did the server's `welcome` resume this session (rather than start a new one)?"""
        return welcome.resumed and welcome.session_id == self.session_id

    # ------------------------------------------------------------------ outgoing

    def stamp(self, message: Message) -> Message:
        """Give an outgoing frame its `seq` (reliable frames only) and our current `ack`."""
        update: dict[str, int] = {"ack": self.confirmed_seq, "v": self.version}
        self.ack_sent = self.confirmed_seq
        if isinstance(message, CommandBatch):
            self.open_batch = message.batch_id
        if is_reliable(message):
            self.sent_seq += 1
            update["seq"] = self.sent_seq
            stamped = message.model_copy(update=update)
            self._unacked[self.sent_seq] = stamped
            return stamped
        update["seq"] = 0
        return message.model_copy(update=update)

    def unacked(self) -> list[Message]:
        """Reliable frames the peer has not acknowledged, oldest first, with a fresh `ack`."""
        return [m.model_copy(update={"ack": self.confirmed_seq}) for m in self._unacked.values()]

    def resume_from(self, peer_last_seq: int) -> list[Message]:
        """After a resume: drop what the peer says it has, return the rest to re-send.

        Frames we received but never confirmed were not processed (the connection ended first,
        or processing failed); the peer re-sends them since our ack never covered them, so they
        must count as new again, not as duplicates of frames we have."""
        if peer_last_seq > self.sent_seq:
            raise OutOfOrder(f"peer claims seq {peer_last_seq} but only {self.sent_seq} were sent")
        self._acknowledge(peer_last_seq)
        self.received_seq = self.confirmed_seq
        return self.unacked()

    # ------------------------------------------------------------------ incoming

    def receive(self, message: Message) -> Message | None:
        """Account for an incoming frame. Returns it, or None for a duplicate reliable frame."""
        if message.ack > self.sent_seq:
            raise OutOfOrder(f"ack {message.ack} acknowledges a frame that was never sent")
        self._acknowledge(message.ack)
        if not is_reliable(message):
            if message.seq != 0:
                raise MalformedFrame(f"'{message.type}' frames carry seq 0, got {message.seq}")
            return message
        if message.seq <= self.received_seq:
            return None  # a re-send of something we already have
        if message.seq != self.received_seq + 1:
            raise OutOfOrder(f"expected seq {self.received_seq + 1}, got {message.seq}")
        self.received_seq = message.seq
        if isinstance(message, ResultBatch) and message.batch_id == self.open_batch:
            self.open_batch = None
        return message

    def heartbeat_reply(self) -> Heartbeat:
        """Server: the answer to a device's heartbeat (or a standalone ack). Its `ack` is stamped
        on sending; `state` is the batch this session carried to the device and has no results
        for, so the answer is the same on any replica, whether or not its engine runs."""
        if self.open_batch is None:
            return Heartbeat(state="idle")
        return Heartbeat(state="busy", batch_id=self.open_batch)

    @property
    def ack_owed(self) -> bool:
        """Frames were confirmed since the last ack we sent."""
        return self.ack_sent < self.confirmed_seq

    def confirm(self, seq: int) -> None:
        """The application has durably processed every reliable frame up to `seq`."""
        self.confirmed_seq = max(self.confirmed_seq, min(seq, self.received_seq))

    @property
    def unacked_count(self) -> int:
        return len(self._unacked)

    def _acknowledge(self, ack: int) -> None:
        if ack <= self.peer_ack:
            return
        self.peer_ack = ack
        for seq in [s for s in self._unacked if s <= ack]:
            del self._unacked[seq]


class AckPolicy:
    """When a standalone ack is due, given the time (sans I/O: the caller owns the timers).

    The peer keeps what we have not acknowledged (the agent's outbox holds results until our ack
    covers them), so a confirmation must be acknowledged soon; usually an outgoing frame carries
    the ack first and no extra frame is needed. The rule: an ack owed is sent no later than
    `delay_s` after the confirmation that made it owed, and one ack covers every confirmation
    made before it. The caller tells the policy of each confirmation (`confirmed`), sets a timer
    for the time it returns, and when that timer runs sends an ack if `timer_ran(due)` says so.
    The timer is trusted with the time: the policy never compares a clock with the deadline, so
    a timer that runs a hair early by float rounding (uvloop keeps whole milliseconds) cannot
    find itself early and re-arm turn after turn.
    """

    def __init__(self, session: Session, delay_s: float = ACK_DELAY_S) -> None:
        self.session = session
        self.delay_s = delay_s
        self._due: float | None = None
        self._covers = 0  # the confirmed seq the pending deadline is for

    def confirmed(self, now: float) -> float | None:
        """The application confirmed frames at `now`. Returns when a standalone ack falls due if
        this starts a new wait (set a timer for then), or None if nothing is owed or a wait
        already running will cover it."""
        if not self.session.ack_owed:
            return None
        if self.next_ack_at is not None:
            return None
        self._due, self._covers = now + self.delay_s, self.session.confirmed_seq
        return self._due

    @property
    def next_ack_at(self) -> float | None:
        """When the standalone ack owed now must go out, or None if none is owed (or an outgoing
        frame already carried everything the running wait was for)."""
        if self._due is None or not self.session.ack_owed or self.session.ack_sent >= self._covers:
            return None
        return self._due

    def timer_ran(self, due: float) -> bool:
        """The timer set for `due` (a time `confirmed` returned) ran: True if the ack it was set
        for is still owed, so send one now. False if an outgoing frame carried it meanwhile, or
        nothing is owed; a wait started since has a timer of its own (`confirmed` returned it)."""
        at = self.next_ack_at
        return at is not None and at <= due


def negotiate_version(offered: list[int]) -> int:
    """The highest version both sides speak, or `NoCommonVersion` (4426)."""
    common = set(offered) & set(SUPPORTED_VERSIONS)
    if not common:
        raise NoCommonVersion(f"agent speaks versions {sorted(offered)}, server speaks {list(SUPPORTED_VERSIONS)}")
    return max(common)


class Channel:
    """Protocol state of one WebSocket connection, for either role."""

    def __init__(self, role: Role, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.role = role
        self.max_frame_bytes = max_frame_bytes
        self.phase = Phase.HANDSHAKE
        self.session: Session | None = None
        self._accepts = AGENT_TO_SERVER if role is Role.SERVER else SERVER_TO_AGENT

    def receive(self, data: str | bytes) -> Message | None:
        """Decode and check one incoming frame; None means a duplicate to ignore.

        In the handshake phase the server gets the `hello` back and must call `accept`; the
        agent gets the `welcome` (or an `error`) and the channel opens on its own.
        """
        if self.phase is Phase.CLOSED:
            raise MalformedFrame("frame received after the channel closed")
        message = decode(data, self.max_frame_bytes)
        if message.type not in self._accepts:
            raise MalformedFrame(f"'{message.type}' frames are not sent to the {self.role.value}")
        if self.role is Role.SERVER:
            # What a device says is stored: text the store cannot hold is refused here, at the
            # boundary, not by a failing write in the engine (see `protocol.text`).
            message = cast(Message, inbound(message))
        if self.phase is Phase.HANDSHAKE:
            return self._handshake_frame(message)
        if isinstance(message, Hello | Welcome):
            raise OutOfOrder(f"'{message.type}' is only valid as the first frame")
        assert self.session is not None
        return self.session.receive(message)

    def accept(self, hello: Hello, session: Session, welcome: Welcome) -> tuple[str, list[str]]:
        """Server: open the channel on `session`; returns the welcome text and frames to re-send."""
        if self.role is not Role.SERVER or self.phase is not Phase.HANDSHAKE:
            raise OutOfOrder("accept() is for a server channel awaiting hello")
        self.session = session
        resend: list[Message] = []
        if welcome.resumed and hello.resume is not None:
            resend = session.resume_from(hello.resume.last_seq)
        self.phase = Phase.OPEN
        return self.send(welcome), [encode(m) for m in resend]

    def open_agent(self, welcome: Welcome, session: Session) -> list[str]:
        """Agent: bind the session the welcome names; returns frames to re-send on resume."""
        self.session = session
        self.phase = Phase.OPEN
        if welcome.resumed:
            return [encode(m) for m in session.resume_from(welcome.ack)]
        return []

    def send(self, message: Message) -> str:
        """Stamp and encode an outgoing frame."""
        if self.session is None:
            return encode(message)
        return encode(self.session.stamp(message))

    def close(self) -> None:
        self.phase = Phase.CLOSED

    def _handshake_frame(self, message: Message) -> Message:
        if self.role is Role.SERVER:
            if not isinstance(message, Hello):
                raise OutOfOrder(f"the first frame must be 'hello', got '{message.type}'")
            if message.seq != 0:
                raise MalformedFrame("'hello' carries seq 0")
            return message
        if message.type == "error":
            return message
        if not isinstance(message, Welcome):
            raise OutOfOrder(f"the first frame from the server must be 'welcome', got '{message.type}'")
        return message
