"""Sharded engine ownership, prototyped in the deterministic simulator (docs/scaling.md).

A model of the design, not the product: the engine's ownership protocol at the level of rows,
leases and frames. N shards each lead the tasks with `shard_of(task) == k` under a lease of their
own (`engine-k`: holder, expiry, fencing counter); every commit of a shard re-checks its lease, as
today's engine commit does. Devices are claimed by one shard at a time: a device row carries
`owner, owner_fence` (the owner's lease fence when it claimed it), moved only by a fenced
compare-and-set from a claim that is dead (its shard's lease moved on or expired). Only a
device's owner opens and ends attempts on it; a task's shard asks for a node to run on a device
with a durable request row, so a node whose device belongs to another shard is a remote attempt:
the device's owner opens it, ends it, and the task's shard settles the node.

Replicas (three processes) take and renew shard leases; a replica that crashes loses every shard
it led (a commit in flight at the crash lands or not), and another replica takes each lease when
it expires, rebuilds that shard alone from the store, re-claims its devices and re-sends their
open batches. Faults, all from one `Random(seed)` on a virtual clock: replica crashes, a lease
that expires while its leader keeps writing (its commits must be refused), claims of a dead
shard's devices racing between shards, devices handed back to their home shard, injected store
failures, and frames lost and delayed between shards and devices and on the bus between shards.

Checked: on every write (`World.check_op`, independent of the store's own conditions) a claim
moves only off a dead claim, only a device's live owner opens or ends an attempt on it, a
device's fence only grows and each attempt's fence is above every earlier one, only a task's
shard writes its task; on every commit, the committing shard's memory equals what a rebuild from
the store would give; at every command a device runs, no node runs twice; for every result a
device lets go of, its attempt is in the store; at the end, every task acknowledged to the API is
in the store and terminal, every node ended by the DAG's rules, nothing is left open.

The same code, without faults and with a cost per step and per commit (`Costs`), measures node
transitions per second for N shards (`throughput`).
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from random import Random
from typing import Any

REPLICAS = ("A", "B", "C")
STORM_SEEDS = 1_000_000  # seeds from here on run a storm: every fault on, at higher rates
LEASE_TTL_S = 3.0
RENEW_S = 1.0
TERMINAL = ("succeeded", "failed", "skipped")


def shard_of(key: str, n: int) -> int:
    """The shard owning a task (or a device's home shard): a stable hash, the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=4).digest(), "big") % n


class Violation(BaseException):
    """An invariant broke (a BaseException so that no handler of the model swallows it)."""


class Refused(Exception):
    """A condition of a commit failed: nothing of it applied."""


class LeaseLost(Refused):
    """The committing shard's lease is no longer held by it at its fence."""


class StoreDown(Exception):
    """An injected failure: the database refused this commit."""


# ====================================================================== rows


@dataclass
class Lease:
    holder: str | None = None
    fence: int = 0
    expires: float = 0.0


@dataclass
class DeviceRow:
    home: int  # shard_of(device): where it goes back to
    owner: int
    owner_fence: int  # the owner's lease fence when it claimed the device; -1: handed back
    fence: int = 0  # the batch fence the device's ledger checks
    batch: str | None = None  # its open attempt


@dataclass
class TaskRow:
    id: str
    shard: int
    deps: dict[str, tuple[str, ...]]  # node -> the nodes it needs to have succeeded
    state: str = "running"


@dataclass
class RequestRow:
    id: str
    task: str
    node: str
    device: str
    batch: str | None = None  # the attempt its device's owner opened for it
    closed: bool = False  # its attempt settled (or the node no longer needs it)


@dataclass
class AttemptRow:
    batch: str
    request: str
    task: str
    node: str
    device: str
    fence: int
    owner: int  # the shard that opened it (the device's owner then)
    status: str = "open"  # open, succeeded, failed, stale (the ledger refused it: it never ran)
    applied: bool = False  # the task's shard settled its node from it


# ====================================================================== writes


@dataclass(frozen=True)
class Claim:
    """Take `device` if its claim is still `(seen_owner, seen_fence)` and that claim is dead."""

    device: str
    seen_owner: int
    seen_fence: int


@dataclass(frozen=True)
class HandBack:
    """The owner hands an idle device back to its home shard (a dead claim the home shard takes)."""

    device: str


@dataclass(frozen=True)
class AddTask:
    task: TaskRow


@dataclass(frozen=True)
class Ask:
    """The task's shard asks for `node` to run on `device` (its node goes `requested`)."""

    request: RequestRow


@dataclass(frozen=True)
class Open:
    batch: str
    request: str
    fence: int


@dataclass(frozen=True)
class End:
    batch: str
    status: str


@dataclass(frozen=True)
class Settle:
    """The task's shard applies an ended attempt (or none, `batch` None) to its nodes and task."""

    task: str
    batch: str | None
    nodes: dict[str, str]
    state: str | None = None


Op = Claim | HandBack | AddTask | Ask | Open | End | Settle


class Store:
    """The shared store (Postgres in the product): rows, leases and atomic commits.

    A commit runs its ops in order, each checked against the rows as the earlier ops left them
    (a local node's request and its attempt go in one commit); a failed condition undoes the
    whole commit. Claims are compare-and-set: a claim that loses changes nothing and the commit
    goes on (as an UPDATE that matched no row), and the commit reports which claims won."""

    def __init__(self, clock: Callable[[], float], shards: int) -> None:
        self.clock = clock
        self.leases = [Lease() for _ in range(shards)]
        self.devices: dict[str, DeviceRow] = {}
        self.tasks: dict[str, TaskRow] = {}
        self.nodes: dict[tuple[str, str], str] = {}
        self.requests: dict[str, RequestRow] = {}
        self.attempts: dict[str, AttemptRow] = {}
        self.on_op: Callable[[int, int, Op], None] | None = None  # the world's checks, before each op applies
        self.fail_next = 0
        self.commits = 0
        self.ops = 0

    # ------------------------------------------------------------------ leases

    def take(self, k: int, holder: str, ttl: float) -> int | None:
        """Take lease `k` if it is free or expired (a new fence, even for its last holder), or renew it."""
        lease, now = self.leases[k], self.clock()
        if lease.holder is not None and lease.expires > now:
            if lease.holder != holder:
                return None
        else:
            lease.fence += 1
        lease.holder, lease.expires = holder, now + ttl
        return lease.fence

    def renew(self, k: int, holder: str, fence: int, ttl: float) -> bool:
        if not self.held(k, holder, fence):
            return False
        self.leases[k].expires = self.clock() + ttl
        return True

    def held(self, k: int, holder: str, fence: int) -> bool:
        lease = self.leases[k]
        return lease.holder == holder and lease.fence == fence and lease.expires > self.clock()

    def live(self, k: int, fence: int) -> bool:
        """Whether a claim made under lease `k` at `fence` still stands."""
        lease = self.leases[k]
        return lease.holder is not None and lease.fence == fence and lease.expires > self.clock()

    def expire(self, k: int) -> None:
        self.leases[k].expires = self.clock() - 1.0

    # ------------------------------------------------------------------ commits

    def commit(self, k: int, holder: str, fence: int, ops: list[Op]) -> dict[str, bool]:
        self.commits += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StoreDown("injected: the store refused this commit")
        if not self.held(k, holder, fence):  # the lease row, re-read FOR UPDATE in the commit
            raise LeaseLost(f"lease engine-{k} (fence {fence}) is no longer held by {holder}")
        undo: list[Callable[[], None]] = []
        won: dict[str, bool] = {}
        try:
            for op in ops:
                self._op(k, fence, op, undo, won)
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        self.ops += len(ops)
        return won

    def _save(self, table: dict[Any, Any], key: Any, undo: list[Callable[[], None]]) -> None:
        if key in table:
            old = copy.copy(table[key])
            undo.append(partial(table.__setitem__, key, old))
        else:
            undo.append(partial(table.pop, key, None))

    def _op(self, k: int, fence: int, op: Op, undo: list[Callable[[], None]], won: dict[str, bool]) -> None:
        if isinstance(op, Claim):
            row = self.devices[op.device]
            # The compare-and-set: the claim as the claimant read it, and that claim dead.
            ok = (
                row.owner == op.seen_owner
                and row.owner_fence == op.seen_fence
                and not self.live(op.seen_owner, op.seen_fence)
            )
            won[op.device] = ok
            if not ok:
                return
            self._check(k, fence, op)
            self._save(self.devices, op.device, undo)
            row.owner, row.owner_fence = k, fence
            return
        if isinstance(op, HandBack):
            row = self.devices[op.device]
            if (row.owner, row.owner_fence) != (k, fence) or row.batch is not None:
                raise Refused(f"{op.device} is not an idle device of engine-{k}@{fence}")
            self._check(k, fence, op)
            self._save(self.devices, op.device, undo)
            row.owner, row.owner_fence = row.home, -1
            return
        if isinstance(op, AddTask):
            if op.task.id in self.tasks:
                return  # asked again: it is stored already
            if op.task.shard != k:
                raise Refused(f"task {op.task.id} belongs to engine-{op.task.shard}")
            self._check(k, fence, op)
            self._save(self.tasks, op.task.id, undo)
            self.tasks[op.task.id] = copy.deepcopy(op.task)
            for node in op.task.deps:
                self._save(self.nodes, (op.task.id, node), undo)
                self.nodes[(op.task.id, node)] = "pending"
            return
        if isinstance(op, Ask):
            req = op.request
            task = self.tasks.get(req.task)
            if task is None or task.shard != k or self.nodes.get((req.task, req.node)) != "pending":
                raise Refused(f"{req.task}/{req.node} is not a pending node of engine-{k}")
            if req.id in self.requests:
                raise Refused(f"request {req.id} exists")
            self._check(k, fence, op)
            self._save(self.nodes, (req.task, req.node), undo)
            self._save(self.requests, req.id, undo)
            self.nodes[(req.task, req.node)] = "requested"
            self.requests[req.id] = copy.copy(req)
            return
        if isinstance(op, Open):
            found = self.requests.get(op.request)
            if found is None or found.batch is not None or found.closed:
                raise Refused(f"request {op.request} is not waiting")
            row = self.devices[found.device]
            if (row.owner, row.owner_fence) != (k, fence) or row.batch is not None:
                raise Refused(f"{found.device} is not an idle device of engine-{k}@{fence}")
            if op.batch in self.attempts:
                raise Refused(f"attempt {op.batch} exists")
            self._check(k, fence, op)
            self._save(self.devices, found.device, undo)
            self._save(self.requests, op.request, undo)
            self._save(self.attempts, op.batch, undo)
            row.fence, row.batch = op.fence, op.batch
            found.batch = op.batch
            self.attempts[op.batch] = AttemptRow(op.batch, found.id, found.task, found.node, found.device, op.fence, k)
            return
        if isinstance(op, End):
            att = self.attempts.get(op.batch)
            if att is None or att.status != "open":
                raise Refused(f"attempt {op.batch} is not open")
            row = self.devices[att.device]
            if (row.owner, row.owner_fence) != (k, fence):
                raise Refused(f"{att.device} is not a device of engine-{k}@{fence}")
            self._check(k, fence, op)
            self._save(self.attempts, op.batch, undo)
            self._save(self.devices, att.device, undo)
            att.status = op.status
            if row.batch == op.batch:
                row.batch = None
            return
        # Settle
        task = self.tasks.get(op.task)
        if task is None or task.shard != k or task.state != "running":
            raise Refused(f"task {op.task} is not a running task of engine-{k}")
        if op.batch is not None:
            att = self.attempts.get(op.batch)
            if att is None or att.status == "open" or att.applied or att.task != op.task:
                raise Refused(f"attempt {op.batch} cannot be settled")
        self._check(k, fence, op)
        if op.batch is not None:
            att = self.attempts[op.batch]
            self._save(self.attempts, op.batch, undo)
            self._save(self.requests, att.request, undo)
            att.applied = True
            self.requests[att.request].closed = True
        for node, state in op.nodes.items():
            self._save(self.nodes, (op.task, node), undo)
            self.nodes[(op.task, node)] = state
        if op.state is not None:
            self._save(self.tasks, op.task, undo)
            task.state = op.state

    def _check(self, k: int, fence: int, op: Op) -> None:
        if self.on_op is not None:
            self.on_op(k, fence, op)


# ====================================================================== a shard's leader


def rebuild(store: Store, k: int, fence: int) -> dict[str, Any]:
    """What shard k's leader at `fence` holds, read from the store alone: its running tasks' node
    states, its devices (fence, open batch), their open attempts, and the requests waiting for
    them. A new leader starts from this; a live one must equal it after every commit."""
    tasks = {
        t.id: {n: store.nodes[(t.id, n)] for n in t.deps}
        for t in store.tasks.values()
        if t.shard == k and t.state == "running"
    }
    devices = {
        d: (row.fence, row.batch) for d, row in store.devices.items() if (row.owner, row.owner_fence) == (k, fence)
    }
    attempts = sorted(b for b, a in store.attempts.items() if a.status == "open" and a.device in devices)
    waiting = sorted(r.id for r in store.requests.values() if r.batch is None and not r.closed and r.device in devices)
    return {"tasks": tasks, "devices": devices, "attempts": attempts, "waiting": waiting}


class Leader:
    """Shard k's engine on one replica: memory changed as it plans a step, committed in one
    group commit, and thrown away (rebuilt from the store) if that commit fails."""

    def __init__(self, world: World, k: int, replica: Replica, fence: int) -> None:
        self.w, self.k, self.replica, self.fence = world, k, replica, fence
        self.holder = replica.holder
        self.alive = True
        self.busy = False
        self.deaf_until = 0.0  # a leader that does not notice its lease went (a paused process)
        self.lands = False  # its process crashed: whether the commit it had in flight lands
        self.inbox: list[tuple[str, Any]] = []
        self.stepping = False
        store = world.store
        view = rebuild(store, k, fence)
        self.tasks: dict[str, dict[str, str]] = view["tasks"]
        self.devices: dict[str, list[Any]] = {d: list(v) for d, v in view["devices"].items()}
        self.attempts: dict[str, AttemptRow] = {b: copy.copy(store.attempts[b]) for b in view["attempts"]}
        self.waiting: dict[str, RequestRow] = {r: copy.copy(store.requests[r]) for r in view["waiting"]}
        self.queues: dict[str, deque[str]] = {}  # requests waiting per device (no empty ones)
        for rid in view["waiting"]:
            self.queues.setdefault(self.waiting[rid].device, deque()).append(rid)
        self.idle: dict[str, None] = {}  # its devices with no attempt and nothing waiting
        for d in sorted(self.devices):
            self._mark(d)
        self.dirty = set(self.tasks)  # tasks whose nodes may be ready to place
        self.want: dict[str, Claim] = {}
        # Its own shard's devices, claimed under an earlier fence: re-claimed first of all.
        for d, row in sorted(store.devices.items()):
            if row.owner == k and row.owner_fence != fence and not store.live(row.owner, row.owner_fence):
                self.want[d] = Claim(d, row.owner, row.owner_fence)
        self.inbox.append(("tick", None))

    # ------------------------------------------------------------------ inputs

    def _mark(self, d: str) -> None:
        if d in self.devices and self.devices[d][1] is None and d not in self.queues:
            self.idle[d] = None
        else:
            self.idle.pop(d, None)

    def _queue(self, rid: str, req: RequestRow) -> None:
        self.waiting[rid] = copy.copy(req)
        self.queues.setdefault(req.device, deque()).append(rid)
        self._mark(req.device)

    def give(self, kind: str, value: Any) -> None:
        if not self.alive:
            return
        self.inbox.append((kind, value))
        self.w.wake(self)

    def summary(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "devices": {d: tuple(v) for d, v in self.devices.items()},
            "attempts": sorted(self.attempts),
            "waiting": sorted(self.waiting),
        }

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        """Plan one step from every input waiting, then commit it (after the step's cost)."""
        if not self.alive or self.busy or not self.inbox:
            return
        w = self.w
        items, self.inbox = self.inbox, []
        ops: list[Op] = []
        after: list[Callable[[], None]] = []
        settled: set[str] = set()
        for kind, value in items:
            if kind == "submit":
                self._submit(value, ops, after)
            elif kind == "result":
                device, batch, status = value
                self._result(device, batch, status, ops, after)
            elif kind == "ended":
                self._settle(value, ops, after, settled)
            elif kind == "request":
                self._waiting(value)
            elif kind == "tick":
                self._reconcile(ops, after, settled)
        self._place(ops, after)
        self._dispatch(ops, after)
        claims, self.want = list(self.want.values()), {}
        ops += claims
        self.busy = True
        cost = w.costs.step_s + w.costs.input_s * (len(items) + len(ops)) + w.rng.random() * w.costs.commit_jitter_s
        w.at(cost, partial(w.commit, self, ops, after, claims), f"commit engine-{self.k}")

    def _submit(
        self, value: tuple[TaskRow, Callable[[], None]], ops: list[Op], after: list[Callable[[], None]]
    ) -> None:
        task, reply = value
        if task.id not in self.w.store.tasks and task.id not in self.tasks:
            ops.append(AddTask(task))
            self.tasks[task.id] = dict.fromkeys(task.deps, "pending")
            self.dirty.add(task.id)
        after.append(reply)

    def _result(self, device: str, batch: str, status: str, ops: list[Op], after: list[Callable[[], None]]) -> None:
        w = self.w
        att = self.attempts.get(batch)
        if att is not None and device in self.devices:
            ops.append(End(batch, status))
            del self.attempts[batch]
            if self.devices[device][1] == batch:
                self.devices[device][1] = None
            self._mark(device)
            after.append(partial(w.ack, device, batch))
            if att.task in self.tasks:  # its own task's node: settled in the same commit
                self._apply(att, status, ops, after)
            else:
                after.append(partial(w.hint, shard_of(att.task, w.n), "ended", batch))
            return
        row = w.store.attempts.get(batch)
        if row is not None and row.status != "open":  # a duplicate of one ended already: it is stored
            after.append(partial(w.ack, device, batch))

    def _settle(self, batch: str, ops: list[Op], after: list[Callable[[], None]], settled: set[str]) -> None:
        att = self.w.store.attempts.get(batch)
        if att is None or att.status == "open" or att.applied or batch in settled or att.task not in self.tasks:
            return
        settled.add(batch)
        self._apply(att, att.status, ops, after)

    def _apply(self, att: AttemptRow, status: str, ops: list[Op], after: list[Callable[[], None]]) -> None:
        nodes = self.tasks[att.task]
        if nodes.get(att.node) != "requested":
            self.w.fail(
                f"engine-{self.k}: attempt {att.batch} ended for {att.task}/{att.node}, which is {nodes.get(att.node)}"
            )
        change = {att.node: "pending" if status == "stale" else status}
        nodes.update(change)
        if status == "stale":
            self.w.seen["attempt refused stale by the ledger"] += 1
        self.dirty.add(att.task)
        self._finish(att.task, att.batch, change, ops, after)

    def _finish(
        self, task_id: str, batch: str | None, change: dict[str, str], ops: list[Op], after: list[Callable[[], None]]
    ) -> None:
        """Skip what can no longer run, end the task if every node ended, and write it."""
        nodes, deps = self.tasks[task_id], self.w.specs[task_id].deps
        moved = True
        while moved:
            moved = False
            for n in sorted(deps):
                if nodes[n] == "pending" and any(nodes[d] in ("failed", "skipped") for d in deps[n]):
                    nodes[n] = change[n] = "skipped"
                    moved = True
        state = None
        if all(s in TERMINAL for s in nodes.values()):
            state = "succeeded" if all(s == "succeeded" for s in nodes.values()) else "failed"
            del self.tasks[task_id]
            after.append(partial(self.w.task_ended, task_id))
        ops.append(Settle(task_id, batch, change, state))

    def _waiting(self, rid: str) -> None:
        row = self.w.store.requests.get(rid)
        if row is None or row.batch is not None or row.closed or row.device not in self.devices or rid in self.waiting:
            return
        self._queue(rid, row)

    def _reconcile(self, ops: list[Op], after: list[Callable[[], None]], settled: set[str]) -> None:
        """What hints may have missed, read from the store: requests waiting for its devices,
        ended attempts of its tasks to settle; its open batches sent again; dead claims to take."""
        w, store = self.w, self.w.store
        for rid in sorted(r.id for r in store.requests.values() if r.batch is None and not r.closed):
            self._waiting(rid)
        for batch in sorted(b for b, a in store.attempts.items() if a.status != "open" and not a.applied):
            self._settle(batch, ops, after, settled)
        for _batch, att in sorted(self.attempts.items()):
            after.append(partial(w.send_batch, self.k, att))
        for d, row in sorted(store.devices.items()):
            if (row.owner, row.owner_fence) == (self.k, self.fence) or d in self.want:
                continue
            ours = self.k in (row.home, row.owner)
            if not store.live(row.owner, row.owner_fence) and (ours or w.rng.random() < w.steal):
                self.want[d] = Claim(d, row.owner, row.owner_fence)
        for d in sorted(self.devices):  # a device away from home goes back when it is idle
            batch = self.devices[d][1]
            if store.devices[d].home != self.k and batch is None and d not in self.queues and w.rng.random() < 0.3:
                ops.append(HandBack(d))
                del self.devices[d]
                self._mark(d)
                w.seen["device handed back home"] += 1

    def _place(self, ops: list[Op], after: list[Callable[[], None]]) -> None:
        """Each ready node of its tasks asked to run on a device: one of its own idle ones, or
        (a share of the nodes, as fan-outs and named devices make) any device of the fleet."""
        w = self.w
        dirty, self.dirty = sorted(self.dirty), set()
        for task_id in dirty:
            if task_id not in self.tasks:
                continue
            nodes, deps = self.tasks[task_id], w.specs[task_id].deps
            for n in sorted(deps):
                if nodes[n] != "pending" or not all(nodes[d] == "succeeded" for d in deps[n]):
                    continue
                device = self._choose()
                rid = w.new_id("req")
                req = RequestRow(rid, task_id, n, device)
                ops.append(Ask(req))
                nodes[n] = "requested"
                if device in self.devices:
                    self._queue(rid, req)
                    w.seen["local attempt"] += 1
                else:
                    after.append(partial(w.hint_device, device, rid))
                    w.seen["remote attempt"] += 1

    def _choose(self) -> str:
        w = self.w
        if self.devices and w.rng.random() >= w.remote_share:
            if self.idle:
                return next(iter(self.idle))
            return w.rng.choice(sorted(self.devices))
        return w.rng.choice(w.device_ids)

    def _dispatch(self, ops: list[Op], after: list[Callable[[], None]]) -> None:
        w = self.w
        for d in sorted(self.queues):
            queue = self.queues[d]
            if self.devices[d][1] is not None:
                continue
            rid = queue.popleft()
            if not queue:
                del self.queues[d]
            req = self.waiting.pop(rid)
            fence = self.devices[d][0] + 1
            batch = w.new_id("b")
            ops.append(Open(batch, rid, fence))
            self.devices[d] = [fence, batch]
            self._mark(d)
            att = AttemptRow(batch, rid, req.task, req.node, d, fence, self.k)
            self.attempts[batch] = att
            after.append(partial(w.send_batch, self.k, att))

    # ------------------------------------------------------------------ after the commit

    def committed(self, won: dict[str, bool], claims: list[Claim]) -> None:
        store = self.w.store
        for claim in claims:
            if not won.get(claim.device):
                self.w.seen["claim lost a race"] += 1
                continue
            self.w.seen[
                "device claimed" if store.devices[claim.device].home == self.k else "device of another shard claimed"
            ] += 1
            row = store.devices[claim.device]
            self.devices[claim.device] = [row.fence, row.batch]
            self._mark(claim.device)
            if row.batch is not None:  # its open attempt comes with it: sent again at once
                self.attempts[row.batch] = copy.copy(store.attempts[row.batch])
                self.w.send_batch(self.k, self.attempts[row.batch])
                self.w.seen["open attempt adopted"] += 1
            for rid in sorted(r.id for r in store.requests.values() if r.device == claim.device):
                self._waiting(rid)
        self.busy = False


# ====================================================================== replicas, devices


class Replica:
    """A process: it renews its shard leases and takes expired ones."""

    def __init__(self, world: World, name: str) -> None:
        self.w, self.name = world, name
        self.up = True
        self.incarnation = 1
        self.leaders: dict[int, Leader] = {}

    @property
    def holder(self) -> str:
        return f"{self.name}#{self.incarnation}"

    def leases(self) -> None:
        w = self.w
        if self.up:
            for k, leader in sorted(self.leaders.items()):
                if leader.deaf_until > w.now:
                    continue
                if not w.store.renew(k, self.holder, leader.fence, LEASE_TTL_S):
                    w.log("lease", f"engine-{k} lost by {self.holder}: its leader stops")
                    w.stop(leader)
            order = list(range(w.n))
            w.rng.shuffle(order)
            for k in order:
                if k in self.leaders or len(self.leaders) >= w.cap:
                    continue
                fence = w.store.take(k, self.holder, LEASE_TTL_S)
                if fence is not None:
                    w.start(self, k, fence)
        w.at(RENEW_S, self.leases, f"leases {self.name}")


class Device:
    """The agent's ledger rules in miniature: a batch recorded before it runs, a redelivered one
    answered from the ledger, a stale fence refused; one batch at a time; results sent until acked."""

    def __init__(self, world: World, device_id: str) -> None:
        self.w, self.id = world, device_id
        self.ledger: dict[str, str | None] = {}
        self.max_fence = 0
        self.queue: deque[AttemptRow] = deque()
        self.running: str | None = None
        self.outbox: dict[str, str] = {}

    def batch(self, att: AttemptRow) -> None:
        w = self.w
        if att.batch in self.ledger:
            status = self.ledger[att.batch]
            if status is not None:
                self.outbox[att.batch] = status
                self.send(att.batch)
            return
        if att.fence < self.max_fence:
            w.log("device", f"{self.id} refuses {att.batch} f{att.fence} < f{self.max_fence}")
            self.outbox[att.batch] = "stale"
            self.send(att.batch)
            return
        self.max_fence = att.fence
        self.ledger[att.batch] = None
        self.queue.append(att)
        self.pump()

    def pump(self) -> None:
        if self.running is not None or not self.queue:
            return
        att = self.queue.popleft()
        self.running = att.batch
        self.w.executed(self, att)
        lo, hi = self.w.costs.exec_s
        self.w.at(self.w.rng.uniform(lo, hi), partial(self.finish, att), f"{self.id} runs {att.batch}")

    def finish(self, att: AttemptRow) -> None:
        status = "failed" if self.w.rng.random() < self.w.tool_failure else "succeeded"
        self.ledger[att.batch] = status
        self.outbox[att.batch] = status
        self.running = None
        self.send(att.batch)
        self.pump()

    def send(self, batch: str) -> None:
        if batch in self.outbox:
            self.w.to_owner(self.id, batch, self.outbox[batch])

    def resend(self) -> None:
        for batch in sorted(self.outbox):
            self.send(batch)
        self.w.at(1.0, self.resend, f"{self.id} resends")

    def acked(self, batch: str) -> None:
        row = self.w.store.attempts.get(batch)
        if batch in self.outbox and (row is None or row.status == "open"):
            self.w.fail(f"{self.id} was acknowledged the results of {batch}, which the store has {row and row.status}")
        self.outbox.pop(batch, None)


# ====================================================================== the world


@dataclass(frozen=True)
class Costs:
    """Virtual time a leader spends per step (its group commit's round trips) and per input or
    row, the store's serial time per commit and per op (0: unbounded), a device's run time, and
    a frame's or a hint's delay."""

    step_s: float = 0.002
    input_s: float = 0.0003
    db_commit_s: float = 0.0
    db_op_s: float = 0.0
    exec_s: tuple[float, float] = (0.05, 1.0)
    net_s: float = 0.002
    commit_jitter_s: float = 0.0  # a commit's extra latency, uniform in [0, this) (a slow store)


@dataclass
class Faults:
    loss: float = 0.0  # a frame between a shard and a device lost
    jitter: float = 0.0  # extra delay on a frame (reorders them)
    bus_loss: float = 0.0  # a hint between shards lost
    bus_jitter: float = 0.0
    crash: float = 0.0  # per replica per second: the process dies with every shard it led
    lease_expiry: float = 0.0  # per shard per second: its lease expires, its leader keeps writing a while
    store_fail: float = 0.0  # per commit

    @staticmethod
    def pick(rng: Random, storm: bool) -> Faults:
        def p(hi: float) -> float:
            return rng.uniform(hi / 2, 2 * hi) if storm else rng.choice((0.0, rng.uniform(0, hi)))

        return Faults(p(0.05), p(0.3), p(0.2), p(1.0), p(0.03), p(0.03), p(0.03))


@dataclass
class Outcome:
    seed: int
    ok: bool
    error: str
    trace: str
    digest: str
    events: int
    commits: int
    tasks: int
    seen: Counter[str] = field(default_factory=Counter)
    nodes_done: int = 0
    virtual_s: float = 0.0
    cross_share: float = 0.0


class World:
    def __init__(
        self,
        seed: int,
        shards: int,
        devices: int,
        costs: Costs | None = None,
        faults: Faults | None = None,
        remote_share: float = 0.4,
        replicas: int = 3,
    ) -> None:
        self.seed = seed
        self.rng = Random(seed)
        self.now = 0.0
        self.n = shards
        self.costs = costs or Costs()
        self.faults = faults if faults is not None else Faults.pick(self.rng, seed >= STORM_SEEDS)
        self.remote_share = remote_share
        self.steal = self.rng.uniform(0.2, 1.0)  # how eagerly a shard takes another's dead claims
        self.tool_failure = 0.1
        self.cap = shards  # shard leases one replica may hold
        self.store = Store(lambda: self.now, shards)
        self.store.on_op = self.check_op
        self.events: list[tuple[float, int, Callable[[], None], str]] = []
        self.seq = itertools.count()
        self.ids = itertools.count(1)
        self.lines: deque[str] = deque(maxlen=200)
        self.hash = hashlib.sha256()
        self.count = 0
        self.replicas = {r: Replica(self, r) for r in [*REPLICAS, *(f"R{i}" for i in range(3, replicas))][:replicas]}
        self.leaders: dict[int, Leader] = {}
        self.device_ids = [f"dev_{i}" for i in range(devices)]
        self.devices = {d: Device(self, d) for d in self.device_ids}
        self.specs: dict[str, TaskRow] = {}
        self.acked: set[str] = set()
        self.ended_tasks = 0
        self.executions: dict[tuple[str, str], str] = {}
        self.fence_floor: dict[str, int] = {}
        self.db_free = 0.0
        self.healing = False
        self.checks = True
        self.seen: Counter[str] = Counter()
        for d in self.device_ids:
            home = shard_of(d, shards)
            self.store.devices[d] = DeviceRow(home, home, 0)  # fence 0: claimed by no live lease yet

    # ------------------------------------------------------------------ clock, trace

    def at(self, delay: float, fn: Callable[[], None], what: str) -> None:
        heapq.heappush(self.events, (self.now + max(0.0, delay), next(self.seq), fn, what))

    def log(self, kind: str, text: str) -> None:
        line = f"{self.now:9.3f} {kind:<8} {text}"
        self.count += 1
        self.lines.append(line)
        self.hash.update(line.encode())

    def new_id(self, prefix: str) -> str:
        return f"{prefix}_{next(self.ids):06d}"

    def fail(self, message: str) -> None:
        self.log("VIOLATED", message)
        raise Violation(message)

    # ------------------------------------------------------------------ leaders

    def start(self, replica: Replica, k: int, fence: int) -> None:
        leader = Leader(self, k, replica, fence)
        replica.leaders[k] = leader
        self.leaders[k] = leader
        self.log(
            "leader", f"engine-{k} starts on {replica.holder} (fence {fence}), {len(leader.want)} devices to re-claim"
        )
        self.wake(leader)

    def stop(self, leader: Leader) -> None:
        leader.alive = False
        if leader.replica.leaders.get(leader.k) is leader:
            del leader.replica.leaders[leader.k]
        if self.leaders.get(leader.k) is leader:
            del self.leaders[leader.k]

    def wake(self, leader: Leader) -> None:
        if leader.alive and not leader.busy and not leader.stepping:
            leader.stepping = True

            def go() -> None:
                leader.stepping = False
                leader.step()

            self.at(0.0, go, f"step engine-{leader.k}")

    def commit(self, leader: Leader, ops: list[Op], after: list[Callable[[], None]], claims: list[Claim]) -> None:
        """The step's group commit reaches the store (queued behind others if the store is busy)."""
        if not ops:
            if leader.alive:
                self._committed(leader, {}, after, claims)
            return
        c = self.costs
        if c.db_commit_s or c.db_op_s:
            start = max(self.now, self.db_free)
            self.db_free = start + c.db_commit_s + c.db_op_s * len(ops)
            if self.db_free > self.now:
                self.at(self.db_free - self.now, partial(self._commit, leader, ops, after, claims), "commit lands")
                return
        self._commit(leader, ops, after, claims)

    def _commit(self, leader: Leader, ops: list[Op], after: list[Callable[[], None]], claims: list[Claim]) -> None:
        if not leader.alive:
            if leader.lands:  # sent before its process died: it lands, and nothing follows it
                leader.lands = False
                with_guard = (leader.k, leader.holder, leader.fence)
                try:
                    self.store.commit(*with_guard, ops)
                    self.log("commit", f"engine-{leader.k}@{leader.fence}: {len(ops)} ops landed after its crash")
                    self.seen["commit landed after a crash"] += 1
                except Refused:
                    pass
            return
        if not self.healing and self.rng.random() < self.faults.store_fail:
            self.store.fail_next = 1
        try:
            won = self.store.commit(leader.k, leader.holder, leader.fence, ops)
        except LeaseLost as exc:
            self.log("refused", f"engine-{leader.k}: {exc}")
            self.seen["stale leader's commit refused"] += 1
            self.stop(leader)
            return
        except StoreDown:
            self.log("store", f"engine-{leader.k}: commit failed, rebuilding from the store")
            self.seen["store failure"] += 1
            self.restart(leader)
            return
        except Refused as exc:
            self.fail(f"engine-{leader.k} committed what the store refused (memory and store disagree): {exc}")
        self.log(
            "commit",
            f"engine-{leader.k}@{leader.fence}: {len(ops)} ops ({', '.join(sorted({type(o).__name__ for o in ops}))})",
        )
        self._committed(leader, won, after, claims)

    def _committed(
        self, leader: Leader, won: dict[str, bool], after: list[Callable[[], None]], claims: list[Claim]
    ) -> None:
        for fn in after:
            fn()
        leader.committed(won, claims)
        if self.checks and leader.alive and self.store.held(leader.k, leader.holder, leader.fence):
            mine, theirs = leader.summary(), rebuild(self.store, leader.k, leader.fence)
            theirs["waiting"] = [r for r in theirs["waiting"] if r in leader.waiting]  # hints may be due yet
            if mine != theirs:
                diff = {key: (mine[key], theirs[key]) for key in mine if mine[key] != theirs[key]}
                self.fail(
                    f"engine-{leader.k}: a rebuild from the store would not give its memory: (live, rebuilt) {diff}"
                )
        if leader.inbox:
            self.wake(leader)

    def restart(self, leader: Leader) -> None:
        """Its memory is thrown away and rebuilt from the store, under the same lease."""
        self.stop(leader)
        replica = leader.replica
        if replica.up and self.store.held(leader.k, replica.holder, leader.fence):
            self.start(replica, leader.k, leader.fence)

    # ------------------------------------------------------------------ frames and hints

    def _deliver(self, loss: float, jitter: float, fn: Callable[[], None], what: str) -> None:
        if not self.healing and self.rng.random() < loss:
            self.log("fault", f"lost {what}")
            return
        self.at(self.costs.net_s + self.rng.random() * (0.0 if self.healing else jitter), fn, what)

    def send_batch(self, k: int, att: AttemptRow) -> None:
        """A leader sends a batch (its gateway relays it to the device's connection)."""
        f = self.faults
        self._deliver(
            f.loss, f.jitter, partial(self.devices[att.device].batch, att), f"engine-{k} {att.batch}->{att.device}"
        )

    def to_owner(self, device: str, batch: str, status: str) -> None:
        """A device's result goes to the shard owning it now (the presence hint routes it)."""

        def deliver() -> None:
            owner = self.store.devices[device].owner
            leader = self.leaders.get(owner)
            if leader is not None:
                leader.give("result", (device, batch, status))

        f = self.faults
        self._deliver(f.loss, f.jitter, deliver, f"{device} result {batch} {status}")

    def ack(self, device: str, batch: str) -> None:
        f = self.faults
        self._deliver(f.loss, f.jitter, partial(self.devices[device].acked, batch), f"ack {batch}->{device}")

    def hint(self, k: int, kind: str, value: Any) -> None:
        def deliver() -> None:
            leader = self.leaders.get(k)
            if leader is not None:
                leader.give(kind, value)

        f = self.faults
        label = value[0].id if kind == "submit" else value  # not the reply's repr: it holds addresses
        self._deliver(f.bus_loss, f.bus_jitter, deliver, f"hint {kind} {label} to engine-{k}")

    def hint_device(self, device: str, rid: str) -> None:
        self.hint(self.store.devices[device].owner, "request", rid)

    # ------------------------------------------------------------------ checks

    def check_op(self, k: int, fence: int, op: Op) -> None:
        """Checked on every op before it applies, from the rows and leases alone."""
        store = self.store
        lease = store.leases[k]
        if lease.fence != fence or lease.expires <= self.now:
            self.fail(
                f"engine-{k}@{fence} wrote after its lease moved on (fence {lease.fence}, expires {lease.expires:.3f})"
            )
        if isinstance(op, Claim):
            row = store.devices[op.device]
            lease = store.leases[row.owner]
            if lease.fence == row.owner_fence and lease.expires > self.now and lease.holder is not None:
                self.fail(f"engine-{k} took {op.device} from engine-{row.owner}@{row.owner_fence}, a live claim")
        elif isinstance(op, HandBack | Open | End):
            device = (
                op.device
                if isinstance(op, HandBack)
                else (store.requests[op.request].device if isinstance(op, Open) else store.attempts[op.batch].device)
            )
            row = store.devices[device]
            if (row.owner, row.owner_fence) != (k, fence):
                self.fail(f"engine-{k}@{fence} wrote {device}, which engine-{row.owner}@{row.owner_fence} holds")
            if isinstance(op, Open):
                if any(a.device == device and a.status == "open" for a in store.attempts.values()):
                    self.fail(f"engine-{k} opened {op.batch} on {device}, which has an open attempt")
                floor = self.fence_floor.get(device, 0)
                if op.fence <= floor or op.fence <= row.fence:
                    self.fail(
                        f"engine-{k} opened {op.batch} on {device} with fence {op.fence} <= {max(floor, row.fence)}"
                    )
                self.fence_floor[device] = op.fence
        else:
            task_id = op.task.id if isinstance(op, AddTask) else (op.request.task if isinstance(op, Ask) else op.task)
            if shard_of(task_id, self.n) != k:
                self.fail(f"engine-{k} wrote task {task_id}, which belongs to engine-{shard_of(task_id, self.n)}")

    def executed(self, device: Device, att: AttemptRow) -> None:
        key = (att.task, att.node)
        self.log("exec", f"{device.id} runs {att.batch} ({att.task}/{att.node}, f{att.fence})")
        if key in self.executions:
            self.fail(f"{att.task}/{att.node} ran twice: batches {self.executions[key]} and {att.batch}")
        self.executions[key] = att.batch

    def task_ended(self, task_id: str) -> None:
        self.ended_tasks += 1

    def final_checks(self) -> None:
        store = self.store
        for task_id in sorted(self.acked):
            task = store.tasks.get(task_id)
            if task is None:
                self.fail(f"task {task_id} was acknowledged but is not in the store")
            elif task.state == "running":
                self.fail(f"task {task_id} did not end: {[(n, store.nodes[(task_id, n)]) for n in task.deps]}")
        for task in store.tasks.values():
            states = {n: store.nodes[(task.id, n)] for n in task.deps}
            settled = {
                a.node: a.status
                for a in store.attempts.values()
                if a.task == task.id and a.applied and a.status != "stale"
            }
            for n, deps in task.deps.items():
                ran = (task.id, n) in self.executions
                if states[n] in ("succeeded", "failed") and settled.get(n) != states[n]:
                    self.fail(f"{task.id}/{n} is {states[n]}, its settled attempt {settled.get(n)}")
                if ran != (states[n] in ("succeeded", "failed")):
                    self.fail(f"{task.id}/{n} is {states[n]} but it {'ran' if ran else 'never ran'}")
                if states[n] == "skipped" and all(states[d] == "succeeded" for d in deps):
                    self.fail(f"{task.id}/{n} was skipped although everything it needs succeeded")
                if ran and not all(states[d] == "succeeded" for d in deps):
                    self.fail(f"{task.id}/{n} ran although {deps} did not all succeed")
            want = "succeeded" if all(s == "succeeded" for s in states.values()) else "failed"
            if task.state != want:
                self.fail(f"task {task.id} ended {task.state}, its nodes say {want}")
        unsettled = [a.batch for a in store.attempts.values() if a.status == "open" or not a.applied]
        if unsettled:
            self.fail(f"attempts left open or unsettled: {unsettled}")
        if any(not r.closed for r in store.requests.values()):
            self.fail(f"requests left open: {[r.id for r in store.requests.values() if not r.closed]}")
        for d, dev in sorted(self.devices.items()):
            if dev.outbox:
                self.fail(f"{d} still holds unacknowledged results: {sorted(dev.outbox)}")

    # ------------------------------------------------------------------ the API and the work

    def dag(self) -> dict[str, tuple[str, ...]]:
        """A chain, a fan-out (one node, many after it, one after them all) or a short random DAG."""
        shape = self.rng.choice(("chain", "fan", "dag"))
        size = self.rng.randint(2, 6)
        names = [f"n{i}" for i in range(size)]
        if shape == "chain":
            return {n: (names[i - 1],) if i else () for i, n in enumerate(names)}
        if shape == "fan":
            return {
                n: () if i == 0 else ((names[0],) if i < size - 1 else tuple(names[1:-1]) or (names[0],))
                for i, n in enumerate(names)
            }
        return {n: tuple(sorted(set(self.rng.sample(names[:i], min(i, 2))))) if i else () for i, n in enumerate(names)}

    def submit(self, task_id: str | None = None, deps: dict[str, tuple[str, ...]] | None = None, asks: int = 0) -> None:
        """The API stores a task through its shard's leader, asking again until it is answered."""
        if task_id is None:
            task_id = self.new_id("task")
            deps = self.dag()
            self.specs[task_id] = TaskRow(task_id, shard_of(task_id, self.n), deps)
            self.log("api", f"task {task_id} on engine-{shard_of(task_id, self.n)}: {deps}")
        if task_id in self.acked:
            return
        task = self.specs[task_id]

        def reply() -> None:
            if task_id not in self.acked:
                if task_id not in self.store.tasks:
                    self.fail(f"task {task_id} acknowledged before it was stored")
                self.acked.add(task_id)

        f = self.faults
        answer = partial(self._deliver, f.bus_loss, f.bus_jitter, reply, f"answer {task_id}")
        self.hint(task.shard, "submit", (copy.deepcopy(task), answer))
        self.at(2.0, partial(self.submit, task_id, deps, asks + 1), "ask again")

    # ------------------------------------------------------------------ faults

    def chaos(self) -> None:
        if self.healing:
            return
        f = self.faults
        for _name, replica in sorted(self.replicas.items()):
            if replica.up and self.rng.random() < f.crash:
                self.crash(replica)
        for k, leader in sorted(self.leaders.items()):
            if self.rng.random() < f.lease_expiry:
                self.log("fault", f"lease engine-{k} expires; its leader on {leader.holder} keeps writing a while")
                self.store.expire(k)
                leader.deaf_until = self.now + self.rng.uniform(0.5, 4.0)
                self.seen["lease expired under its leader"] += 1
        self.at(1.0, self.chaos, "chaos")

    def crash(self, replica: Replica) -> None:
        self.log("fault", f"replica {replica.holder} crashes with {sorted(replica.leaders)}")
        self.seen["replica crash"] += 1
        replica.up = False
        for leader in list(replica.leaders.values()):
            leader.lands = leader.busy and self.rng.random() < 0.5
            self.stop(leader)
        self.at(self.rng.uniform(1.0, 6.0), partial(self.recover, replica), "replica restarts")

    def recover(self, replica: Replica) -> None:
        replica.up = True
        replica.incarnation += 1
        self.log("replica", f"{replica.holder} starts")

    # ------------------------------------------------------------------ running

    def run(self, tasks: int, fault_s: float, heal_s: float) -> None:
        self.log("setup", f"seed {self.seed}: {self.n} shards, {len(self.devices)} devices, {self.faults}")
        for i, replica in enumerate(self.replicas.values()):
            self.at(0.01 * i, replica.leases, f"leases {replica.name}")
        for d in self.device_ids:
            self.at(1.0, self.devices[d].resend, f"{d} resends")
        for _ in range(tasks):
            self.at(self.rng.uniform(0.0, fault_s), self.submit, "submit")
        self.at(1.0, self.chaos, "chaos")
        self.at(1.0, self.tick, "tick")
        end_faults, deadline = fault_s, fault_s + heal_s
        while self.events:
            when, _, fn, _what = heapq.heappop(self.events)
            if when >= end_faults and not self.healing:
                self.healing = True
                self.log("heal", "faults stop")
            self.now = max(self.now, when)
            fn()
            if self.healing and len(self.acked) == tasks and self.quiet():
                break
            if self.now > deadline:
                break
        self.final_checks()

    def tick(self) -> None:
        for _k, leader in sorted(self.leaders.items()):
            leader.give("tick", None)
        self.at(1.0, self.tick, "tick")

    def quiet(self) -> bool:
        store = self.store
        return (
            all(t.state != "running" for t in store.tasks.values())
            and all(a.applied for a in store.attempts.values())
            and not any(dev.outbox for dev in self.devices.values())
        )


def simulate(seed: int, fault_s: float = 30.0, heal_s: float = 120.0) -> Outcome:
    """One seeded world: 2-4 shards on three replicas, 3-8 devices, a few tasks, faults, a heal."""
    rng = Random(seed ^ 0x5A4D)
    costs = Costs(commit_jitter_s=rng.choice((0.0, rng.uniform(0.0, 0.5))))
    world = World(seed, shards=rng.randint(2, 4), devices=rng.randint(3, 8), costs=costs)
    return _run(world, rng.randint(4, 12), fault_s, heal_s)


def _run(world: World, tasks: int, fault_s: float, heal_s: float) -> Outcome:
    error = ""
    try:
        world.run(tasks, fault_s, heal_s)
    except Violation as exc:
        error = str(exc)
    except Exception as exc:  # the model blew up: reported like a violation
        import traceback

        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        world.log("CRASHED", error.splitlines()[0])
    remote = world.seen["remote attempt"]
    placed = remote + world.seen["local attempt"]
    return Outcome(
        world.seed,
        not error,
        error,
        "\n".join(world.lines),
        world.hash.hexdigest(),
        world.count,
        world.store.commits,
        len(world.acked),
        world.seen,
        sum(1 for s in world.store.nodes.values() if s in ("succeeded", "failed")),
        world.now,
        remote / placed if placed else 0.0,
    )


# ====================================================================== throughput


def throughput(
    shards: int,
    costs: Costs,
    devices: int = 400,
    in_flight: int = 200,
    remote_share: float = 0.1,
    seconds: float = 20.0,
    seed: int = 1,
) -> Outcome:
    """Node transitions per virtual second with `shards` shards, no faults: `in_flight` tasks kept
    open at all times (a new one as each ends), each a chain, fan-out or short DAG; each leader
    spends `costs` per step and the store serves commits one at a time if it has a cost."""
    world = World(seed, shards, devices, costs, Faults(), remote_share, replicas=shards)
    world.cap = 1  # one shard per replica (per core): a leader's cost is its own
    world.checks = False  # the fault sweep checks; this measures
    world.store.on_op = None
    world.tool_failure = 0.0

    def refill(task_id: str) -> None:
        world.ended_tasks += 1
        world.submit()

    world.task_ended = refill  # type: ignore[method-assign]
    world.log("setup", f"throughput: {shards} shards, {devices} devices, {in_flight} tasks in flight")
    for i, replica in enumerate(world.replicas.values()):
        world.at(0.01 * i, replica.leases, f"leases {replica.name}")
    for _ in range(in_flight):
        world.at(world.rng.uniform(0.0, 0.5), world.submit, "submit")
    world.at(1.0, world.tick, "tick")
    warm = 3.0
    start_nodes = 0
    while world.events:
        when, _, fn, _what = heapq.heappop(world.events)
        if world.now < warm <= when:
            start_nodes = sum(1 for s in world.store.nodes.values() if s in ("succeeded", "failed"))
        world.now = max(world.now, when)
        fn()
        if world.now > warm + seconds:
            break
    done = sum(1 for s in world.store.nodes.values() if s in ("succeeded", "failed")) - start_nodes
    remote = world.seen["remote attempt"]
    placed = remote + world.seen["local attempt"]
    return Outcome(
        seed,
        True,
        "",
        "",
        world.hash.hexdigest(),
        world.count,
        world.store.commits,
        len(world.acked),
        world.seen,
        done,
        seconds,
        remote / placed if placed else 0.0,
    )


# What one leader costs, from `python bench/engine_step.py` (chain: 409 µs per step of one node, of
# which 274 µs the commit; layered: 282 µs per node; SQLite, on a 2-core machine shared with other
# work, 2026-12-05). A local node here is 5 units of a leader's work (a result, and the End,
# Settle, Ask and Open it writes): 282 / 5 = 56 µs a unit; 409 - 282 = 127 µs a step.
MEASURED = Costs(step_s=127e-6, input_s=56e-6, exec_s=(0.005, 0.02), net_s=0.001)
# Postgres on loopback, measured the same way (the engine harness on a throwaway Postgres with
# synchronous_commit=on and fsync=on, same machine and day): chain 11.2 ms per step, of which the
# commit 10.7 ms (the WAL flush on this machine's virtual disk: 2.5 ms with synchronous_commit=off);
# layered 382 µs per node with synchronous_commit=off: 76 µs a unit, 10.8 ms a step. Assumed, not
# measured: the one database serves ~50,000 row writes a second (100 µs a commit and 20 µs a row,
# one commit at a time), whoever writes them.
POSTGRES = Costs(step_s=10.8e-3, input_s=76e-6, db_commit_s=100e-6, db_op_s=20e-6, exec_s=(0.005, 0.02), net_s=0.001)


def main() -> None:
    """`python -m tests.sim.shards [--seconds S]`: the throughput table of docs/scaling.md."""
    import argparse
    import time

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seconds", type=float, default=1.0, help="virtual seconds measured per cell")
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--shards", default="1,2,4,8")
    parser.add_argument("--only", choices=("sqlite", "postgres"), default=None)
    args = parser.parse_args()
    print("| store | shards | cross-shard share 10 % | cross-shard share 50 % |")
    print("|---|---|---|---|")
    for name, costs in (("SQLite leader, store unbounded", MEASURED), ("Postgres leader, store capped", POSTGRES)):
        if args.only and not name.lower().startswith(args.only):
            continue
        for n in (int(x) for x in args.shards.split(",")):
            cells = []
            for share in (0.1, 0.5):
                t0 = time.monotonic()
                o = throughput(n, costs, args.devices, args.in_flight, share, args.seconds)
                took = time.monotonic() - t0
                cells.append(f"{o.nodes_done / o.virtual_s:,.0f} nodes/s ({o.cross_share:.0%} remote, {took:.0f} s)")
            print(f"| {name} | {n} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
