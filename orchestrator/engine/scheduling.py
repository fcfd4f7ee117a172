"""Queues, placement and timeouts: the part of the engine that decides what runs where and when.

A mixin of `Engine` (kept apart so each file holds one idea); it reads and changes the engine's
runtime state and records through the engine's `_apply`."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, cast

from orchestrator.config import Settings
from orchestrator.domain import placement
from orchestrator.domain.model import AdminState, Liveness, NodeSpec, NodeState
from orchestrator.domain.run import TaskRun, Transition
from orchestrator.engine import llm_work
from orchestrator.engine.records import AttemptRun, DeviceRun, NodeKey
from orchestrator.engine.times import BATCH_GRACE_S
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from orchestrator.engine.core import Engine


class Scheduling:
    settings: Settings
    tasks: dict[str, TaskRun]
    devices: dict[str, DeviceRun]
    attempts: dict[str, AttemptRun]
    ready: dict[NodeKey, None]
    queued_at: dict[NodeKey, str]
    _capable_cache: dict[tuple[Any, ...], list[str]]
    _timers: list[tuple[float, int, str, Any]]
    _timer_seq: int

    if TYPE_CHECKING:  # provided by Engine and its other mixins (no runtime stubs: they would shadow them)

        def _apply(self, run: TaskRun, transitions: list[Transition], now: float) -> None: ...

        def _assign(self, dev: DeviceRun, key: NodeKey, now: float) -> None: ...

        def _send_cancel(self, att: AttemptRun, reason: str) -> None: ...

        def _end_unanswered(self, att: AttemptRun, code: str, message: str, now: float) -> None: ...

        def _sweep(self, now: float) -> None: ...

    def _schedule(self, now: float) -> None:
        """Give READY nodes (highest priority, oldest first) a free capable device at once, or a
        place in the shortest capable queue; then give every free device its next queued node."""
        if self.ready:
            for key in sorted(self.ready, key=self._queue_order):
                run = self.tasks[key[0]]
                rec = run.nodes[key[1]]
                if rec.not_before and rec.not_before > now:
                    continue  # backing off before a retry
                capable = self._capable(rec.spec)
                if not capable:
                    self._maybe_fail_unplaceable(key, now)
                    continue
                candidates = [d for d in capable if takes_work(d)]
                if not candidates:
                    continue  # capable devices exist but none is in service now: wait (queue timeout)
                dev = min(
                    candidates, key=lambda d: placement.preference(d.id, rec.failed_on, _occupied(d), len(d.queue))
                )
                if not _occupied(dev):
                    self.ready.pop(key, None)
                    self._assign(dev, key, now)  # a free device takes it at once: no queue to wait in
                else:
                    self._enqueue(key, dev, now)
        for dev in self.devices.values():
            if dev.current_batch is None and takes_work(dev):
                picked = self._next_for(dev)
                if picked is not None:
                    self._take_from_queue(picked)
                    self._assign(dev, picked, now)

    def _capable(self, spec: NodeSpec) -> list[DeviceRun]:
        """Non-revoked devices that could run `spec`, cached per placement signature (the cache is
        dropped whenever a device's tools, labels, name or admin state change)."""
        sig = _signature(spec)
        ids = self._capable_cache.get(sig)
        if ids is None:
            ids = [
                d.id
                for d in self.devices.values()
                if d.admin is not AdminState.REVOKED and placement.capable(spec, d.view())
            ]
            self._capable_cache[sig] = ids
        return [self.devices[i] for i in ids]

    def _next_for(self, dev: DeviceRun) -> NodeKey | None:
        """Its own queue first (priority, then age); else steal a node it can run elsewhere."""
        if dev.queue:
            return min(dev.queue, key=self._queue_order)
        view = dev.view()
        stealable = [k for k in self.queued_at if self._may_steal(k, dev.id, view)]
        return min(stealable, key=self._queue_order) if stealable else None

    def _may_steal(self, key: NodeKey, device_id: str, view: placement.DeviceView) -> bool:
        rec = self.tasks[key[0]].nodes[key[1]]
        return device_id not in rec.failed_on and placement.capable(rec.spec, view)

    def _queue_order(self, key: NodeKey) -> tuple[int, float]:
        run = self.tasks[key[0]]
        rec = run.nodes[key[1]]
        return (-(run.priority + rec.spec.priority), rec.ready_since or 0.0)

    def _enqueue(self, key: NodeKey, dev: DeviceRun, now: float) -> None:
        self.ready.pop(key, None)
        dev.queue[key] = None
        self.queued_at[key] = dev.id
        run = self.tasks[key[0]]
        self._apply(run, run.mark_queued(key[1], dev.id), now)

    def _take_from_queue(self, key: NodeKey) -> None:
        device_id = self.queued_at.pop(key, None)
        if device_id is not None:
            self.devices[device_id].queue.pop(key, None)

    def _unqueue_all(self, dev: DeviceRun, now: float) -> None:
        for key in list(dev.queue):
            self._take_from_queue(key)
            run = self.tasks[key[0]]
            self._apply(run, run.unqueue(key[1]), now)

    def _maybe_fail_unplaceable(self, key: NodeKey, now: float) -> None:
        run = self.tasks[key[0]]
        spec = run.nodes[key[1]].spec
        views = [d.view() for d in self.devices.values()]
        if not placement.could_ever_run(spec, views):
            problem = placement.no_capable_device(spec, views)
            self._apply(run, run.fail(key[1], ErrorCode.NO_CAPABLE_DEVICE, problem.message, now), now)

    def _timer(self, when: float, kind: str, key: Any) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, kind, key))

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            when, _, kind, key = heapq.heappop(self._timers)
            if kind == "queue_timeout":
                self._queue_timeout(key[0], key[1], when, now)
            elif kind == "attempt_deadline":
                att = self.attempts.get(key)
                if att is not None and att.kind == "agent":
                    llm_work.stop_agent(
                        cast("Engine", self),
                        att,
                        ErrorCode.TIMEOUT,
                        "the agent node did not finish within its "
                        "timeout_s; raise timeout_s or simplify the instruction",
                        now,
                        "timeout",
                    )
                elif att is not None:
                    self._timeout_attempt(att, self._deadline_message(att), now)
            elif kind == "accept_deadline":
                att = self.attempts.get(key)
                if att is not None and not att.accepted:
                    dev = self.devices.get(att.device_id)
                    if dev is not None and dev.liveness is Liveness.ONLINE:
                        limit = self.settings.batch_accept_timeout_s
                        self._timeout_attempt(att, f"the device did not accept the batch within {limit:g}s", now)
            elif kind == "sweep":
                self._sweep(now)
                self._timer(now + self.settings.link_report_interval_s, "sweep", None)
            # "wake" timers only make the loop run a scheduling pass

    def _deadline_message(self, att: AttemptRun) -> str:
        run = self.tasks.get(att.task_id)
        rec = run.nodes.get(att.node_id) if run else None
        if rec is not None and rec.spec.timeout_s:
            limit = f"the node's timeout_s ({rec.spec.timeout_s:g}s)"
        else:
            limit = f"its deadline (its commands' timeout_s plus {BATCH_GRACE_S:g}s, as the node sets no timeout_s)"
        return (
            f"the attempt did not finish within {limit}; the device was told to stop. "
            "Raise timeout_s if the work needs longer."
        )

    def _queue_timeout(self, key: NodeKey, due_since: float, fired: float, now: float) -> None:
        run = self.tasks.get(key[0])
        if run is None:
            return
        rec = run.nodes[key[1]]
        if rec.state not in (NodeState.READY, NodeState.QUEUED) or rec.ready_since != due_since:
            return
        limit = rec.spec.queue_timeout_s or self.settings.queue_timeout_s
        self._take_from_queue(key)
        self._apply(
            run,
            run.fail(
                key[1],
                ErrorCode.QUEUE_TIMEOUT,
                f"no capable device took this node within queue_timeout_s={limit:g}; check that a "
                "matching device is connected and in service, or raise queue_timeout_s",
                now,
            ),
            now,
        )

    def _timeout_attempt(self, att: AttemptRun, message: str, now: float) -> None:
        self._send_cancel(att, "timeout")
        self._end_unanswered(att, ErrorCode.TIMEOUT, message, now)


def takes_work(dev: DeviceRun) -> bool:
    return dev.admin is AdminState.ACTIVE and dev.liveness is Liveness.ONLINE


def _occupied(dev: DeviceRun) -> bool:
    return dev.current_batch is not None or bool(dev.queue)


def _signature(spec: NodeSpec) -> tuple[Any, ...]:
    p = spec.placement
    return (spec.kind, p.device, p.platform, tuple(sorted(p.labels.items())), tuple(sorted(set(spec.tools()))))
