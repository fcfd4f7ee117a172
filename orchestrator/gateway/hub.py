"""The device gateway: `/v1/agent` WebSocket endpoint, live sessions and liveness (SPEC section 4).

The gateway is a pump: it reads a frame, hands it to the connection's protocol `Channel`, passes
what comes out to the `Cluster` (which finds the engine, here or on another replica) and confirms
it to the session once the engine has it durably; it writes what the cluster sends; and it runs
the timers (liveness, standalone acks, link reports). Every protocol decision (does a hello
resume, when is an ack owed, what does a heartbeat answer say) is the sans-I/O session's
(`protocol.session`); nothing here reads the engine.

One `Link` per device outlives its connections: it holds the protocol `Session` (so a
reconnecting agent can resume) and the time of the last frame, read from a monotonic clock.
Each connection has a reader (frames in, one at a time, in order) and a writer (a FIFO of
already-stamped frames), so the engine's `send` never blocks on a slow socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from orchestrator.cluster import Cluster, ClusterUnavailable
from orchestrator.config import Settings
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.engine.controls import controls_of, wire_state
from orchestrator.engine.records import DeviceHello, FrameIn, Input, LinkReport, LinkState, LivenessChanged
from orchestrator.engine.times import utc
from orchestrator.engine.writer import refused_data
from orchestrator.gateway.limits import RateLimiter
from orchestrator.gateway.websocket import FRAMES_EXTENSION, FrameFlow, FrameSink
from orchestrator.ids import new_id
from orchestrator.metrics import Metrics
from orchestrator.security import DEVICE_TOKEN_PREFIX, Hasher, bearer
from orchestrator.store.repo import Store
from protocol.codec import encode
from protocol.errors import CloseCode, ErrorCode, MalformedFrame, ProtocolError
from protocol.messages import (
    SUPPORTED_VERSIONS,
    BatchAccepted,
    ControlState,
    Error,
    Heartbeat,
    Hello,
    Message,
    ResultBatch,
    ViewEnded,
    ViewFrame,
    ViewInputResult,
    Welcome,
    is_reliable,
)
from protocol.session import AckPolicy, Channel, Role, Session, negotiate_version

if TYPE_CHECKING:
    from orchestrator.views.hub import ViewHub

log = logging.getLogger("orrery.gateway")
LINK_REPORT_CHUNK = 500  # links per periodic report (see Gateway._report_links)


@dataclass
class Connection:
    """One device socket. Frames to send wait in `outbox`, in order; a writer task runs only while
    there is something to write (an idle connection keeps no task waiting)."""

    ws: WebSocket
    channel: Channel
    outbox: deque[str | tuple[int, str]] = field(default_factory=deque)
    closed: bool = False
    writer: asyncio.Task[None] | None = None
    # Writes a frame to the socket now if it takes it without waiting (`FrameFlow.write_text`);
    # used only while nothing is queued before it, so frames keep their order.
    direct: Callable[[str], bool] | None = None
    # The close code the connection ended with, first reported: the agent's when it closed first
    # (1001 from an agent that is stopping cleanly: the device is gone now, see `Gateway.serve`).
    ended_with: int | None = None

    def push(self, text: str) -> None:
        if not self.closed:
            if self.writer is None and self.direct is not None and self.direct(text):
                return
            self.outbox.append(text)
            self._write_soon()

    def close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.outbox.append((code, reason))
            self._write_soon()

    def _write_soon(self) -> None:
        if self.writer is None:
            self.writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        try:
            while self.outbox:
                item = self.outbox.popleft()
                if isinstance(item, tuple):
                    code, reason = item
                    if self.ws.application_state == WebSocketState.CONNECTED:
                        await self.ws.close(code, reason)
                    return
                await self.ws.send_text(item)
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.closed = True
        finally:
            self.writer = None

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout`) for what is queued to be written."""
        if self.writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self.writer), timeout)


