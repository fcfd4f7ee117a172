"""Several `orrery serve` replicas on Postgres and Redis (SPEC section 7).

Every replica serves the REST API, server-sent events and device WebSockets. One of them, the
holder of the `engine` lease in Postgres (a row with an expiry, a fencing counter and the
holder's Postgres session, taken by a single conditional statement), runs the engine; every
engine commit re-checks that lease inside its transaction, so a replica that lost it cannot
write. A leader that died is succeeded as soon as its Postgres session is gone; one that hangs,
at its lease's expiry. The rules that keep the guarantees when Redis loses messages
(docs/replicas.md has them in full):

- Postgres is the only truth. A Redis message is a hint that something changed in the store, or
  a frame on its way to a socket; losing any of them delays work and never loses it.
- Tasks are adopted from the store: the leader reconciles its memory with the task rows every
  `reconcile_interval_s`, so a lost `task_created` costs that long.
- Device state is re-derived: each replica re-announces its links (`LinkReport`) every
  `link_report_interval_s`, carrying liveness, the batch each device says it runs, and the
  connection epoch. A lost liveness change, acceptance or presence announcement costs one report.
- Only the newest connection of a device speaks for it: every connection takes the next epoch
  from the store, presence keys record `<replica>|<epoch>` and only a newer epoch replaces them,
  and the engine ignores what an older epoch says (a replica the device left cannot declare it
  offline).
- Cross-replica requests are retried until answered or until `cluster_request_timeout_s`, then
  fail with `ClusterUnavailable` (503 `cluster_unavailable`); they never hang.
- No Redis failure stops a replica: publishing is best effort, and while the leader cannot hear
  the bus it does not judge remote devices by their silence (`Hearing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

import orjson
from redis import asyncio as aioredis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from orchestrator.bus import keys
from orchestrator.cluster import ClusterUnavailable, DeviceSockets, wire
from orchestrator.config import Settings
from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem
from orchestrator.engine.records import DeviceRun, Hearing, Input, LinkReport, Route, SubmitTask
from orchestrator.engine.restore import device_from_row
from orchestrator.engine.validation import validate_against
from orchestrator.store.repo import Store
from protocol.codec import decode, encode
from protocol.messages import Message

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine

log = logging.getLogger("orrery.cluster")

LEASE = "engine"
FOLLOWER_TRY_S = 0.5  # a follower tries for the lease at least this often (the leader renews every ttl/3)
RPC_ATTEMPT_S = 5.0  # one try of a cross-replica request, before it is asked again
REDIS_OP_S = 5.0  # one Redis command; an unresponsive Redis must not stall a replica
PUBLISH_BATCH = 256  # messages sent in one pipeline at most
REDIS_CONNECTIONS = 100  # a replica's connections to Redis at most (the subscription's among them)
# Presence is "<replica>|<epoch>"; a claim replaces it only with an epoch at least as new.
_CLAIM = """
local cur = redis.call('get', KEYS[1])
if cur then
  local held = tonumber(string.match(cur, '|(%d+)$'))
  if held and held > tonumber(ARGV[2]) then return 0 end
