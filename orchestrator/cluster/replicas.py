"""Several `orrery serve` replicas on Postgres and Redis (SPEC section 7).

Every replica serves the REST API, server-sent events and device WebSockets. One of them, the
holder of the `engine` lease in Postgres (a row with an expiry and a fencing counter, taken by a
single conditional UPDATE), runs the engine; every engine commit re-checks that lease inside its
transaction, so a replica that lost it cannot write. The others hand their engine inputs to the
leader through Redis and relay the leader's frames to the devices whose sockets they hold; a
device's replica is found from a presence key that its heartbeats keep alive. When the leader
dies its lease expires, another replica takes it, rebuilds the engine from the store (the same
path as a restart) and re-sends every open batch; agents de-duplicate by batch id.
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
from redis.asyncio import Redis

from orchestrator.bus import keys
from orchestrator.cluster import wire
from orchestrator.config import Settings
from orchestrator.domain.model import DagSpec, Liveness
from orchestrator.domain.problems import Problem
from orchestrator.engine.records import Input, LivenessChanged
from orchestrator.engine.restore import device_from_row
from orchestrator.engine.validation import validate_against
from orchestrator.store.repo import Store
from protocol.codec import decode, encode
from protocol.messages import Message

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine
    from orchestrator.gateway.hub import Gateway

log = logging.getLogger("orrery.cluster")

LEASE = "engine"
RPC_TIMEOUT_S = 5.0
RPC_DEADLINE_S = 60.0  # covers a leader failover (lease expiry plus recovery)
_RELEASE_IF_MINE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class ClusterUnavailable(Exception):
    """No engine leader answered in time."""


class RedisCluster:
    def __init__(self, settings: Settings, store: Store, engine: Engine, gateway: Gateway, redis: Redis) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine
        self.gateway = gateway
        self.redis = redis
        self.replica_id = settings.replica_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.ttl_s = settings.lease_ttl_s
        self.fence = 0
        self._leader = False
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._out: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        self._seen: dict[str, float] = {}
        self._listening = asyncio.Event()
        self._became_leader = asyncio.Event()
        self._stopping = False

    # ================================================================ lifecycle

    @property
    def is_leader(self) -> bool:
        return self._leader

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="cluster-listen"),
            asyncio.create_task(self._publish(), name="cluster-publish"),
        ]
        async with asyncio.timeout(10):
            await self._listening.wait()
        await self._try_lead()
        self._tasks.append(asyncio.create_task(self._elect(), name="cluster-elect"))

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._leader:
            await self.engine.stop()
            with contextlib.suppress(Exception):
                await self.store.release_lease(LEASE, self.replica_id)

    def status(self) -> dict[str, Any]:
        return {"mode": "replicated", "replica": self.replica_id, "leader": self._leader, "fence": self.fence}

    # ================================================================ the engine lease

    async def _elect(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self._try_lead()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database is unreachable: the commit guard protects writes
                log.warning("lease renewal failed: %s", exc)

    async def _try_lead(self) -> None:
        fence = await self.store.acquire_lease(LEASE, self.replica_id, self.ttl_s)
        if fence is not None and not self._leader:
            await self._become_leader(fence)
        elif fence is None and self._leader:
            log.critical("replica %s lost the engine lease; stopping so it cannot act on stale state", self.replica_id)
            self._leader = False
            self.engine.on_fatal(RuntimeError("engine lease lost"))

    async def _become_leader(self, fence: int) -> None:
        self.fence = fence
        self.engine.lease_guard = (LEASE, self.replica_id, fence)
        await self.engine.start()  # recovery from the store, exactly as after a restart
        self._leader = True
        self._became_leader.set()
        log.warning("replica %s now leads the engine (fence %d)", self.replica_id, fence)
        await self.redis.publish(keys.LEADER, orjson.dumps({"replica": self.replica_id, "fence": fence}))
        self._announce_devices()

    def _announce_devices(self) -> None:
        """Tell the (new) leader which devices are connected here, so it need not wait for them."""
        for device_id in self.gateway.connected():
            self.notify(LivenessChanged(device_id, Liveness.ONLINE))

    # ================================================================ engine inputs

    def submit(self, item: Input) -> asyncio.Future[Any]:
        if self._leader:
            return self.engine.submit(item)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._rpc(item, fut))
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)
        return fut

    def notify(self, item: Input) -> None:
        if self._leader:
            self.engine.notify(item)
        else:
            self._out.put_nowait(("publish", keys.INBOX, {"op": "notify", "input": wire.dump(item)}))

    async def _rpc(self, item: Input, fut: asyncio.Future[Any]) -> None:
        deadline = time.monotonic() + RPC_DEADLINE_S
        body = wire.dump(item)
        while time.monotonic() < deadline and not fut.done():
            if self._leader:  # we became the leader meanwhile
                try:
                    fut.set_result(await self.engine.submit(item))
                except Exception as exc:
                    fut.set_exception(exc)
                return
            request_id = secrets.token_hex(8)
            reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._pending[request_id] = reply
            await self.redis.publish(
                keys.INBOX,
                orjson.dumps(
                    {"op": "submit", "id": request_id, "reply_to": keys.replica_replies(self.replica_id), "input": body}
                ),
            )
            leading = asyncio.ensure_future(self._became_leader.wait())
            try:
                await asyncio.wait({reply, leading}, timeout=RPC_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                leading.cancel()
                self._pending.pop(request_id, None)
            if not reply.done():
                continue  # no leader answered (a failover, or we lead now): ask again
            answer = reply.result()
            if answer.get("ok"):
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(answer.get("error") or "the engine refused the input"))
            return
        if not fut.done():
            fut.set_exception(ClusterUnavailable("no engine leader answered; retry later"))

    async def _serve_input(self, message: dict[str, Any]) -> None:
        try:
            item = wire.load(message["input"])
        except (wire.NotPortable, KeyError, ValueError) as exc:
            log.warning("dropped an engine input from another replica: %s", exc)
            return
        if message["op"] == "notify":
            self.engine.notify(item)
            return
        try:
            await self.engine.submit(item)
            answer = {"id": message["id"], "ok": True}
        except Exception as exc:
            answer = {"id": message["id"], "ok": False, "error": str(exc)[:500]}
        await self.redis.publish(message["reply_to"], orjson.dumps(answer))

    # ================================================================ frames for devices

    def send(self, device_id: str, message: Message) -> bool:
        if self.gateway.holds(device_id):
            return self.gateway.send(device_id, message)
        self._out.put_nowait(("route", device_id, {"op": "send", "device_id": device_id, "frame": encode(message)}))
        return True  # it may reach the device: counted as sent, so a retry is judged conservatively

    def close(self, device_id: str, code: int, reason: str) -> None:
        if self.gateway.holds(device_id):
            self.gateway.close(device_id, code, reason)
        else:
            self._out.put_nowait(
                ("route", device_id, {"op": "close", "device_id": device_id, "code": code, "reason": reason})
            )

    def _relay(self, message: dict[str, Any]) -> None:
        device_id = message["device_id"]
        if message["op"] == "send":
            self.gateway.send(device_id, decode(message["frame"]))
        elif message["op"] == "close":
            self.gateway.close(device_id, int(message["code"]), str(message["reason"]))

    # ================================================================ presence

    def device_connected(self, device_id: str) -> None:
        self._seen[device_id] = time.monotonic()
        self._out.put_nowait(("presence", device_id, {}))

    def device_seen(self, device_id: str) -> None:
        last = self._seen.get(device_id, 0.0)
        if time.monotonic() - last >= self.settings.heartbeat_interval_s:
            self.device_connected(device_id)

    def device_gone(self, device_id: str) -> None:
        self._seen.pop(device_id, None)
        self._out.put_nowait(("absent", device_id, {}))

    # ================================================================ validation

    async def validate(self, spec: DagSpec) -> list[Problem]:
        """Against the fleet as the store has it (the engine may live on another replica)."""
        devices = [device_from_row(row) for row in await self.store.list_devices()]
        return validate_against(spec, devices, self.settings.dag_limits)

    # ================================================================ Redis plumbing

    async def _publish(self) -> None:
        """One task sends everything, in order: a frame never overtakes an earlier one."""
        ttl = int(max(self.settings.heartbeat_timeout_s, 1))
        while True:
            kind, target, body = await self._out.get()
            try:
                if kind == "publish":
                    await self.redis.publish(target, orjson.dumps(body))
                elif kind == "presence":
                    await self.redis.set(keys.presence(target), self.replica_id, ex=ttl)
                elif kind == "absent":
                    await self.redis.eval(_RELEASE_IF_MINE, 1, keys.presence(target), self.replica_id)
                elif kind == "route":
                    holder = await self.redis.get(keys.presence(target))
                    if holder is not None:
                        await self.redis.publish(keys.replica_out(_text(holder)), orjson.dumps(body))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("could not publish to Redis (%s): %s", kind, exc)

    async def _listen(self) -> None:
        channels = [keys.INBOX, keys.LEADER, keys.replica_out(self.replica_id), keys.replica_replies(self.replica_id)]
        while not self._stopping:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(*channels)
                    self._listening.set()
                    async for raw in pubsub.listen():
                        if raw.get("type") != "message":
                            continue
                        await self._dispatch(_text(raw["channel"]), orjson.loads(raw["data"]))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster subscription lost (%s); resubscribing", exc)
                await asyncio.sleep(0.5)

    async def _dispatch(self, channel: str, message: dict[str, Any]) -> None:
        if channel == keys.INBOX:
            if self._leader:
                task = asyncio.create_task(self._serve_input(message))
                self._tasks.append(task)
                task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)
        elif channel == keys.LEADER:
            if message.get("replica") != self.replica_id:
                if self._leader:  # someone else holds the lease now: we must have lost it
                    await self._try_lead()
                self._announce_devices()
        elif channel == keys.replica_replies(self.replica_id):
            fut = self._pending.get(str(message.get("id")))
            if fut is not None and not fut.done():
                fut.set_result(message)
        else:
            self._relay(message)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
