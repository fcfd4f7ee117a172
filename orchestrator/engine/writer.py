"""What one engine step writes: hard changes, soft changes, events, and the effects that may only
happen once all of it is committed (DESIGN, data flow: state is stored before it is spoken of)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, Protocol

from sqlalchemy.exc import DBAPIError

from orchestrator.engine.timers import Timers, Wake
from orchestrator.engine.times import iso, utc
from orchestrator.store.models import Base
from orchestrator.store.repo import ChangeSet, LeaseLost, WriteConflict

log = logging.getLogger("orrery.engine")

COMMIT_ATTEMPTS = 5
SOFT_FLUSH_S = 1.0  # informational updates wait at most this long for a commit to ride along


class EventType(StrEnum):
    """What a task's event stream says (SPEC section 3, events)."""

    TASK_STATE = "task.state"
    NODE_STATE = "node.state"
    NODE_ATTEMPT = "node.attempt"
    DAG_EDITED = "dag.edited"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_DECIDED = "approval.decided"
    NODE_CHILD = "node.child"  # a fan-out child's state (`device_id`, `device`)
    NODE_TAKEOVER = "node.takeover"  # its device was taken over by a person, or handed back


def refused_data(exc: BaseException) -> bool:
    """Whether the store refused what was written (its data: text it cannot hold, a value too long,
    a broken constraint) rather than failing itself (out of reach, the lease lost). Only the
    former is a fault of the input that wrote it; retrying it is pointless."""
    if isinstance(exc, LeaseLost):
        return False
    if isinstance(exc, WriteConflict | UnicodeError | sqlite3.DataError | sqlite3.IntegrityError):
        return True
    if isinstance(exc, DBAPIError):
        # SQLSTATE classes 22 (data exception) and 23 (integrity constraint violation).
        state = str(getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None) or "")
        return not exc.connection_invalidated and state[:2] in ("22", "23")
    return False


_SOFT = -1  # the source of soft changes (written on their own if they are refused)
# The step's own work (timers, scheduling), as `commit` reports it left out: once an input is
# refused, that work was decided on memory holding the refused input's changes, so it is not
# written (nor its effects run); the engine reloads what it touched, and the next step redoes it.
STEP_WORK = -2
_INSERT, _MERGE, _DELETE = 0, 1, 2


class ChangeStore(Protocol):
    async def write(self, changes: ChangeSet) -> list[int]: ...


class EventSink(Protocol):
    def publish(self, events: list[dict[str, Any]]) -> None:
        """Fan committed events out to subscribers; never blocks the engine and never raises
        (the events are in the store; readers fall back to it)."""
        ...


