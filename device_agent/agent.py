"""The agent's run loop: connect, resume, heartbeat, receive batches, run them one at a time.

Connections come and go; the `Session` (sequencing) lives across them so a reconnect can
resume, and the `Ledger` (durable) lives across agent restarts. Batches run in a task of their
own, independent of the connection: results land in the ledger's outbox first and go out on
whatever connection exists, now or later (SPEC section 4, Guarantees).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from device_agent import __version__, health
from device_agent.approvals import ASK_TOOL, Approvals, answered, deadline_of, refused
from device_agent.budgets import Breach
from device_agent.config import AgentConfig
from device_agent.datadir import SCREENSHOTS_NAME
from device_agent.faults import CrashPoints
from device_agent.ledger import (
    AppliedControl,
    Ledger,
    LedgerError,
    Receipt,
    deadline_passed,
    namespace_of,
    none_ran,
    results_json,
    skipped,
)
from device_agent.orphans import end_orphans
from device_agent.reconnect import Backoff
from device_agent.router import CallLimit, Router
from device_agent.stop import stopped_words
from device_agent.takeover import Takeover
from device_agent.transport import Closed, NotTls, Refused, Transport
from protocol.codec import encode, utf8_len
from protocol.errors import CloseCode, ErrorCode, ProtocolError
from protocol.messages import (
    SUPPORTED_VERSIONS,
    ApprovalDecision,
    BatchAccepted,
    Cancel,
    Command,
    CommandBatch,
    ControlState,
    DeviceControl,
    DeviceInfo,
    Error,
    ErrorInfo,
    Heartbeat,
    Hello,
    Message,
    OwnerTakeover,
    Result,
    ResultBatch,
    SafetyBreach,
    ToolsChanged,
    Welcome,
)
from protocol.session import Channel, Role, Session

log = logging.getLogger("orrery.agent")

WELCOME_TIMEOUT_S = 15.0
STOP_GRACE_S = 2.0  # after an emergency stop, a command gets this long to return before it is cancelled
OWNER_POLL_S = 0.5  # how often the agent looks for the owner's takeover or handback at the device
# A batch that starts at once is accepted by its `result_batch` when that follows this soon, and by
# a `batch_accepted` of its own otherwise: a quick batch then costs one frame each way, not two
# (each frame wakes the other side, the dearest part of a round trip on loopback). The server
# treats results as acceptance, and this is far below its accept deadline (30 s by default).
ACCEPT_AFTER_S = 0.05
STABLE_SESSION_S = 10.0  # a session this long resets the backoff
GOODBYE_TIMEOUT_S = 2.0  # a stopping agent waits this long for its close to be answered


# A refusal of the token itself: an HTTP status on the upgrade, or a close code after it.
PERMANENT_STATUS = frozenset({401, 403})
PERMANENT_CLOSE = frozenset({CloseCode.UNAUTHORIZED, CloseCode.FORBIDDEN})
REFUSALS_TO_GIVE_UP = 3  # in a row, with no session welcomed between them
TOKEN_REFUSED = "the orchestrator refused this device's token: revoked or wrong; enroll again or pass the right --token"


class TokenRefused(Exception):
    """The orchestrator refused the device's token `REFUSALS_TO_GIVE_UP` times in a row: retrying
    cannot help, so the agent exits (status 3) instead of knocking forever."""


def refusal(exc: BaseException) -> str | None:
    """Why `exc` is a permanent refusal of this device's credentials, or None if it is transient."""
    if isinstance(exc, Refused) and exc.status in PERMANENT_STATUS:
        return f"HTTP {exc.status}: {exc.detail}"
    if isinstance(exc, Closed) and exc.code in PERMANENT_CLOSE:
        return f"closed with {exc.code}: {exc.reason or 'no reason given'}"
    return None


