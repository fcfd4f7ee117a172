"""What waits for a device: READY nodes not yet placed, per-device queues, and placement.

`placements` decides where each waiting node goes and says so (`Assign`, `Enqueue`,
`NeverRunnable`); the engine carries each decision out before the next is made, so a device
given work is seen as occupied by the decisions after it. The queues keep their own books (ready
set, queues, `queued_at`); the node state transitions are the engine's to apply."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.domain import placement
from orchestrator.domain.model import AdminState, Liveness, NodeSpec
from orchestrator.domain.problems import Problem
from orchestrator.domain.run import TaskRun
from orchestrator.engine.records import DeviceRun, NodeKey


@dataclass(frozen=True)
class Assign:
    """Run `key` on `device` now (it has been taken off the ready set or its queue)."""

    key: NodeKey
    device: DeviceRun


@dataclass(frozen=True)
class Enqueue:
    """`key` now waits in `device`'s queue (the node is to be marked QUEUED on it)."""

    key: NodeKey
    device: DeviceRun


@dataclass(frozen=True)
class NeverRunnable:
    """No device, connected or not, could ever run `key`."""

    key: NodeKey
    problem: Problem


Decision = Assign | Enqueue | NeverRunnable


def takes_work(dev: DeviceRun) -> bool:
    return dev.admin is AdminState.ACTIVE and dev.liveness is Liveness.ONLINE and not dev.taken_over


def occupied(dev: DeviceRun) -> bool:
    """Busy or with work waiting; a device a person has taken over counts as busy (its queue waits)."""
    return dev.current_batch is not None or bool(dev.queue) or dev.taken_over