class StepWriter:
    """The only holder of a step's ChangeSet. `commit` writes it in one transaction (retried,
    guarded by the engine lease when replicated), then runs the effects, then publishes."""

    def __init__(
        self,
        store: ChangeStore,
        bus: EventSink,
        timers: Timers,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.sleep = sleep  # between commit retries (a simulation passes one that takes no real time)
        self.bus = bus
        self.timers = timers
        self.clock = clock
        self.lease_guard: tuple[str, str, int] | None = None
        self._changes = ChangeSet()
        self._soft = ChangeSet()  # changes that may wait for the next commit (see SOFT_FLUSH_S)
        self._soft_since: float | None = None
        self._effects: list[Callable[[], None]] = []
        self._events: list[dict[str, Any]] = []  # rows of the events table
        # Which input made each change, event and effect (`source`, set by the engine to each
        # input's position in its step; None: the step's own work). Read only when a commit is refused for its
        # data: then each input's part is written on its own, and a refused part left out.
        self.source: int | None = None
        self._journal: list[tuple[Any, ...]] = []
        self._journal_soft: list[tuple[Any, ...]] = []
        self._event_sources: list[int | None] = []
        self._effect_sources: list[int | None] = []
        self.refused_parts: dict[int, ChangeSet] = {}  # of the last commit: what each refused input wrote

    # ---------------------------------------------------------------- recording

    def insert(self, model: type[Base], row: dict[str, Any]) -> None:
        self._changes.insert(model, row)
        self._journal.append((self.source, _INSERT, model, row))

    def update(self, model: type[Base], key: tuple[Any, ...], **values: Any) -> None:
        self._changes.merge(model, key, values)
        self._journal.append((self.source, _MERGE, model, key, values))

    def merge(self, model: type[Base], key: tuple[Any, ...], values: dict[str, Any]) -> None:
        """`update` with the values as a dict (copied): no keywords built for a dict at hand."""
        self._changes.merge(model, key, values)
        self._journal.append((self.source, _MERGE, model, key, dict(values)))

    def delete(self, model: type[Base], key: tuple[Any, ...]) -> None:
        self._changes.delete(model, key)
        self._journal.append((self.source, _DELETE, model, key))

    def soft_update(self, model: type[Base], key: tuple[Any, ...], now: float, **values: Any) -> None:
        """An informational update: it rides along with the next commit, or is written on its own
        SOFT_FLUSH_S after the first one waiting (retry safety never depends on these)."""
        self._soft.merge(model, key, values)
        self._journal_soft.append((_SOFT, _MERGE, model, key, values))
        if self._soft_since is None:
            self._soft_since = now
            self.timers.add(now + SOFT_FLUSH_S, Wake())

    def event(self, type_: EventType, task_id: str, node_id: str | None, now: float, **data: Any) -> None:
        """An event of the task, stored in this step's commit and published after it. Its `data`
        (with the task, the time and the node) is the body subscribers receive."""
        body = {"task_id": task_id, "at": iso(now), **data}
        if node_id is not None:
            body["node_id"] = node_id
        # str() of a StrEnum is its value, as an exact str (half the cost of `.value`)
        self._events.append({"task_id": task_id, "type": str(type_), "node_id": node_id, "data": body, "at": utc(now)})
        self._event_sources.append(self.source)

    def effect(self, fn: Callable[[], None]) -> None:
        """Run `fn` after this step's changes are committed (never if the commit fails)."""
        self._effects.append(fn)
        self._effect_sources.append(self.source)

    # ---------------------------------------------------------------- committing

    async def _write(self, changes: ChangeSet) -> list[int]:
        """Write, retrying a failing store up to COMMIT_ATTEMPTS times with exponential backoff
        (0.1 s doubling, at most 2 s); the last failure propagates."""
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return await self.store.write(changes)
            except Exception as exc:
                if attempt == COMMIT_ATTEMPTS or refused_data(exc):
                    raise
                await self.sleep(min(2.0, 0.1 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    async def commit(self) -> dict[int, BaseException]:
        """Write the step; run its effects; publish its events. Returns the inputs (`source`s)
        whose part the store refused for its data, left out of what was written (usually none);
        any other failure propagates, and nothing of the step is said."""
        changes, effects, events = self._changes, self._effects, self._events
        journal, event_sources, effect_sources = self._journal, self._event_sources, self._effect_sources
        self._changes, self._effects, self._events = ChangeSet(), [], []
        self._journal, self._event_sources, self._effect_sources = [], [], []
        self.source = None
        soft_due = self._soft_since is not None and self.clock() - self._soft_since >= SOFT_FLUSH_S
        if self._soft and (changes or events or soft_due):
            merged, self._soft, self._soft_since = self._soft, ChangeSet(), None
            journal = self._journal_soft + journal  # first: the hard changes win on the same row
            self._journal_soft = []
            merged.absorb(changes)  # the later, hard changes win on the same row
            changes = merged
        refused: dict[int, BaseException] = {}
        self.refused_parts = {}
        if changes or events:
            changes.guard = self.lease_guard
            changes.events.extend(events)
            try:
                ids = await self._write(changes)
            except Exception as exc:
                if not refused_data(exc):
                    raise
                log.warning("the store refused a step's changes for their data; writing them input by input: %s", exc)
                refused = await self._write_apart(journal, events, event_sources)
                events = [ev for ev, src in zip(events, event_sources, strict=True) if _key(src) not in refused]
            else:
                for ev, event_id in zip(events, ids, strict=True):
                    ev["id"] = event_id
        for effect, src in zip(effects, effect_sources, strict=True):
            if _key(src) in refused:
                continue  # what it would say about was not stored
            try:
                effect()
            except Exception:
                log.exception("engine effect failed")
        if events:
            try:
                self.bus.publish(events)
            except Exception:  # fan-out is a hint: the events are stored and readers poll the store
                log.exception("publishing %d events failed", len(events))
        return refused

    async def _write_apart(
        self, journal: list[tuple[Any, ...]], events: list[dict[str, Any]], event_sources: list[int | None]
    ) -> dict[int, BaseException]:
        """The step's changes again, one transaction per input in the order they came (the
        soft changes first, the step's own work last), leaving out each part the store refuses
        for its data, and then the step's own part too (`STEP_WORK`). The step's own part
        refused when no input was is a broken invariant: that propagates, as does any failure of
        the store itself (a restart recovers from what was committed, each
        input's part whole or not at all)."""
        parts: dict[int | None, ChangeSet] = {}
        for op in journal:
            part = parts.get(op[0])
            if part is None:
                part = parts[op[0]] = ChangeSet()
            if op[1] == _INSERT:
                part.insert(op[2], op[3])
            elif op[1] == _MERGE:
                part.merge(op[2], op[3], op[4])
            else:
                part.delete(op[2], op[3])
        for ev, src in zip(events, event_sources, strict=True):
            part = parts.get(src)
            if part is None:
                part = parts[src] = ChangeSet()
            part.events.append(ev)
        if None in parts:  # the step's own work (timers, scheduling) comes after its inputs
            parts[None] = parts.pop(None)
        refused: dict[int, BaseException] = {}
        for src, part in parts.items():
            if src is None and refused:
                refused[STEP_WORK] = next(iter(refused.values()))
                self.refused_parts[STEP_WORK] = part
                continue
            part.guard = self.lease_guard
            try:
                for ev, event_id in zip(part.events, await self._write(part), strict=True):
                    ev["id"] = event_id
            except Exception as exc:
                if src is None or not refused_data(exc):
                    raise
                if src is _SOFT:  # informational: dropped, never worth stopping for
                    log.error("the store refused informational updates; they are dropped: %s", exc)
                    continue
                refused[src] = exc
                self.refused_parts[src] = part  # what it touched: the engine isolates that
        return refused


def _key(src: int | None) -> int:
    return STEP_WORK if src is None else src
