"""An in-memory stand-in for `orchestrator.store.repo.Store`: what the engine calls, nothing more.

Rows are the real ORM classes (`orchestrator.store.models`), built without a session. A write
applies its `ChangeSet` atomically: everything is checked first (the lease guard, unique keys,
an injected failure), and only then applied, so a refused write leaves no trace. JSON values
are copied on the way in, as a database would serialize them, so the engine's memory and the
store never share a mutable object (sharing would make "store and memory agree" trivially true).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.engine.times import utc
from orchestrator.store.models import (
    Approval,
    Attempt,
    Base,
    DagEdit,
    Device,
    DeviceHistory,
    Edge,
    Event,
    LlmCall,
    Node,
    NodeChild,
    Schedule,
    ScheduleTick,
    Task,
)
from orchestrator.store.repo import (
    _INSERT_ORDER,
    ACTIVE_TASK_STATES,
    ChangeSet,
    LeaseLost,
    RuntimeSnapshot,
    TaskBundle,
    WriteConflict,
)
from orchestrator.store.schedules import Loaded

# Device text the protocol lets through but the database cannot hold (as Postgres refuses NUL in
# text): a write carrying it in an attempt's row is refused for its data (SQLSTATE class 22).
POISON = "unstorable text"


class StoreDown(Exception):
    """An injected write failure (the database went away for this commit)."""


_AUTO_ID = {Event, DeviceHistory, LlmCall}


def _pk(model: type[Base]) -> tuple[str, ...]:
    return tuple(c.key for c in model.__table__.primary_key.columns)  # type: ignore[attr-defined]


def _defaults(model: type[Base]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col in model.__table__.columns:
        d = col.default
        if d is None:
            out[col.key] = None
        elif getattr(d, "is_scalar", False):
            out[col.key] = d.arg
        elif getattr(d, "is_callable", False):
            out[col.key] = d.arg(None)
        else:
            out[col.key] = None
    return out


_DEFAULTS: dict[type[Base], dict[str, Any]] = {}


def _copy(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.loads(json.dumps(value))
    return value


class _NoSessions:
    """The engine reads nothing of the simulated store through a session: every query is refused,
    so nothing reads a table by a path this store does not model."""

    async def __aenter__(self) -> _NoSessions:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def execute(self, query: Any) -> Any:
        raise NotImplementedError(f"the simulated store answers no session queries: {query}")


@dataclass
class Lease:
    holder: str | None = None
    fence: int = 0
    expires: float = 0.0
    session: int | None = None  # the holder's database session (`holder_pid`); None: not recorded


@dataclass
class MemStore:
    clock: Callable[[], float]
    rows: dict[type[Base], dict[tuple[Any, ...], Any]] = field(default_factory=dict)
    leases: dict[str, Lease] = field(default_factory=dict)
    fail_next: int = 0  # the next this many writes fail (an injected outage)
    writes: int = 0
    read_only: bool = False  # a probe's view: writes are accepted and dropped
    on_write: Callable[[ChangeSet], None] | None = None  # checks on every applied change set
    poison: bool = False  # refuse writes carrying POISON (a seed's fault)
    refused: set[str] = field(default_factory=set)  # batches whose results were refused for POISON
    sessions_gone: set[int] = field(default_factory=set)  # lease holders' sessions that ended
    _seq: int = 0

    def fork(self) -> MemStore:
        """A read-only view of the same rows (for a probe engine that must change nothing)."""
        return MemStore(self.clock, self.rows, self.leases, read_only=True)

    def table(self, model: type[Base]) -> dict[tuple[Any, ...], Any]:
        return self.rows.setdefault(model, {})

    def sessions(self) -> _NoSessions:
        return _NoSessions()

    async def close(self) -> None:
        pass

    # ------------------------------------------------------------------ writes

    def _build(self, model: type[Base], row: dict[str, Any]) -> tuple[tuple[Any, ...], Any]:
        defaults = _DEFAULTS.get(model)
        if defaults is None:
            defaults = _DEFAULTS[model] = _defaults(model)
        values = {k: _copy(v) for k, v in defaults.items()}
        values.update({k: _copy(v) for k, v in row.items()})
        if model in _AUTO_ID and values.get("id") is None:
            self._seq += 1
            values["id"] = self._seq
        obj = model.__mapper__.class_manager.new_instance()
        obj.__dict__.update(values)  # as a loaded row: no change history to track
        return tuple(values[k] for k in _pk(model)), obj

    async def write(self, changes: ChangeSet) -> list[int]:
        self.writes += 1
        if self.read_only:
            return list(range(1, len(changes.events) + 1))
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StoreDown("injected: the store refused this write")
        if changes.guard is not None:
            name, holder, fence = changes.guard
            lease = self.leases.get(name)
            if lease is None or lease.holder != holder or lease.fence != fence or lease.expires <= self.clock():
                raise LeaseLost(f"lease '{name}' (fence {fence}) is no longer held by {holder}")
        if self.poison:
            self._refuse_poison(changes)
        built: list[tuple[type[Base], tuple[Any, ...], Any]] = []
        seen: set[tuple[type[Base], tuple[Any, ...]]] = set()
        for model in _INSERT_ORDER:
            for row in changes.inserts.get(model, []):
                key, obj = self._build(model, row)
                if key in self.table(model) or (model, key) in seen:
                    raise WriteConflict(f"duplicate key {key} in {model.__tablename__}")
                seen.add((model, key))
                built.append((model, key, obj))
        events = [self._build(Event, ev) for ev in changes.events]
        if self.on_write is not None:
            self.on_write(changes)
        # ---- nothing can fail below: apply
        for model, key, obj in built:
            self.table(model)[key] = obj
        for model, by_key in changes.updates.items():
            table = self.table(model)
            for key, values in by_key.items():
                obj = table.get(tuple(key))
                if obj is None:
                    continue  # an UPDATE of a missing row changes nothing
                for k, v in values.items():
                    setattr(obj, k, _copy(v))
        for model, keys in changes.deletes.items():
            for key in keys:
                self.table(model).pop(tuple(key), None)
        for key, obj in events:
            self.table(Event)[key] = obj
        return [int(obj.id) for _, obj in events]

    def _refuse_poison(self, changes: ChangeSet) -> None:
        """POISON in any row or event is refused, as a database refuses text it cannot hold;
        the batches whose results carried it are noted for the checks."""
        rows = [list(changes.inserts.values()), [list(u.values()) for u in changes.updates.values()], changes.events]
        if POISON not in json.dumps(rows, default=str):
            return
        for key, values in changes.updates.get(Attempt, {}).items():
            if POISON in json.dumps(values, default=str):
                self.refused.add(key[0])
        raise sqlite3.DataError(f"the store cannot hold this text: {POISON}")

    async def add(self, model: type[Base], row: dict[str, Any]) -> None:
        changes = ChangeSet()
        changes.insert(model, row)
        await self.write(changes)

    async def update(self, model: type[Base], key: tuple[Any, ...], **values: Any) -> None:
        changes = ChangeSet()
        changes.update(model, key, **values)
        await self.write(changes)

    # ------------------------------------------------------------------ leases and sessions

    def take_lease(self, name: str, holder: str, ttl_s: float, session: int | None = None) -> int | None:
        """`acquire_lease`: free, expired, ours, or held by a session that is gone -> ours (fence
        bumped for a new holder), recording the taker's session."""
        lease = self.leases.setdefault(name, Lease())
        now = self.clock()
        dead = lease.session is not None and lease.session in self.sessions_gone
        if lease.holder not in (None, holder) and lease.expires > now and not dead:
            return None
        if lease.holder != holder:
            lease.fence += 1
        lease.holder, lease.expires, lease.session = holder, now + ttl_s, session
        return lease.fence

    def end_session(self, session: int) -> None:
        """A lease holder's database session ends (its backend gone from `pg_stat_activity`)."""
        self.sessions_gone.add(session)

    def expire_lease(self, name: str) -> None:
        lease = self.leases.get(name)
        if lease is not None:
            lease.expires = self.clock() - 1.0

    async def open_session(self, device_id: str) -> int:
        row = self.table(Device).get((device_id,))
        if row is None:
            return 0
        row.session_epoch = int(row.session_epoch or 0) + 1
        return int(row.session_epoch)

    # ------------------------------------------------------------------ reads

    async def get_device(self, device_id: str) -> Device | None:
        return self.table(Device).get((device_id,))

    async def device_admin(
        self, after: str = "", limit: int = 1_000_000
    ) -> list[tuple[str, str, str, dict[str, Any], str]]:
        rows = [
            (d.id, d.name, d.admin_state, dict(d.labels or {}), d.token_hash)
            for _, d in sorted(self.table(Device).items())
            if d.id > after
        ]
        return rows[:limit]

    async def last_device_state(self, device_id: str) -> str | None:
        rows = [h for h in self.table(DeviceHistory).values() if h.device_id == device_id]
        return str(max(rows, key=lambda h: h.id).state) if rows else None

    async def find_approval(self, approval_id: str) -> Approval | None:
        return self.table(Approval).get((approval_id,))

    async def approvals_to_restore(self) -> list[Approval]:
        attempts = self.table(Attempt)
        return sorted(
            (
                a
                for a in self.table(Approval).values()
                if a.state == "pending" or ((a.batch_id,) in attempts and attempts[(a.batch_id,)].ended_at is None)
            ),
            key=lambda a: (a.created_at, a.id),
        )

    async def prune_device_history(self, device_ids: Sequence[str], keep: int) -> int:
        removed = 0
        table = self.table(DeviceHistory)
        for device_id in device_ids:
            ids = sorted((k for k, h in table.items() if h.device_id == device_id), key=lambda k: k[0])
            for key in ids[: max(0, len(ids) - keep)]:
                del table[key]
                removed += 1
        return removed

    async def active_task_ids(self, created_since: datetime) -> list[tuple[str, str]]:
        return [
            (t.id, t.state)
            for _, t in sorted(self.table(Task).items())
            if t.state in ACTIVE_TASK_STATES and t.created_at >= created_since
        ]

    async def find_admitted(self, task_id: str, key: str | None) -> Task | None:
        found = self.table(Task).get((task_id,))
        if found is None and key:
            found = next((t for _, t in sorted(self.table(Task).items()) if t.idempotency_key == key), None)
        return found

    async def find_attempt(self, batch_id: str) -> Attempt | None:
        return self.table(Attempt).get((batch_id,))

    def _bundle(self, task: Task) -> TaskBundle:
        nodes = sorted((n for n in self.table(Node).values() if n.task_id == task.id), key=lambda n: n.position)
        edges = [e for _, e in sorted(self.table(Edge).items()) if e.task_id == task.id]
        attempts = sorted(
            (a for a in self.table(Attempt).values() if a.task_id == task.id), key=lambda a: (a.n, a.batch_id)
        )
        children = sorted(
            (c for c in self.table(NodeChild).values() if c.task_id == task.id), key=lambda c: (c.node_id, c.position)
        )
        return TaskBundle(task, nodes, edges, attempts, children)

    async def get_task(self, task_id: str) -> TaskBundle | None:
        task = self.table(Task).get((task_id,))
        return self._bundle(task) if task is not None else None

    async def load_runtime(self) -> RuntimeSnapshot:
        devices = [d for _, d in sorted(self.table(Device).items())]
        tasks = [t for _, t in sorted(self.table(Task).items()) if t.state in ACTIVE_TASK_STATES]
        return RuntimeSnapshot(devices, [self._bundle(t) for t in tasks])

    # ------------------------------------------------------------------ schedules (the book's own readers)

    async def load_schedules(self, _store: Any = None) -> Loaded:
        """`store/schedules.load`: every schedule, its queued ticks and how many it recorded."""
        rows = sorted(self.table(Schedule).values(), key=lambda r: r.name)
        queued: dict[str, list[datetime]] = {}
        ticks: dict[str, int] = {}
        for (schedule_id, at), tick in sorted(self.table(ScheduleTick).items()):
            ticks[schedule_id] = ticks.get(schedule_id, 0) + 1
            if tick.outcome == "queued":
                queued.setdefault(schedule_id, []).append(at)
        return Loaded(rows, queued, ticks)

    async def prune_ticks(self, _store: Any, schedule_id: str, keep: int) -> int:
        table = self.table(ScheduleTick)
        mine = sorted((at for (sid, at) in table if sid == schedule_id), reverse=True)
        if len(mine) <= keep:
            return 0
        oldest_kept = mine[keep - 1]
        gone = [(schedule_id, at) for at in mine if at < oldest_kept and table[(schedule_id, at)].outcome != "queued"]
        if not self.read_only:
            for key in gone:
                del table[key]
        return len(gone)

    # ------------------------------------------------------------------ for the checks

    def tasks(self) -> list[Task]:
        return [t for _, t in sorted(self.table(Task).items())]

    def attempts(self) -> list[Attempt]:
        return [a for _, a in sorted(self.table(Attempt).items())]

    def device(self, device_id: str) -> Device:
        row = self.table(Device)[(device_id,)]
        return row  # type: ignore[no-any-return]


__all__ = ["POISON", "DagEdit", "Lease", "MemStore", "StoreDown", "utc"]