@dataclass
class Link:
    device_id: str
    session: Session
    conn: Connection | None = None
    last_frame: float = field(default_factory=time.monotonic)
    liveness: Liveness = Liveness.ONLINE
    waiting: int = 0  # the reader awaits the engine: frames queue up unread, but the device is alive
    epoch: int = 0  # the store's number for the device's latest connection here (SPEC section 7)
    batch_id: str | None = None  # the batch the device last said (heartbeat) it is running
    control_gen: int = 0  # the control generation the device last said (hello, heartbeat) it applied
    acks: AckPolicy = field(init=False)

    def __post_init__(self) -> None:
        self.acks = AckPolicy(self.session)


class Gateway:
    """Device sockets of this replica. Built before its cluster (which sends through it), then
    bound to it with `bind`; it sees the engine only through that `Cluster`."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        hasher: Hasher,
        metrics: Metrics,
        auth_failures: RateLimiter | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.hasher = hasher
        self.links: dict[str, Link] = {}
        # Per device, not per address: a fleet behind one NAT (or one proxy) reconnecting after a
        # restart is many devices, while a looping agent is one. Failed authentications are what an
        # address is throttled for (token guessing), counted with the REST API's in one budget,
        # and they never block a valid token.
        self.handshakes = RateLimiter(settings.handshakes_per_minute, 60.0)
        self.auth_failures = auth_failures or RateLimiter(settings.auth_failures_per_minute, 60.0)
        self._monitor: asyncio.Task[None] | None = None
        self._reporter: asyncio.Task[None] | None = None
        self.server_id = ""  # the store's identity, told to agents (they bind their fences to it)
        self._cluster: Cluster | None = None
        # Where live view frames go (never to the engine: they are not stored); None: dropped.
        self.views: ViewHub | None = None

    def bind(self, cluster: Cluster, views: ViewHub | None = None) -> None:
        """Where this gateway's frames go: the app's wiring calls it once, before `start`."""
        self._cluster = cluster
        self.views = views

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise RuntimeError("the gateway is not bound to a cluster yet (Gateway.bind)")
        return self._cluster

    # ================================================================ lifecycle

    async def start(self) -> None:
        self.server_id = await self.store.server_id()
        self._monitor = asyncio.create_task(self._watch_liveness(), name="orrery-liveness")
        self._reporter = asyncio.create_task(self._report_links(), name="orrery-link-reports")

    async def stop(self) -> None:
        for task in (self._monitor, self._reporter):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for link in self.links.values():
            if link.conn:
                link.conn.close(CloseCode.GOING_AWAY, "server shutting down")

    # ================================================================ engine-facing

    def send(self, device_id: str, message: Message, epoch: int = 0) -> bool:
        """Stamp and queue a frame on the device's session here, if that session belongs to
        connection `epoch` or a newer one. Reliable frames stay in the session until acknowledged,
        so one sent while the socket is down goes out when the device resumes: True means the
        frame may reach the device, False that it certainly cannot (no such session here)."""
        link = self.links.get(device_id)
        if link is None or link.epoch < epoch:
            return False
        stamped = link.session.stamp(message)
        if link.conn is not None and not link.conn.closed:
            link.conn.push(encode(stamped))
        return True

    def close(self, device_id: str, code: int, reason: str) -> None:
        link = self.links.pop(device_id, None)
        if link and link.conn:
            link.conn.close(code, reason)

    def link_report(self, links: Iterable[Link] | None = None) -> LinkReport:
        """Every link here (or those of `links`) as the engine should know it."""
        now = time.monotonic()
        return LinkReport(
            self.cluster.replica_id,
            [
                LinkState(
                    link.device_id,
                    link.epoch,
                    link.liveness,
                    0.0 if link.waiting else max(0.0, now - link.last_frame),
                    link.batch_id,
                    link.control_gen,
                )
                for link in (self.links.values() if links is None else links)
            ],
        )

    async def _report_links(self) -> None:
        """Re-announce every link once per report interval, in parts of at most
        LINK_REPORT_CHUNK links spread over the interval: one report of 10,000 links held the
        loop (and so every heartbeat answer) for ~60 ms. A report never implies that a link
        missing from it is gone, so the parts are as good as the whole; a link replaced or
        dropped since the interval began is left out (its successor is in a later part)."""
        interval = self.settings.link_report_interval_s
        while True:
            links = list(self.links.values())
            parts = [links[i : i + LINK_REPORT_CHUNK] for i in range(0, len(links), LINK_REPORT_CHUNK)] or [[]]
            for part in parts:
                await asyncio.sleep(interval / len(parts))
                try:
                    self.cluster.report(self.link_report(x for x in part if self.links.get(x.device_id) is x))
                except Exception:  # a report is a periodic hint; the next one will do
                    log.exception("could not report device links")

    def is_connected(self, device_id: str) -> bool:
        link = self.links.get(device_id)
        return bool(link and link.conn and not link.conn.closed)

    def last_seen_monotonic(self, device_id: str) -> float | None:
        link = self.links.get(device_id)
        return link.last_frame if link else None

    # ================================================================ the endpoint

    async def serve(self, ws: WebSocket) -> None:
        client = ws.client.host if ws.client else "?"
        token = bearer(ws.headers.get("authorization"))
        device = None
        if token and token.startswith(DEVICE_TOKEN_PREFIX + "_"):
            device = await self.store.find_device_by_token(self.hasher.digest(token))
        if device is None or device.admin_state == AdminState.REVOKED:
            if not self.auth_failures.allow(client):
                await _deny(ws, 429, "rate_limited", "too many failed handshakes from this address; retry in a minute")
                return
            await _deny(ws, 401, "unauthorized", "a valid device token is required (Authorization: Bearer ...)")
            return
        if not self.handshakes.allow(device.id):
            await _deny(ws, 429, "rate_limited", "this device reconnects too often; retry in a minute")
            return
        await ws.accept()
        metrics = self.metrics
        metrics.websocket_opens.inc()
        metrics.websockets.inc()
        channel = Channel(Role.SERVER, self.settings.max_frame_bytes)
        conn = Connection(ws, channel)
        try:
            hello = await self._handshake(conn, device.id, wire_state(controls_of(device)))
            if hello is not None:
                attach = ws.scope.get("extensions", {}).get(FRAMES_EXTENSION)
                if attach is not None:
                    await _Pump(self, conn, device.id).run(attach)
                else:
                    await self._read(conn, device.id)
        except ProtocolError as exc:
            metrics.errors.labels(exc.code.value).inc()
            conn.push(encode(Error(code=exc.code, message=exc.message)))
            conn.close(exc.close_code, exc.code.value)
        except WebSocketDisconnect:
            conn.closed = True
        except Exception as exc:
            # The engine could not take a frame now (no leader within the deadline, the store
            # away): end the connection without acknowledging it. The agent reconnects and
            # resumes, and re-sends what was not acknowledged (SPEC section 4).
            unexpected = not isinstance(exc, ClusterUnavailable)
            log.warning(
                "device %s: closing its connection, the engine is unavailable: %s",
                device.id,
                exc,
                exc_info=exc if unexpected else None,
            )
            conn.close(CloseCode.TRY_AGAIN_LATER, "the orchestrator is busy; reconnect")
        finally:
            metrics.websockets.dec()
            conn.close(CloseCode.NORMAL, "")
            await conn.flush(5)
            link = self.links.get(device.id)
            if link is not None and link.conn is conn:
                link.conn = None
                if conn.ended_with == CloseCode.GOING_AWAY and link.batch_id is None and not link.waiting:
                    # The agent said goodbye (it is stopping, with no batch running): offline now,
                    # not after the heartbeat timeout. With a batch running the timers decide, so
                    # an agent restarted at once still resumes and keeps its batch (SPEC section 4).
                    self._go_offline(link, "its agent stopped")

    async def _handshake(self, conn: Connection, device_id: str, control: ControlState) -> Hello | None:
        """Take the hello, answer the welcome (it carries the device's controls as the store has
        them, so an agent that was away when an operator stopped or resumed it converges before
        anything else happens; the engine sends them again until the agent reports them applied)."""
        try:
            data = await asyncio.wait_for(_receive(conn.ws), self.settings.hello_timeout_s)
        except TimeoutError:
            conn.push(encode(Error(code=ErrorCode.HELLO_TIMEOUT, message="no hello within the deadline")))
            conn.close(CloseCode.HELLO_TIMEOUT, "hello timeout")
            return None
        if data is None:
            return None
        hello = conn.channel.receive(data)
        assert isinstance(hello, Hello)
        if hello.device_id != device_id:
            conn.push(encode(Error(code=ErrorCode.FORBIDDEN, message="device_id does not match the token's device")))
            conn.close(CloseCode.FORBIDDEN, "device id mismatch")
            return None
        version = negotiate_version(hello.versions)
        epoch = await self.store.open_session(device_id)
        if not epoch:  # the device row is gone
            conn.close(CloseCode.UNAUTHORIZED, "unknown device")
            return None
        link = self.links.get(device_id)
        if link is not None and link.conn is not None and link.conn is not conn:
            link.conn.close(CloseCode.SUPERSEDED, "superseded by a newer connection")
        if link is None or not link.session.resumes(hello):
            link = Link(device_id, Session(new_id("s"), version))
            self.links[device_id] = link
            resumed = False
        else:
            resumed = True
        session = link.session
        link.conn = conn
        link.epoch = epoch
        link.control_gen = hello.control_gen
        self._touch(link)
        welcome = Welcome(
            session_id=session.session_id,
            version=version,
            heartbeat_interval_s=self.settings.heartbeat_interval_s,
            heartbeat_timeout_s=self.settings.heartbeat_timeout_s,
            max_frame_bytes=self.settings.max_frame_bytes,
            resumed=resumed,
            server_id=self.server_id or None,
            server_time=utc(time.time()),
            control=control,
        )
        text, resend = conn.channel.accept(hello, session, welcome)
        conn.push(text)
        for frame in resend:
            conn.push(frame)
        self.cluster.device_connected(device_id, epoch)
        if self.views is not None:
            self.views.device_hello(device_id, hello.features)
        current = await self._engine(link, DeviceHello(device_id, hello, resumed, epoch, self.cluster.replica_id))
        if current is False:  # a newer connection of this device reached the engine first
            if self.links.get(device_id) is link and link.conn is conn:
                del self.links[device_id]
            conn.close(CloseCode.SUPERSEDED, "superseded by a newer connection")
            return None
        log.info("device %s connected (session %s, resumed=%s)", device_id, session.session_id, resumed)
        return hello

    async def _read(self, conn: Connection, device_id: str) -> None:
        """Frames through ASGI `receive()`, for a server without the `orrery.frames` extension."""
        while not conn.closed:
            data = await _receive(conn.ws, conn)
            if data is None:
                return
            step = self.take_frame(conn, device_id, data)
            if isinstance(step, _Stop):
                return
            if step is not None:
                await step

    def take_frame(self, conn: Connection, device_id: str, data: str | bytes) -> Awaitable[None] | _Stop | None:
        """Take one frame from the device: _STOP if this connection is done with, an awaitable if
        the frame must be durable in the engine before the next frame is taken, else None."""
        if conn.closed:
            return _STOP
        link = self.links.get(device_id)
        if link is None or link.conn is not conn:
            return _STOP  # superseded or revoked while we waited
        silence = time.monotonic() - link.last_frame
        msg = conn.channel.receive(data)
        self._touch(link)
        if msg is None:
            return None
        if isinstance(msg, Heartbeat):
            link.batch_id = msg.batch_id
            if msg.control_gen != link.control_gen:
                # The agent applied its controls (it heartbeats at once when it does): tell the
                # engine now rather than at the next periodic report, so an operator sees it.
                link.control_gen = msg.control_gen
                self.cluster.report(self.link_report([link]))
            self.metrics.heartbeat_lag.observe(max(0.0, silence - self.settings.heartbeat_interval_s))
            self._heartbeat_reply(conn)
        elif isinstance(msg, Error):
            # Device-chosen text: quoted and cut, so it cannot forge or flood log lines.
            log.warning("device %s reported %r: %r", device_id, msg.code[:64], msg.message[:500])
        elif isinstance(msg, ViewFrame | ViewEnded | ViewInputResult):
            # A live view's frame: to its viewers, not the engine (never stored, never numbered).
            if self.views is not None:
                self.views.take(device_id, msg)
        elif isinstance(msg, BatchAccepted):
            # Nothing durable hangs on an acceptance: do not hold the reader for it.
            self.cluster.notify(FrameIn(device_id, msg))
            link.session.confirm(msg.seq)
        elif is_reliable(msg):
            if isinstance(msg, ResultBatch) and msg.batch_id == link.batch_id:
                link.batch_id = None  # it no longer runs it (until a heartbeat says otherwise)
            # Handed to the engine now, in this loop turn; what follows waits for it to be durable.
            return self._durable(link, conn, msg, self._engine(link, FrameIn(link.device_id, msg)))
        return None

    async def _durable(self, link: Link, conn: Connection, msg: Message, stored: Awaitable[Any]) -> None:
        try:
            await stored
        except Exception as exc:
            if not refused_data(exc):
                raise
            # The store refused what the frame carries (the protocol's checks let it through):
            # this device's frame is refused, as a malformed one is; nothing else is affected.
            raise MalformedFrame(
                f"the orchestrator could not store this '{msg.type}' frame (text or a value its store "
                "refuses); it was not taken: send it without that"
            ) from None
        link.session.confirm(msg.seq)
        # Acknowledge soon, so the agent's outbox can let go of what is now durable here (the
        # session's ack policy says when; usually a command batch carries it first).
        due = link.acks.confirmed(asyncio.get_running_loop().time())
        if due is not None:
            self._ack_at(due, link, conn)

    def _engine(self, link: Link, item: Input) -> asyncio.Future[Any]:
        """Hand an input to the engine at once; the future gives its answer once the input is
        durable. Meanwhile (possibly an engine failover) the reader reads nothing, so liveness
        must not count the silence; the cluster ends the wait within its request deadline. The
        count is settled by the future itself, whether or not anyone still awaits it."""
        link.waiting += 1
        try:
            answer = self.cluster.submit(item)
        except BaseException:
            link.waiting -= 1
            raise
        answer.add_done_callback(functools.partial(self._answered, link))
        return answer

    def _answered(self, link: Link, answer: asyncio.Future[Any]) -> None:
        link.waiting -= 1
        self._touch(link)
        if not answer.cancelled():
            answer.exception()  # whoever awaits it sees the failure; an abandoned one is not logged

    def _ack_at(self, due: float, link: Link, conn: Connection) -> None:
        # Acks are timed on the loop's own clock (`loop.time()`), the one its timers keep (uvloop
        # reads it once per loop turn, to the millisecond). The timer carries the deadline it was
        # set for, and when it runs the policy decides without reading any clock: it runs once.
        asyncio.get_running_loop().call_at(due, self._ack_if_due, link, conn, due)

    def _ack_if_due(self, link: Link, conn: Connection, due: float) -> None:
        if link.conn is conn and link.acks.timer_ran(due):
            self._heartbeat_reply(conn)

    def _heartbeat_reply(self, conn: Connection) -> None:
        session = conn.channel.session
        if session is not None:
            conn.push(conn.channel.send(session.heartbeat_reply()))

    # ================================================================ liveness

    def _touch(self, link: Link) -> None:
        link.last_frame = time.monotonic()
        self.cluster.device_seen(link.device_id, link.epoch)
        if link.liveness is not Liveness.ONLINE:
            link.liveness = Liveness.ONLINE
            self._liveness(link)

    def _liveness(self, link: Link) -> None:
        self.cluster.notify(LivenessChanged(link.device_id, link.liveness, link.epoch, self.cluster.replica_id))

    async def _watch_liveness(self) -> None:
        """SPEC section 4: suspect after two silent intervals, offline after the timeout."""
        period = max(0.05, min(1.0, self.settings.heartbeat_interval_s / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for link in list(self.links.values()):
                if link.waiting:
                    continue
                silent = now - link.last_frame
                if silent > self.settings.heartbeat_timeout_s:
                    self._go_offline(link)
                elif silent > self.settings.suspect_after_s and link.liveness is Liveness.ONLINE:
                    link.liveness = Liveness.SUSPECT
                    self._liveness(link)

    def _go_offline(self, link: Link, why: str | None = None) -> None:
        """The session ends with the device: a later hello starts afresh and is fenced."""
        if self.links.get(link.device_id) is link:
            del self.links[link.device_id]
        if link.conn:
            link.conn.close(CloseCode.GOING_AWAY, "heartbeat timeout")
        if why is not None:
            log.info("device %s is offline (%s)", link.device_id, why)
        else:
            silent = time.monotonic() - link.last_frame
            log.warning("device %s is offline (no frame for %.1fs)", link.device_id, silent)
        link.liveness = Liveness.OFFLINE
        self.cluster.device_gone(link.device_id, link.epoch)
        if self.views is not None:
            self.views.device_gone(link.device_id)
        self._liveness(link)


class _Stop:
    """`Gateway.take_frame`: this connection takes no more frames."""


_STOP = _Stop()


class _Pump(FrameSink):
    """Frames of one connection as the protocol hands them over (`orrery.frames`), taken in order
    by `Gateway.take_frame`. While a frame waits for the engine, reading is held and frames already
    read wait in `backlog`; a task runs only then, so an idle connection keeps nothing waiting
    but `ended`. `run` returns (or raises) as the ASGI reader loop would."""

    def __init__(self, gateway: Gateway, conn: Connection, device_id: str) -> None:
        self.gateway, self.conn, self.device_id = gateway, conn, device_id
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.backlog: deque[str | bytes | None] | None = None  # not None while busy; None item: gone
        self.busy: asyncio.Task[None] | None = None
        self.flow: FrameFlow | None = None

    async def run(self, attach: Callable[[FrameSink], FrameFlow]) -> None:
        self.flow = attach(self)
        self.conn.direct = self.flow.write_text
        try:
            await self.ended
        finally:
            if self.busy is not None:
                self.busy.cancel()

    def frame(self, data: str | bytes) -> None:
        if self.ended.done():
            return
        if self.backlog is not None:
            self.backlog.append(data)
            return
        try:
            step = self.gateway.take_frame(self.conn, self.device_id, data)
        except BaseException as exc:
            self._end(exc)
            return
        if isinstance(step, _Stop):
            self._end(None)
        elif step is not None:
            self.backlog = deque()
            if self.flow is not None:
                self.flow.hold()
            self.busy = asyncio.get_running_loop().create_task(self._finish(step))

    def gone(self, code: int | None = None) -> None:
        if self.conn.ended_with is None and not self.conn.closed:  # the agent closed first
            self.conn.ended_with = code
        if self.backlog is not None:
            self.backlog.append(None)  # after the frames read before it
        else:
            self._end(None)

    async def _finish(self, first: Awaitable[None]) -> None:
        assert self.backlog is not None
        try:
            await first
            while self.backlog:
                data = self.backlog.popleft()
                if data is None:
                    self._end(None)
                    return
                step = self.gateway.take_frame(self.conn, self.device_id, data)
                if isinstance(step, _Stop):
                    self._end(None)
                    return
                if step is not None:
                    await step
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._end(exc)
            return
        finally:
            self.busy = None
        self.backlog = None
        if self.flow is not None:
            self.flow.release()

    def _end(self, exc: BaseException | None) -> None:
        if not self.ended.done():
            if exc is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(exc)


async def _receive(ws: WebSocket, conn: Connection | None = None) -> str | bytes | None:
    """One data frame, or None when the peer went away (its close code kept on `conn`)."""
    msg = await ws.receive()
    if msg["type"] == "websocket.disconnect":
        if conn is not None and conn.ended_with is None and not conn.closed:  # the agent closed first
            conn.ended_with = msg.get("code")
        return None
    if msg.get("text") is not None:
        return str(msg["text"])
    return bytes(msg.get("bytes") or b"")


async def _deny(ws: WebSocket, status: int, code: str, detail: str) -> None:
    """Refuse the upgrade with an HTTP response, before any frame (SPEC section 4)."""
    from orchestrator.api.errors import problem_response

    try:
        await ws.send_denial_response(problem_response(status, code, detail))
    except RuntimeError:
        await ws.close(CloseCode.UNAUTHORIZED if status == 401 else CloseCode.MALFORMED)


__all__ = ["SUPPORTED_VERSIONS", "Gateway"]