class Queues:
    """Reads the engine's tasks and devices (shared dicts, owned by the engine and the fleet)."""

    def __init__(self, tasks: dict[str, TaskRun], devices: dict[str, DeviceRun]) -> None:
        self.tasks = tasks
        self.devices = devices
        self.ready: dict[NodeKey, None] = {}  # READY nodes not yet in a queue (insertion-ordered set)
        self.queued_at: dict[NodeKey, str] = {}  # QUEUED node -> device
        self._capable_cache: dict[tuple[Any, ...], list[str]] = {}
        # Each device's queue as a heap of (order, seq, key), so its next node is found in log
        # time however deep the queue: an entry counts only while `_seq` still names it (a node
        # taken off and queued again gets a new entry; stale ones are dropped when met).
        self._heaps: dict[str, list[tuple[tuple[int, float], int, NodeKey]]] = {}
        self._seq: dict[NodeKey, int] = {}
        self._counter = itertools.count()

    def depth(self) -> int:
        return len(self.ready) + len(self.queued_at)

    def devices_changed(self) -> None:
        """A device's tools, labels, name or admin state changed: capability is judged again."""
        self._capable_cache.clear()

    # ---------------------------------------------------------------- books

    def make_ready(self, key: NodeKey) -> None:
        self.ready[key] = None

    def not_ready(self, key: NodeKey) -> None:
        self.ready.pop(key, None)

    def enqueue(self, key: NodeKey, dev: DeviceRun) -> None:
        self.ready.pop(key, None)
        dev.queue[key] = None
        self.queued_at[key] = dev.id
        seq = self._seq[key] = next(self._counter)
        heapq.heappush(self._heaps.setdefault(dev.id, []), (self.order(key), seq, key))

    def take(self, key: NodeKey) -> None:
        """`key` leaves whatever queue holds it (if any)."""
        device_id = self.queued_at.pop(key, None)
        if device_id is not None:
            dev = self.devices[device_id]
            dev.queue.pop(key, None)
            self._seq.pop(key, None)
            if not dev.queue:
                self._heaps.pop(device_id, None)  # nothing left: no stale entries kept either

    def unqueue_all(self, dev: DeviceRun) -> list[NodeKey]:
        """Empty `dev`'s queue; the nodes that were in it (to be made READY again)."""
        keys = list(dev.queue)
        for key in keys:
            self.take(key)
        return keys

    def forget(self, task_id: str, node_ids: list[str]) -> None:
        for node_id in node_ids:
            self.ready.pop((task_id, node_id), None)
            self.take((task_id, node_id))

    # ---------------------------------------------------------------- placement

    def placements(self, now: float) -> Iterator[Decision]:
        """Give READY nodes (highest priority, oldest first) a free capable device at once, or a
        place in the shortest capable queue; then give every free device its next queued node."""
        if self.ready:
            for key in sorted(self.ready, key=self.order):
                if key not in self.ready:
                    continue  # an earlier decision settled it (its task failed or was cancelled)
                rec = self.tasks[key[0]].record(key[1])
                if rec.not_before and rec.not_before > now:
                    continue  # backing off before a retry
                capable = self.capable(rec.spec)
                if not capable:
                    problem = self.never_runnable(rec.spec)
                    if problem is not None:
                        yield NeverRunnable(key, problem)
                    continue
                dev = self._best(capable, rec.failed_on)
                if dev is None:
                    continue  # capable devices exist but none is in service now: wait (queue timeout)
                if not occupied(dev):
                    self.ready.pop(key, None)
                    yield Assign(key, dev)  # a free device takes it at once: no queue to wait in
                else:
                    self.enqueue(key, dev)
                    yield Enqueue(key, dev)
        if not self.queued_at:
            return  # nothing waits in any queue: no device has a next node to take (at 10,000
            # devices, asking each one anyway cost ~10 ms of every engine step)
        for dev in list(self.devices.values()):
            if dev.current_batch is None and takes_work(dev):
                picked = self._next_for(dev)
                if picked is not None:
                    self.take(picked)
                    yield Assign(picked, dev)

    @staticmethod
    def _best(capable: list[DeviceRun], failed_on: Collection[str]) -> DeviceRun | None:
        """The capable device in service that `placement.preference` ranks first. `capable` is in
        id order, so the first free device the node has not failed on is that device (the common
        case, found without ranking them all). Called for every node placed while the whole
        fleet is busy, so `takes_work`, `occupied` and `preference` are written out inline here
        (the same tests, in the same order; a seeded test in `tests/unit/engine/test_queues.py`
        holds it to `placement.choose_queue`)."""
        best: DeviceRun | None = None
        best_key: tuple[bool, bool, int, str] | None = None
        active, online = AdminState.ACTIVE, Liveness.ONLINE
        for d in capable:
            if d.admin is not active or d.liveness is not online:
                continue
            waiting = len(d.queue)
            busy = d.current_batch is not None or waiting > 0 or d.taken_over
            failed = d.id in failed_on if failed_on else False
            if not busy and not failed:
                return d
            key = (failed, busy, waiting, d.id)
            if best_key is None or key < best_key:
                best, best_key = d, key
        return best

    def never_runnable(self, spec: NodeSpec) -> Problem | None:
        """Why no device could ever run `spec`, or None if one could (once connected, in service)."""
        views = [d.view() for d in self.devices.values()]
        if placement.could_ever_run(spec, views):
            return None
        return placement.no_capable_device(spec, views)

    def capable(self, spec: NodeSpec) -> list[DeviceRun]:
        """Non-revoked devices that could run `spec`, in id order, cached per placement signature."""
        sig = _signature(spec)
        ids = self._capable_cache.get(sig)
        if ids is None:
            # A node pinned to a device (each fan-out child is) can only run there: its device is
            # looked up, not every device judged (a 500-device fan-out made 500 x 500 judgements).
            pinned = self.devices.get(spec.placement.device or "")
            pool = [pinned] if pinned is not None else self.devices.values()
            ids = sorted(d.id for d in pool if d.admin is not AdminState.REVOKED and placement.capable(spec, d.view()))
            self._capable_cache[sig] = ids
        return [self.devices[i] for i in ids]

    def order(self, key: NodeKey) -> tuple[int, float]:
        run = self.tasks[key[0]]
        rec = run.record(key[1])
        return (-(run.priority + rec.spec.priority), rec.ready_since or 0.0)

    def _next_for(self, dev: DeviceRun) -> NodeKey | None:
        """Its own queue first (priority, then age); else steal a node it can run elsewhere."""
        if dev.queue:
            return self._head(dev)
        view = dev.view()
        stealable = [k for k in self.queued_at if self._may_steal(k, dev.id, view)]
        return min(stealable, key=self.order) if stealable else None

    def _head(self, dev: DeviceRun) -> NodeKey:
        """The first of `dev`'s queue by priority, then age, then arrival (as `min` would pick)."""
        heap = self._heaps.setdefault(dev.id, [])
        while heap:
            order, seq, key = heap[0]
            if self._seq.get(key) != seq or self.queued_at.get(key) != dev.id:
                heapq.heappop(heap)  # taken off (or queued again since) after this entry was made
                continue
            if order != self.order(key):  # its order changed while it waited: file it again
                heapq.heapreplace(heap, (self.order(key), seq, key))
                continue
            return key
        return min(dev.queue, key=self.order)  # not reached while the books agree

    def _may_steal(self, key: NodeKey, device_id: str, view: placement.DeviceView) -> bool:
        rec = self.tasks[key[0]].record(key[1])
        return device_id not in rec.failed_on and placement.capable(rec.spec, view)


def _signature(spec: NodeSpec) -> tuple[Any, ...]:
    p = spec.placement
    return (spec.kind, p.device, p.platform, tuple(sorted(p.labels.items())), tuple(sorted(set(spec.tools()))))