class AgentFailed(Exception):
    """The agent cannot go on: its ledger failed, or its executor died. It exits non-zero so a
    supervisor restarts it, and the ledger's recovery then reports the interrupted batch."""


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        router: Router,
        ledger: Ledger,
        info: dict[str, Any],
        crash: CrashPoints | None = None,
    ) -> None:
        self.config = config
        self.crash = crash or CrashPoints()
        self.router = router
        self.ledger = ledger
        self.info = info
        self.device_id = config.identity()
        self.session: Session | None = None
        self.transport: Transport | None = None
        self.pending_acks: dict[int, str] = {}  # seq of a result_batch -> its batch id
        self.pending_reports: dict[int, str] = {}  # seq of an approval decision reported -> its approval id
        self.work: asyncio.Queue[CommandBatch] = asyncio.Queue()
        self.queued: set[str] = set()
        # Batches this process recorded as new and queued: only the executor can finish them, and
        # it takes each off the queue once, so it need not ask the ledger whether they finished.
        self.fresh: set[str] = set()
        self.current: CommandBatch | None = None
        self.cancelling: set[str] = set()
        # The command running now, in the executor's task (see `_call`, `_halt`).
        self.running_call: _RunningCall | None = None
        # Batches that started at once, not yet accepted: the timer that sends `batch_accepted`
        # unless their results go first (`ACCEPT_AFTER_S`).
        self.unaccepted: dict[str, asyncio.TimerHandle] = {}
        self.stopped_batches: set[str] = set()  # batches an emergency stop ended
        self.heartbeat_interval_s = 10.0
        self.frame_limit = config.max_frame_bytes
        self.heartbeat_timeout_s = 50.0
        # The server's clock minus ours, measured at each welcome: batch deadlines are in the
        # server's time, and a device whose clock drifted must not judge them by its own.
        self.clock_offset_s = 0.0
        self.last_server_frame = time.monotonic()
        self.connected = asyncio.Event()
        self.sessions_opened = 0
        self._lock = asyncio.Lock()
        self.leaving_idle = False  # stopping with nothing running or unacknowledged: say goodbye
        self._announcing: set[asyncio.Task[None]] = set()
        router.on_tools_changed = self._on_tools_changed
        screenshots = config.resolved_data_dir / SCREENSHOTS_NAME
        self.approvals = Approvals(ledger, self._send, screenshots, config.approvals_local_only)
        self.takeover: Takeover = router.takeover  # who has the screen: see `device_agent.takeover`
        self._owner_gen = -1  # the owner's takeover generation this agent last acted on
        router.guards.budgets.on_breach = self._on_breach  # safety budgets

    # ================================================================ top level

    async def run(self) -> None:
        """Run until cancelled; raise `AgentFailed` if the executor dies or the ledger fails.

        The executor and the connection loop run side by side. Neither may die quietly: an agent
        that keeps heartbeating and accepting batches it will never run is worse than one that
        stops, so the first of them to end takes the agent down with it.
        """
        try:
            # What the last run left running dies before its calls are reported `uncertain`, so
            # no probe judges the device, and no retry runs, next to it (device_agent/orphans.py).
            notes = await end_orphans(self.ledger)
            closed = self.ledger.recover(notes=notes)
        except LedgerError as exc:
            raise AgentFailed(str(exc)) from exc
        if closed:
            log.warning("closed %d batch(es) interrupted by the last stop: %s", len(closed), closed)
        await self.router.start()
        applied = self.ledger.control()
        if applied.stopped:
            log.warning(
                "this device is %s: action tools are refused until it is resumed", stopped_words(applied.reason)
            )
            await self.router.stop_latch.engage(applied.reason)
        if applied.taken_over and applied.server_id == self.ledger.server_id:
            log.warning(
                "this device is taken over by %s: input from tasks is refused until the handback", applied.takeover_by
            )
            self.takeover.set(operator=True, by=applied.takeover_by)
        await self._owner_changed()
        executor = asyncio.create_task(self._executor(), name="agent-executor")
        connector = asyncio.create_task(self._connect_forever(), name="agent-connection")
        owner = asyncio.create_task(self._watch_owner(), name="agent-owner-takeover")
        try:
            done, _ = await asyncio.wait({executor, connector, owner}, return_when=asyncio.FIRST_COMPLETED)
            ended = done.pop()
            failure = ended.exception()
            if isinstance(failure, TokenRefused):
                raise failure
            if isinstance(failure, LedgerError):
                raise AgentFailed(str(failure)) from failure
            what = {executor: "the batch executor", connector: "the connection loop"}.get(ended, "the takeover watch")
            reason = f"{type(failure).__name__}: {failure}" if failure else "it returned"
            raise AgentFailed(f"{what} stopped unexpectedly ({reason})") from failure
        except asyncio.CancelledError:
            # Stopped (a signal), not failed: a failed agent is restarted by its supervisor and
            # reports what it was running, so the server's timers decide for it. Decided before
            # anything is cancelled (a cancelled executor forgets its batch).
            self.leaving_idle = self._idle()
            raise
        finally:
            for task in (executor, connector, owner):
                task.cancel()
            for task in (executor, connector):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.router.stop()

    async def _connect_forever(self) -> None:
        """Connect, and after every lost or failed connection try again (SPEC section 4).

        Delays come from `Backoff` (capped exponential, full jitter, a short cap while an outage
        is young). Transient failures (nothing listening, a timeout, HTTP 5xx or 429, close 1013)
        are retried forever. A refusal of the token itself (HTTP 401/403 on the upgrade, close
        4401/4403) is retried with the same backoff, but the `REFUSALS_TO_GIVE_UP`-th one with no
        session welcomed since the first ends the agent (`TokenRefused`); transient failures in
        between neither count nor reset. Only a session that stayed up `STABLE_SESSION_S` ends an
        outage; one that drops sooner counts as another failure, so a server that accepts and then
        closes is not hammered. With `--also-server`, each attempt goes to the next URL in turn.
        """
        urls = self.config.server_urls()
        backoff = Backoff()
        turn = 0
        refusals = 0
        explained = False  # the server not speaking TLS was logged
        while True:
            url = urls[turn % len(urls)]
            turn += 1
            opened = self.sessions_opened
            try:
                await self._session(url)
            except LedgerError:
                raise  # not a connection problem: the agent must stop (see run)
            except Exception as exc:
                if self.sessions_opened != opened:
                    refusals = 0  # the token worked for this session: older refusals are history
                why = refusal(exc)
                if why is not None:
                    refusals += 1
                    if refusals >= REFUSALS_TO_GIVE_UP:
                        last = (
                            f"HTTP {exc.status}" if isinstance(exc, Refused) else f"close {getattr(exc, 'code', '?')}"
                        )
                        raise TokenRefused(f"{TOKEN_REFUSED} (device {self.device_id}, {last} from {url})") from None
                delay = backoff.next_delay()
                if why is not None:
                    log.warning(
                        "the orchestrator refused this device's token (%s); try %d of %d, retrying in %.1fs",
                        why,
                        refusals,
                        REFUSALS_TO_GIVE_UP,
                        delay,
                    )
                elif isinstance(exc, NotTls):
                    # Said once, as an error: every retry would fail the same way until someone
                    # fixes the URL or the server (which may be reconfigured, so keep trying).
                    if not explained:
                        log.error("%s; retrying with backoff until it does", exc)
                        explained = True
                    else:
                        log.debug("still no TLS at %s; retrying in %.1fs", url, delay)
                else:
                    _log_retry(exc, delay)
                await asyncio.sleep(delay)
            else:
                refusals = 0
                explained = False
                backoff.reset()

    # ================================================================ one connection

    async def _session(self, url: str) -> None:
        """Run one connection. Returns after a long-lived session (backoff resets), raises otherwise."""
        async with Transport(url, self.config.token, self.config.max_frame_bytes, self.config.ca_file) as t:
            channel = Channel(Role.AGENT, self.config.max_frame_bytes)
            await t.send(channel.send(self._hello()))
            data = await asyncio.wait_for(t.recv(), WELCOME_TIMEOUT_S)
            first = channel.receive(data)
            if isinstance(first, Error):
                # The server closes 4401/4403 right after these; say so even if the close is lost.
                closes = {
                    ErrorCode.UNAUTHORIZED.value: CloseCode.UNAUTHORIZED,
                    ErrorCode.FORBIDDEN.value: CloseCode.FORBIDDEN,
                }
                raise Closed(closes.get(first.code), f"the server refused the hello: {first.code}: {first.message}")
            assert isinstance(first, Welcome)
            self.ledger.welcomed(first.server_id)
            if first.control is not None:  # stopped or resumed while this agent was away: converge now
                await self._apply_control(first.control)
            if first.server_time is not None:
                self.clock_offset_s = first.server_time.timestamp() - time.time()
            resend = self._open(channel, first)
            self.frame_limit = min(self.config.max_frame_bytes, first.max_frame_bytes)
            self.heartbeat_interval_s = first.heartbeat_interval_s
            self.heartbeat_timeout_s = first.heartbeat_timeout_s
            opened = time.monotonic()
            self.last_server_frame = opened
            async with self._lock:
                self.transport = t
                for frame in resend:
                    await t.send(frame)
            self.sessions_opened += 1
            self.connected.set()
            self._report_breach()  # until an uncordon resets the budgets (a new session may have lost it)
            self._healthy(url)
            log.info("connected to %s (session %s, resumed=%s)", url, first.session_id, first.resumed)
            beat = asyncio.create_task(self._heartbeats(t, url), name="agent-heartbeat")
            try:
                await self._read(t, channel)
            except asyncio.CancelledError:
                if self.leaving_idle:
                    await self._goodbye(t)
                raise
            except Closed as exc:
                if time.monotonic() - opened < STABLE_SESSION_S or exc.code in PERMANENT_CLOSE:
                    raise
                log.warning("%s; reconnecting", exc)
            finally:
                self.connected.clear()
                self._healthy(None)
                self.transport = None
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    def _idle(self) -> bool:
        """Nothing running, queued, or sent and not yet acknowledged by the server."""
        return (
            self.current is None
            and self.work.empty()
            and not self.queued
            and not self.pending_acks
            and not self.pending_reports
        )

    async def _goodbye(self, t: Transport) -> None:
        """Tell the server this agent is stopping (close 1001, going away), so it shows the device
        offline at once instead of idle until the heartbeat timeout. Only when idle: with work in
        flight the server's timers decide, and an agent restarted at once resumes it."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t.close(CloseCode.GOING_AWAY, "agent stopping"), GOODBYE_TIMEOUT_S)

    def _hello(self) -> Hello:
        resume = self.session.resume_point() if self.session is not None else None
        return Hello(
            device_id=self.device_id,
            agent_version=__version__,
            versions=list(SUPPORTED_VERSIONS),
            info=DeviceInfo(**{**self.info, "agent_version": __version__}),
            labels=self.config.labels,
            tools=self.router.catalogue(),
            resume=resume,
            fence_seen=self.ledger.max_fence,
            control_gen=self._control_gen(),
            owner_takeover=self.ledger.owner_takeover(),
        )

    def _open(self, channel: Channel, welcome: Welcome) -> list[str]:
        """Bind the session the server chose; return frames to send right after the welcome."""
        if self.session is not None and self.session.resumed_by(welcome):
            return channel.open_agent(welcome, self.session)
        # A new session: nothing of the old one carries over except what is durable. Every
        # result still in the outbox goes again; the server de-duplicates by batch id.
        self.session = Session(welcome.session_id, welcome.version)
        channel.open_agent(welcome, self.session)
        self.pending_acks = {}
        self.pending_reports = {}
        frames = []
        for entry in self.ledger.outbox():
            stamped = self.session.stamp(ResultBatch(batch_id=entry.batch_id, fence=entry.fence, results=entry.results))
            self.pending_acks[stamped.seq] = entry.batch_id
            frames.append(encode(stamped))
        for message in self.approvals.on_connect():
            stamped = self.session.stamp(message)
            if isinstance(stamped, ApprovalDecision):
                self.pending_reports[stamped.seq] = stamped.approval_id
            frames.append(encode(stamped))
        return frames

    async def _read(self, t: Transport, channel: Channel) -> None:
        while True:
            data = await t.recv()
            self.last_server_frame = time.monotonic()
            msg = channel.receive(data)
            acked = self._settle_acks()
            if isinstance(msg, CommandBatch):
                # The acked entries go with the receipt; the frame is kept as it came.
                await self._on_batch(msg, acked, data if isinstance(data, str) else None)
                continue
            if acked:
                self.ledger.acknowledged(*acked)
            if msg is None:
                continue
            elif isinstance(msg, Cancel):
                self._on_cancel(msg)
                assert self.session is not None
                self.session.confirm(msg.seq)
            elif isinstance(msg, ApprovalDecision):
                await self.approvals.on_decision(msg)  # recorded in the ledger before we acknowledge it
                assert self.session is not None
                self.session.confirm(msg.seq)
            elif isinstance(msg, DeviceControl):
                await self._apply_control(msg.control)  # recorded in the ledger before we acknowledge it
                assert self.session is not None
                self.session.confirm(msg.seq)
            elif isinstance(msg, Error):
                log.warning("server says %s: %s", msg.code, msg.message)

    async def _heartbeats(self, t: Transport, url: str) -> None:
        """Heartbeat every interval; a server silent past the timeout is treated as gone."""
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            if time.monotonic() - self.last_server_frame > self.heartbeat_timeout_s:
                log.warning("no frame from the server for %.0fs; reconnecting", self.heartbeat_timeout_s)
                # Normal closure, not 1001: "going away" tells the server this agent is stopping.
                await t.close(CloseCode.NORMAL, "server silent")
                return
            self._healthy(url)
            await self._heartbeat()

    def _healthy(self, url: str | None) -> None:
        """Keep (or, with None, remove) the session file `python3 -m device_agent.health` reads.
        Best effort: a health file that cannot be written never stops the agent."""
        data_dir = self.config.resolved_data_dir
        try:
            if url is None or self.session is None:
                health.clear(data_dir)
            else:
                health.write(
                    data_dir, url, self.session.session_id, self.heartbeat_timeout_s + self.heartbeat_interval_s
                )
        except OSError as exc:
            log.warning("could not update %s: %s", data_dir / health.FILE, exc)

    async def _heartbeat(self) -> None:
        batch = self.current.batch_id if self.current else None
        await self._send(Heartbeat(state="busy" if batch else "idle", batch_id=batch, control_gen=self._control_gen()))

    def _settle_acks(self) -> list[str]:
        """The outbox entries the server acknowledged (durable there), for the caller to let go;
        approval decisions it acknowledged are marked reported here."""
        if self.session is None:
            return []
        if self.pending_reports:
            for seq in [s for s in self.pending_reports if s <= self.session.peer_ack]:
                self.approvals.acknowledged(self.pending_reports.pop(seq))
        if not self.pending_acks:
            return []
        return [self.pending_acks.pop(s) for s in [s for s in self.pending_acks if s <= self.session.peer_ack]]

    async def _send(self, message: Message) -> None:
        """Stamp and send. Reliable frames stamped while disconnected wait in the session."""
        async with self._lock:
            if self.session is None:
                return
            stamped = self.session.stamp(message)
            if isinstance(stamped, ResultBatch):
                self.pending_acks[stamped.seq] = stamped.batch_id
            elif isinstance(stamped, ApprovalDecision):
                self.pending_reports[stamped.seq] = stamped.approval_id
            if self.transport is not None:
                with contextlib.suppress(Closed, OSError):
                    await self.transport.send(encode(stamped))

    # ================================================================ batches

    async def _on_batch(self, batch: CommandBatch, acked: list[str] | None = None, frame: str | None = None) -> None:
        receipt = self.ledger.receive(batch, acked or (), frame)  # durable before we acknowledge it
        assert self.session is not None
        self.session.confirm(batch.seq)
        if receipt is Receipt.STALE:
            await self._refuse_stale(batch)
            return
        if receipt is Receipt.DONE:
            results = self.ledger.results(batch.batch_id) or []
            await self._send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results))
            return
        if receipt is Receipt.NEW:
            self.crash.reach("received")
        running = self.current is not None and self.current.batch_id == batch.batch_id
        if receipt is Receipt.NEW and self.current is None and self.work.empty():
            # It starts at once: its results accept it if they come within ACCEPT_AFTER_S.
            loop = asyncio.get_running_loop()
            self.unaccepted[batch.batch_id] = loop.call_later(ACCEPT_AFTER_S, self._accept_late, batch.batch_id)
        elif batch.batch_id not in self.unaccepted:
            await self._send(BatchAccepted(batch_id=batch.batch_id))
        if receipt is Receipt.NEW:
            self.crash.reach("accepted")
        if not running and batch.batch_id not in self.queued:
            self.queued.add(batch.batch_id)
            if receipt is Receipt.NEW:
                self.fresh.add(batch.batch_id)
            self.work.put_nowait(batch)

    def _accept_late(self, batch_id: str) -> None:
        """ACCEPT_AFTER_S passed and the batch has no results out yet: accept it on its own."""
        if self.unaccepted.pop(batch_id, None) is not None:
            task = asyncio.get_running_loop().create_task(self._send(BatchAccepted(batch_id=batch_id)))
            self._announcing.add(task)
            task.add_done_callback(self._announcing.discard)

    def _accepted_by_results(self, batch_id: str) -> None:
        """Its results go out now and accept it (if its own `batch_accepted` has not gone yet)."""
        handle = self.unaccepted.pop(batch_id, None)
        if handle is not None:
            handle.cancel()

    async def _refuse_stale(self, batch: CommandBatch) -> None:
        """A batch older than an assignment already accepted is answered, not dropped (SPEC
        section 4, fencing): a `result_batch` with every command `skipped` (`stale_fence`) and
        the ledger's mark in `fence_seen`, so the server can end the attempt and assign above the
        mark. Nothing is recorded, so a redelivery is refused the same way."""
        mark = self.ledger.max_fence
        why = (
            f"not run: batch {batch.batch_id} has fence {batch.fence}, but this device already accepted "
            f"fence {mark} from this orchestrator, so the assignment it belongs to was superseded; "
            "the device refused it and none of its commands ran"
        )
        log.warning("refused stale batch %s (fence %d < %d)", batch.batch_id, batch.fence, mark)
        results = none_ran(batch, ErrorCode.STALE_FENCE, why)
        await self._send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results, fence_seen=mark))

    def _on_cancel(self, msg: Cancel) -> None:
        running = self.current is not None and self.current.batch_id == msg.batch_id
        if not running and msg.batch_id not in self.queued and self.ledger.results(msg.batch_id) is not None:
            return  # finished already: the cancel (sent again while its results were on their way) is moot
        self.cancelling.add(msg.batch_id)
        self.approvals.wake(msg.batch_id)  # a command waiting for approval stops waiting at once
        if running:
            killed = self.router.kill_running()
            log.info("cancel %s: stopping after the current command (%d process group(s) killed)", msg.batch_id, killed)

    def _control_gen(self) -> int:
        """The generation of the controls applied for the orchestrator we talk to (0: none yet)."""
        applied = self.ledger.control()
        return applied.gen if applied.server_id == self.ledger.server_id else 0

    async def _apply_control(self, state: ControlState) -> None:
        """The device's controls as operators want them (a welcome or `device_control`): applied
        if newer than what the ledger holds, kept there first (an agent restart keeps them), then
        acted on; the next heartbeat, sent at once, tells the server this generation is applied."""
        applied = self.ledger.control()
        server = self.ledger.server_id
        same = applied.server_id == server
        if same and state.gen <= applied.gen:
            return  # sent again, or an older copy: applied already
        before = applied.gen if same else 0
        self.ledger.set_control(
            AppliedControl(server, state.gen, state.stopped, state.reason, state.taken_over, state.takeover_by)
        )
        if self.takeover.set(operator=state.taken_over, by=state.takeover_by):
            if state.taken_over:
                log.warning(
                    "device taken over by %s: input from tasks is refused until the handback", state.takeover_by
                )
            else:
                log.warning("device handed back: tasks drive it again (the model observes afresh)")
        latch = self.router.stop_latch
        if state.stopped:
            if not latch.stopped:
                await self._engage_stop(state.reason)
            latch.reason = state.reason
        else:
            if state.stopped_at > before and not latch.stopped:
                # Stopped and resumed since this agent last heard: the stop still ends what runs.
                await self._engage_stop(state.reason or "stopped and resumed by an operator")
            if latch.stopped or state.resumed > before:
                self._lift_stop()
        if state.budgets_reset > before:
            log.warning("safety budgets reset by the orchestrator (the device was uncordoned)")
            self.router.guards.budgets.reset()
        if self.session is not None and self.transport is not None:
            await self._heartbeat()

    async def _watch_owner(self) -> None:
        """The owner takes the device over, or hands it back, at the device (`orrery agent takeover`,
        `handback`, written into the ledger): looked at every `OWNER_POLL_S`."""
        while True:
            await asyncio.sleep(OWNER_POLL_S)
            await self._owner_changed()

    async def _owner_changed(self) -> None:
        state = self.ledger.owner_takeover()
        if state is None or state.gen == self._owner_gen:
            return
        self._owner_gen = state.gen
        if self.takeover.set(owner=state.taken_over, by=state.by):
            words = "taken over by its owner" if state.taken_over else "handed back by its owner"
            log.warning("device %s%s", words, f": {state.note}" if state.note and not state.taken_over else "")
        await self._send(OwnerTakeover(state=state))  # reliable: waits in the session while away

    async def _engage_stop(self, reason: str) -> None:
        """An operator's emergency stop (kept in the ledger already): the running command is
        interrupted (process groups killed, GUI input stopped and held buttons and modifiers
        released) and every action tool refused until a resume."""
        killed = self.router.kill_running()
        if self.current is not None:
            self.stopped_batches.add(self.current.batch_id)
            self.approvals.wake(self.current.batch_id)
        if self.running_call is not None:
            asyncio.get_running_loop().call_later(STOP_GRACE_S, self._halt, self.running_call)
        await self.router.stop_latch.engage(reason)
        log.warning("device %s; %d process group(s) killed", stopped_words(reason), killed)

    def _lift_stop(self) -> None:
        if self.router.stop_latch.stopped:
            log.warning("device resumed by an operator: action tools run again")
        else:
            log.info("device resumed by an operator (it was not stopped): a gui.stop latch, if any, is lifted")
        self.router.stop_latch.lift()

    async def _executor(self) -> None:
        while True:
            batch = await self.work.get()
            self.queued.discard(batch.batch_id)
            fresh = batch.batch_id in self.fresh
            self.fresh.discard(batch.batch_id)
            if not fresh and self.ledger.results(batch.batch_id) is not None:
                continue  # finished meanwhile (a redelivery raced with the first copy)
            waited = self.ledger.has_approval(batch.batch_id)  # an approval's wait moves the deadline on
            if batch.deadline is not None and not waited and batch.deadline.timestamp() <= self.server_now():
                # Too late to start: say so rather than run work nobody waits for any more.
                log.warning("batch %s not started: its deadline passed", batch.batch_id)
                results = deadline_passed(batch)
                self.ledger.finish_batch(batch.batch_id, batch.fence, results)
                self._accepted_by_results(batch.batch_id)
                await self._send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results))
                continue
            self.current = batch
            try:
                results, payload = fit_to_frame(await self._run(batch), batch, self.frame_limit)
                self.ledger.finish_batch(batch.batch_id, batch.fence, results, payload)
            finally:
                self.current = None
                self.cancelling.discard(batch.batch_id)
                self.stopped_batches.discard(batch.batch_id)
            self.crash.reach("finished")
            self._accepted_by_results(batch.batch_id)
            await self._send(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=results))
            self.crash.reach("sent")

    async def _run(self, batch: CommandBatch) -> list[Result]:
        """Commands in order; after a failure (early exit), a cancel or an emergency stop the
        rest are skipped. While the device is stopped, action commands are skipped unrun
        (`device_stopped`); read-only ones still run."""
        results: list[Result] = []
        stop: str | None = None
        # Commands that finished before the batch stopped to wait for an approval, and the agent
        # restarted: their results stand, they do not run again.
        done = self.ledger.done_calls(batch.batch_id) if self.ledger.has_approval(batch.batch_id) else {}
        batch_id = batch.batch_id
        stop_code = "skipped"
        latch = self.router.stop_latch
        for cmd in batch.commands:
            if stop is None and batch.batch_id in self.cancelling:
                stop = "the batch was cancelled before this command started"
            if stop is None and latch.stopped and not self.router.read_only(cmd.tool):
                stop, stop_code = f"not run: {latch.refusal(cmd.tool)}", ErrorCode.DEVICE_STOPPED.value
            if stop is not None:
                results.append(skipped(cmd.call_id, cmd.tool, stop, stop_code))
                continue
            if cmd.call_id in done:
                results.append(done[cmd.call_id])
                continue
            approved = False
            asks = self.router.needs_approval(cmd.tool)
            if asks and (early := self.router.refused_now(cmd, batch_id)):
                results.append(early)  # refused whatever a person decided: nobody is asked
                if batch.early_exit:
                    stop = f"command {cmd.call_id} ({cmd.tool}) was refused, so the rest of the batch was skipped"
                continue
            if asks:
                rec = await self.approvals.obtain(
                    batch, cmd, lambda: batch_id in self.cancelling or batch_id in self.stopped_batches
                )
                refusal = refused(cmd, rec)
                if refusal is not None and batch_id in self.stopped_batches:  # stopped while it waited
                    refusal = skipped(cmd.call_id, cmd.tool, f"not run: {latch.refusal(cmd.tool)}", "device_stopped")
                self.router.audit.record(
                    batch_id=batch_id,
                    call_id=cmd.call_id,
                    tool=cmd.tool,
                    decision="approved" if refusal is None else "denied",
                    error_code=refusal.error.code if refusal and refusal.error else None,
                    reason=f"approval {rec.approval_id} {rec.state} by {rec.decided_by or '?'}",
                )
                if refusal is not None:
                    assert refusal.error is not None
                    self.router.guards.budgets.outcome(refusal.status, refusal.error.code)  # a denial counts
                    results.append(refusal)
                    if batch.early_exit:
                        stop = f"command {cmd.call_id} ({cmd.tool}) was not approved, so the rest was skipped"
                    continue
                if batch_id in self.cancelling:  # cancelled as it was approved: it must not run now
                    stop = "the batch was cancelled while this command waited for approval"
                    results.append(skipped(cmd.call_id, cmd.tool, f"not run: {stop}", ErrorCode.CANCELLED.value))
                    continue
                approved = True
                batch = batch.model_copy(update={"deadline": deadline_of(batch, rec)})
                if latch.stopped and not self.router.read_only(cmd.tool):  # stopped as it was approved
                    stop, stop_code = f"not run: {latch.refusal(cmd.tool)}", ErrorCode.DEVICE_STOPPED.value
                    results.append(skipped(cmd.call_id, cmd.tool, stop, stop_code))
                    continue
            self.ledger.start_call(batch.batch_id, cmd.call_id)
            self.crash.reach("call_started")
            if asks and cmd.tool == ASK_TOOL:
                result = answered(cmd, rec)  # a question to a person: their words are its result
            else:
                result = await self._call(cmd, batch, approved)
            self.crash.reach("call_done")
            if batch.batch_id in self.stopped_batches and result.status != "success":
                result = _stopped(cmd, result, latch.reason)
            elif batch.batch_id in self.cancelling and result.status != "success":
                result = Result(
                    call_id=cmd.call_id,
                    status="failure",
                    result=result.result,
                    error=ErrorInfo(code=ErrorCode.CANCELLED, message="stopped by a cancel from the orchestrator"),
                    namespace=namespace_of(cmd.tool),
                    duration_ms=result.duration_ms,
                )
            if len(results) + 1 < len(batch.commands):  # the last one is recorded with the batch
                self.ledger.finish_call(batch.batch_id, result)
            results.append(result)
            if batch.batch_id in self.stopped_batches:
                stop, stop_code = "not run: an operator stopped the device during this batch", "device_stopped"
            elif batch.batch_id in self.cancelling:
                stop = "the batch was cancelled"
            elif result.status != "success" and batch.early_exit:
                stop = f"command {cmd.call_id} ({cmd.tool}) failed, so the rest of the batch was skipped"
        return results

    async def _call(self, cmd: Command, batch: CommandBatch, approved: bool = False) -> Result:
        """Run one command in this task; an emergency stop meanwhile interrupts it: its processes
        are killed already, and a call still running `STOP_GRACE_S` later is cancelled (`_halt`).
        The call runs in the caller's own task (a task per command cost a loop turn on every
        command); the halt cancels that task, and this takes the cancellation back."""
        limit = self._timeout(cmd.timeout_s, batch)
        task = asyncio.current_task()
        assert task is not None
        self.running_call = running = _RunningCall(task, cmd.call_id)
        try:
            result = await self.router.call(cmd, batch.batch_id, limit, approved)
            if running.halted:  # cancelled, but the call took the cancellation and returned
                task.uncancel()
            return result
        except asyncio.CancelledError:
            if not running.halted or task.uncancel() > 0:
                raise  # the agent itself is stopping
            return _stopped(cmd, None, self.router.stop_latch.reason)
        finally:
            self.running_call = None

    def running(self) -> tuple[str, str] | None:
        """The batch and call running now, which the processes a tool starts belong to."""
        if self.current is None or self.running_call is None:
            return None
        return self.current.batch_id, self.running_call.call_id

    def _halt(self, running: _RunningCall) -> None:
        """`STOP_GRACE_S` after a stop: a command that has still not returned is cancelled."""
        if self.running_call is running and not running.halted:
            running.halted = True
            running.task.cancel()

    def server_now(self) -> float:
        """The orchestrator's time, as far as the last welcome told us (deadlines are in it)."""
        return time.time() + self.clock_offset_s

    def _timeout(self, timeout_s: float, batch: CommandBatch) -> CallLimit:
        """The command's timeout_s, or the time left to the batch deadline if that is shorter."""
        if batch.deadline is None:
            return CallLimit(timeout_s, "command")
        left = batch.deadline.timestamp() - self.server_now()
        if left < timeout_s:
            return CallLimit(max(0.1, left), "deadline")
        return CallLimit(timeout_s, "command")

    async def tools_changed(self) -> None:
        await self._send(ToolsChanged(tools=self.router.catalogue()))

    def _on_tools_changed(self) -> None:
        task = asyncio.get_running_loop().create_task(self.tools_changed())
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)

    # ---------------------------------------------------------------- safety budgets

    def _on_breach(self, breach: Breach) -> None:
        log.error("safety budget %s (limit %d) exceeded: %s", breach.budget, breach.limit, breach.detail)
        self._report_breach()

    def _report_breach(self) -> None:
        """Tell the orchestrator (a reliable frame) that a budget is tripped; it cordons the device."""
        breach = self.router.guards.budgets.tripped
        if breach is None:
            return
        frame = SafetyBreach(budget=breach.budget, limit=breach.limit, detail=breach.detail[:1000])
        task = asyncio.get_running_loop().create_task(self._send(frame))
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)


