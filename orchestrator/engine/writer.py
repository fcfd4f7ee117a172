"""What one engine step writes: hard changes, soft changes, events, and the effects that may only
happen once all of it is committed (DESIGN, data flow: state is stored before it is spoken of)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import Any, Protocol

from orchestrator.engine.timers import Timers, Wake
from orchestrator.engine.times import iso, utc
from orchestrator.store.models import Base
from orchestrator.store.repo import ChangeSet

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

    # ---------------------------------------------------------------- recording

    def insert(self, model: type[Base], row: dict[str, Any]) -> None:
        self._changes.insert(model, row)

    def update(self, model: type[Base], key: tuple[Any, ...], **values: Any) -> None:
        self._changes.merge(model, key, values)

    def merge(self, model: type[Base], key: tuple[Any, ...], values: dict[str, Any]) -> None:
        """`update` with the values as a dict (copied): no keywords built for a dict at hand."""
        self._changes.merge(model, key, values)

    def delete(self, model: type[Base], key: tuple[Any, ...]) -> None:
        self._changes.delete(model, key)

    def soft_update(self, model: type[Base], key: tuple[Any, ...], now: float, **values: Any) -> None:
        """An informational update: it rides along with the next commit, or is written on its own
        SOFT_FLUSH_S after the first one waiting (retry safety never depends on these)."""
        self._soft.merge(model, key, values)
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

    def effect(self, fn: Callable[[], None]) -> None:
        """Run `fn` after this step's changes are committed (never if the commit fails)."""
        self._effects.append(fn)

    # ---------------------------------------------------------------- committing

    async def _write(self, changes: ChangeSet) -> list[int]:
        """Write, retrying a failing store up to COMMIT_ATTEMPTS times with exponential backoff
        (0.1 s doubling, at most 2 s); the last failure propagates."""
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                return await self.store.write(changes)
            except Exception:
                if attempt == COMMIT_ATTEMPTS:
                    raise
                await self.sleep(min(2.0, 0.1 * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")

    async def commit(self) -> None:
        changes, effects, events = self._changes, self._effects, self._events
        self._changes, self._effects, self._events = ChangeSet(), [], []
        soft_due = self._soft_since is not None and self.clock() - self._soft_since >= SOFT_FLUSH_S
        if self._soft and (changes or events or soft_due):
            merged, self._soft, self._soft_since = self._soft, ChangeSet(), None
            merged.absorb(changes)  # the later, hard changes win on the same row
            changes = merged
        if changes or events:
            changes.guard = self.lease_guard
            changes.events.extend(events)
            ids = await self._write(changes)
            for ev, event_id in zip(events, ids, strict=True):
                ev["id"] = event_id
        for effect in effects:
            try:
                effect()
            except Exception:
                log.exception("engine effect failed")
        if events:
            try:
                self.bus.publish(events)
            except Exception:  # fan-out is a hint: the events are stored and readers poll the store
                log.exception("publishing %d events failed", len(events))