end
redis.call('set', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""
_RELEASE_IF_MINE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


def redis_client(url: str) -> Redis:
    """The replica's Redis client. A command waits (up to REDIS_OP_S) for a free connection of the
    pool rather than failing at once when every one is busy: a fan-out's hundreds of relayed
    results at once would otherwise lose their requests and answers to "Too many connections",
    and wait out a whole RPC_ATTEMPT_S before asking again. A restarted Redis leaves dead
    connections in the pool: a command is retried (briefly) on a fresh one, instead of losing the
    frame or hint it carried."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        timeout=REDIS_OP_S,
        max_connections=REDIS_CONNECTIONS,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), 3),
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=30,
    )
    return Redis.from_pool(pool)


class RedisCluster:
    def __init__(self, settings: Settings, store: Store, engine: Engine, gateway: DeviceSockets, redis: Redis) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine
        self.gateway = gateway
        self.redis = redis
        self.replica_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        engine.replica_id = self.replica_id
        self.ttl_s = settings.lease_ttl_s
        self.fence = 0
        self._leader = False
        self._lost = False  # lost the lease once: this process never leads again (a restart may)
        self._hearing = False  # our subscription to the bus is up
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._out: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        self._seen: dict[str, float] = {}
        self._listening = asyncio.Event()
        self._became_leader = asyncio.Event()
        self._stopping = False
        self._failing_since: float | None = None  # Redis refuses our publishes since then
        self._fleet: tuple[int, list[DeviceRun]] | None = None  # (catalogue version, devices) on a follower

    # ================================================================ lifecycle

    @property
    def is_leader(self) -> bool:
        return self._leader

    async def start(self) -> None:
        self._spawn(self._listen(), "cluster-listen")
        self._spawn(self._publish(), "cluster-publish")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._listening.wait()  # else serve anyway: the bus is a hint (SPEC section 7)
        try:
            await self._try_lead()
        except Exception as exc:  # the database is down now: the election loop keeps trying
            log.warning("could not try for the engine lease yet: %s", exc)
        self._spawn(self._elect(), "cluster-elect")

    async def stop(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._leader:
            await self.engine.stop()
            with contextlib.suppress(Exception):
                await self.store.release_lease(LEASE, self.replica_id)

    def status(self) -> dict[str, Any]:
        return {
            "mode": "replicated",
            "replica": self.replica_id,
            "leader": self._leader,
            "fence": self.fence,
            "bus": "ok" if self._hearing else "unreachable",
        }

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ================================================================ the engine lease

    async def _elect(self) -> None:
        """Renew every ttl/3 while leading; while following, try every `min(ttl/3, 0.5 s)` (one
        statement): a leader whose Postgres session is gone (its process died) is succeeded at
        once, not at its lease's expiry."""
        while not self._stopping and not self._lost:
            await asyncio.sleep(self.ttl_s / 3 if self._leader else min(self.ttl_s / 3, FOLLOWER_TRY_S))
            try:
                await self._try_lead()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is unreachable: the commit guard protects writes
                log.warning("lease renewal failed: %s", exc)

    async def _try_lead(self) -> None:
        if self._lost or self._stopping:
            return
        fence = await self.store.acquire_lease(LEASE, self.replica_id, self.ttl_s)
        if fence is not None and not self._leader:
            await self._become_leader(fence)
        elif fence is None and self._leader:
            self._lose_lead("engine lease lost")

    def _lose_lead(self, why: str) -> None:
        """Stop for good: this engine's memory may now disagree with the store, and a second
        engine loop on it must never start (a restarted process may lead again)."""
        log.critical("replica %s: %s; stopping so it cannot act on stale state", self.replica_id, why)
        self._leader = False
        self._lost = True
        self.engine.on_fatal(RuntimeError(why))

    async def _become_leader(self, fence: int) -> None:
        self.fence = fence
        self.engine.lease_guard = (LEASE, self.replica_id, fence)
        # Lead before recovery ends: inputs that arrive meanwhile wait in the engine's inbox
        # instead of being dropped (the engine applies them once it has rebuilt its state).
        self._leader = True
        try:
            await self.engine.start()  # recovery from the store, exactly as after a restart
        except BaseException:
            self._leader, self._lost = False, True  # the engine has already stopped the process
            raise
        if not self._hearing:
            self.engine.notify(Hearing(False))
        self._became_leader.set()
        self._ask_again()  # our own requests now go to our own engine
        log.warning("replica %s now leads the engine (fence %d)", self.replica_id, fence)
        self._out.put_nowait(("publish", keys.LEADER, {"replica": self.replica_id, "fence": fence}))
        self.report(self.gateway.link_report())

    # ================================================================ engine inputs

    def submit(self, item: Input) -> asyncio.Future[Any]:
        if self._leader:
            return self.engine.submit(item)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._spawn(self._rpc(item, fut), "cluster-rpc")
        return fut

    def notify(self, item: Input) -> None:
        if self._leader:
            self.engine.notify(item)
        else:
            self._out.put_nowait(("publish", keys.INBOX, {"op": "notify", "input": wire.dump(item)}))

    def report(self, report: LinkReport) -> None:
        self.notify(report)

    async def _rpc(self, item: Input, fut: asyncio.Future[Any]) -> None:
        """Ask the leader until it answers or the deadline passes; the future always resolves.
        Every input that crosses replicas is idempotent, so asking again after a lost reply is safe."""
        limit = self.settings.cluster_request_timeout_s
        deadline = time.monotonic() + limit
        try:
            body = wire.dump(item)
            while not fut.done() and (left := deadline - time.monotonic()) > 0:
                if self._leader:  # we became the leader meanwhile (the old one may have taken it)
                    if isinstance(item, SubmitTask):
                        item.asked_before = True
                    try:
                        fut.set_result(await asyncio.wait_for(self.engine.submit(item), left))
                    except TimeoutError:  # our new engine (still recovering, or busy) did not answer in time
                        raise ClusterUnavailable(f"no engine leader answered within {limit:g}s; retry later") from None
                    return
                answer = await self._ask(body, min(RPC_ATTEMPT_S, left))
                if answer is None:
                    continue  # no leader answered (a failover, Redis away, or we lead now): ask again
                if answer.get("ok"):
                    fut.set_result(answer.get("value"))
                else:  # the leader's engine failed on it (e.g. it lost the lease mid-commit): try again later
                    why = str(answer.get("error") or "the engine refused the input")[:200]
                    fut.set_exception(
                        ClusterUnavailable(f"the engine leader could not take this now ({why}); retry later")
                    )
                return
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
        finally:
            if not fut.done():
                fut.set_exception(ClusterUnavailable(f"no engine leader answered within {limit:g}s; retry later"))

    async def _ask(self, body: dict[str, Any], wait_s: float) -> dict[str, Any] | None:
        """One request through Redis; the leader's answer, or None if none came in `wait_s` or a
        new leader took over meanwhile (`_ask_again`: the request may have gone to a dead one)."""
        request_id = secrets.token_hex(8)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = reply
        started = time.monotonic()
        try:
            request = {
                "op": "submit",
                "id": request_id,
                "reply_to": keys.replica_replies(self.replica_id),
                "input": body,
            }
            async with asyncio.timeout(wait_s):
                await self.redis.publish(keys.INBOX, orjson.dumps(request))
            left = max(0.0, wait_s - (time.monotonic() - started))
            await asyncio.wait({reply}, timeout=left)
        except Exception as exc:  # Redis refused or timed out: wait a little, then ask again
            log.warning("could not reach the engine leader through Redis (%s)", exc)
            await asyncio.sleep(min(0.5, max(0.0, wait_s - (time.monotonic() - started))))
            return None
        finally:
            self._pending.pop(request_id, None)
        return reply.result() if reply.done() else None

    def _ask_again(self) -> None:
        """A replica (this one, or another) now leads: every request waiting for an answer is
        asked again at once, not at the end of its try (RPC_ATTEMPT_S): it may have gone to the
        leader that died, or to nobody. Each is idempotent, so one answered twice is harmless."""
        for reply in self._pending.values():
            if not reply.done():
                reply.set_result(None)

    def _serve_input(self, message: dict[str, Any]) -> None:
        """Another replica's input, for our engine. A request's answer goes out when the engine
        has it, in the publisher's next pipeline with whatever else is queued (many results
        relayed at once are answered in one write): no task and no round trip per request. An
        engine that never answers leaves the requester to ask again (`RPC_ATTEMPT_S`) until its
        deadline."""
        try:
            item = wire.load(message["input"])
        except (wire.NotPortable, KeyError, ValueError) as exc:
            log.warning("dropped an engine input from another replica: %s", exc)
            return
        if message.get("op") == "notify":
            self.engine.notify(item)
            return
        reply_to, request_id = str(message.get("reply_to")), message.get("id")
        self.engine.submit(item).add_done_callback(lambda done: self._answer(reply_to, request_id, done))

    def _answer(self, reply_to: str, request_id: Any, done: asyncio.Future[Any]) -> None:
        if done.cancelled():
            answer = {"id": request_id, "ok": False, "error": "the engine stopped"}
        elif (exc := done.exception()) is not None:
            answer = {"id": request_id, "ok": False, "error": str(exc)[:500]}
        else:
            value = done.result()
            portable = isinstance(value, bool | int | str | dict)  # a dict: an `Admission`
            answer = {"id": request_id, "ok": True, "value": value if portable else None}
        self._out.put_nowait(("publish", reply_to, answer))

    # ================================================================ frames for devices

    def send(self, device_id: str, message: Message, route: Route) -> bool:
        if route.replica in (None, self.replica_id) and self.gateway.send(device_id, message, route.epoch):
            return True
        target = route.replica if route.replica != self.replica_id else None
        body = {"op": "send", "device_id": device_id, "epoch": route.epoch, "frame": encode(message), "to": target}
        self._out.put_nowait(("route", device_id, body))
        return True  # it may reach the device: counted as sent, so a retry is judged conservatively

    def close(self, device_id: str, code: int, reason: str, route: Route) -> None:
        self.gateway.close(device_id, code, reason)
        if route.replica != self.replica_id:
            body = {"op": "close", "device_id": device_id, "code": code, "reason": reason, "to": route.replica}
            self._out.put_nowait(("route", device_id, body))

    def _relay(self, message: dict[str, Any]) -> None:
        device_id = str(message["device_id"])
        if message["op"] == "send":
            epoch = int(message.get("epoch") or 0)
            if not self.gateway.send(device_id, decode(message["frame"]), epoch):
                log.info(
                    "no session of device %s from epoch %d here; its next report or hello re-sends", device_id, epoch
                )
        elif message["op"] == "close":
            self.gateway.close(device_id, int(message["code"]), str(message["reason"]))

    # ================================================================ presence

    def device_connected(self, device_id: str, epoch: int) -> None:
        self._seen[device_id] = time.monotonic()
        self._out.put_nowait(("presence", device_id, {"epoch": epoch}))

    def device_seen(self, device_id: str, epoch: int) -> None:
        last = self._seen.get(device_id, 0.0)
        if time.monotonic() - last >= self.settings.heartbeat_interval_s:
            self.device_connected(device_id, epoch)

    def device_gone(self, device_id: str, epoch: int) -> None:
        self._seen.pop(device_id, None)
        self._out.put_nowait(("absent", device_id, {"epoch": epoch}))

    # ================================================================ validation

    async def validate(self, spec: DagSpec) -> list[Problem]:
        """Against the fleet as the store has it (the engine may live on another replica)."""
        return validate_against(spec, await self.devices(), self.settings.dag_limits)

    async def devices(self, fresh: bool = False) -> list[DeviceRun]:
        """The leader's engine holds the fleet (as on one process). A follower keeps a copy read
        from the store, read again only when the store's device catalogue version moved (every
        committed change the checks look at moves it): one small read per submission rather than
        every device row parsed. Busy flags are not part of that version: `fresh` reads the rows
        (a dry run says which device a node would run on now)."""
        if self._leader and self._became_leader.is_set():
            return list(self.engine.devices.values())
        version = await self.store.device_catalog_version()
        if fresh or version is None or self._fleet is None or self._fleet[0] != version:
            devices = [device_from_row(row) for row in await self.store.list_devices()]
            self._fleet = (version, devices) if version is not None else None
            return list(devices)
        return list(self._fleet[1])

    # ================================================================ Redis plumbing

    async def _publish(self) -> None:
        """One task sends everything, in order: a frame never overtakes an earlier one. What has
        queued up meanwhile goes in one pipeline (one write, one wait for Redis's answers), not
        one round trip per message: a leader's step sends many frames to followers at once."""
        while True:
            batch = [await self._out.get()]
            while len(batch) < PUBLISH_BATCH and not self._out.empty():
                batch.append(self._out.get_nowait())
            kind = batch[0][0]
            try:
                async with asyncio.timeout(REDIS_OP_S):
                    await self._publish_batch(batch)
                if self._failing_since is not None:
                    log.warning("Redis takes our messages again after %.1fs", time.monotonic() - self._failing_since)
                    self._failing_since = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # lost: every such message is re-derived or re-sent (module docstring)
                if self._failing_since is None:
                    self._failing_since = time.monotonic()
                    log.warning("could not publish to Redis (%s: %s); carrying on without it", kind, exc)

    async def _publish_batch(self, batch: list[tuple[str, str, dict[str, Any]]]) -> None:
        """The messages in order through one pipeline; a frame whose device's replica must first
        be looked up sends what precedes it, then looks (so the order holds)."""
        ttl = int(max(self.settings.heartbeat_timeout_s, 1))
        pipe = self.redis.pipeline(transaction=False)
        queued = 0
        for kind, target, body in batch:
            if kind == "publish":
                pipe.publish(target, orjson.dumps(body))
            elif kind == "presence":
                value = f"{self.replica_id}|{body['epoch']}"
                pipe.eval(_CLAIM, 1, keys.presence(target), value, body["epoch"], ttl)
            elif kind == "absent":
                value = f"{self.replica_id}|{body['epoch']}"
                pipe.eval(_RELEASE_IF_MINE, 1, keys.presence(target), value)
            elif kind == "route":
                replica = body.pop("to", None)
                if replica is None:
                    if queued:
                        await pipe.execute()
                        queued = 0
                    holder = await self.redis.get(keys.presence(target))
                    if holder is None:
                        log.warning("no replica holds device %s; the frame waits for its next connection", target)
                        continue
                    replica = _text(holder).rsplit("|", 1)[0]
                if replica == self.replica_id:
                    self._relay(body)
                    continue
                pipe.publish(keys.replica_out(replica), orjson.dumps(body))
            else:
                continue
            queued += 1
        if queued:
            await pipe.execute()

    async def _listen(self) -> None:
        channels = [keys.INBOX, keys.LEADER, keys.replica_out(self.replica_id), keys.replica_replies(self.replica_id)]
        while not self._stopping:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(*channels)
                    self._listening.set()
                    self._heard(True)
                    async for raw in pubsub.listen():
                        if raw.get("type") != "message":
                            continue
                        channel = _text(raw["channel"])
                        if channel == keys.INBOX and not self._leader:
                            continue  # the leader's: a follower need not parse other followers' requests
                        try:
                            await self._dispatch(channel, orjson.loads(raw["data"]))
                        except Exception:  # one bad message must not cost the subscription
                            log.exception("could not handle a message on %s", channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._heard(False)
                log.warning("cluster subscription lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)

    def _heard(self, up: bool) -> None:
        if up == self._hearing:
            return
        self._hearing = up
        if self._leader:
            self.engine.notify(Hearing(up))
        if up:  # messages may have been lost meanwhile: re-announce our links at once
            self.report(self.gateway.link_report())

    async def _dispatch(self, channel: str, message: dict[str, Any]) -> None:
        if channel == keys.INBOX:  # heard by the leader only (`_listen` skips it on a follower)
            self._serve_input(message)
        elif channel == keys.LEADER:
            if message.get("replica") != self.replica_id:
                if self._leader:  # someone else holds the lease now: we must have lost it
                    await self._try_lead()
                self._ask_again()
                self.report(self.gateway.link_report())  # the new leader need not wait for a report
        elif channel == keys.replica_replies(self.replica_id):
            fut = self._pending.get(str(message.get("id")))
            if fut is not None and not fut.done():
                fut.set_result(message)
        else:
            self._relay(message)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