class _RunningCall:
    """The command running now: the task it runs in, its call id, and whether a stop's grace ran out on it."""

    __slots__ = ("call_id", "halted", "task")

    def __init__(self, task: asyncio.Task[Any], call_id: str) -> None:
        self.task = task
        self.call_id = call_id
        self.halted = False


def _stopped(cmd: Command, result: Result | None, reason: str) -> Result:
    """A command an emergency stop interrupted: `device_stopped` (it may have partly run)."""
    return Result(
        call_id=cmd.call_id,
        status="failure",
        result=result.result if result else None,
        error=ErrorInfo(
            code=ErrorCode.DEVICE_STOPPED,
            message=f"interrupted by an emergency stop ({stopped_words(reason)}) while this command ran, so it "
            "may have partly taken effect; check the device's state before running it again",
        ),
        namespace=namespace_of(cmd.tool),
        duration_ms=result.duration_ms if result else 0.0,
    )


def _log_retry(exc: Exception, delay: float) -> None:
    expected = isinstance(exc, (OSError, Refused, Closed, TimeoutError, ProtocolError))
    log.warning(
        "connection failed (%s: %s); retrying in %.1fs",
        type(exc).__name__,
        exc,
        delay,
        exc_info=None if expected else exc,
    )


def fit_to_frame(results: list[Result], batch: CommandBatch, limit: int) -> tuple[list[Result], str]:
    """Shrink the largest results until the result batch fits the server's frame limit; return
    them with their JSON (`results_json`, what the ledger stores).

    SPEC section 5 / output caps: an oversized result is truncated with a marker that says how
    big it was, never dropped, and the batch is never refused for its size.

    The frame's size is the envelope's (the frame with no results) plus the results' JSON, which
    is computed anyway for the ledger: a batch that fits costs no encode of its own.
    """
    budget = int(limit * 0.9)  # room for the envelope and the ack/seq fields
    payload = results_json(results)
    envelope = encode(ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=[]))
    if len(envelope) - 2 + utf8_len(payload) <= budget:  # "[]" in the envelope becomes the payload
        return results, payload
    out = list(results)
    for _ in range(len(out)):
        frame = ResultBatch(batch_id=batch.batch_id, fence=batch.fence, results=out)
        size = len(encode(frame).encode())
        if size <= budget:
            break
        i = max(range(len(out)), key=lambda k: len(out[k].model_dump_json()))
        big = out[i]
        text = big.model_dump_json(include={"result"})
        keep = max(0, len(text) - (size - budget) - 200)
        out[i] = big.model_copy(
            update={"result": {"truncated": True, "original_bytes": len(text), "preview": text[:keep]}}
        )
    return out, results_json(out)
