"""The pure state machine of one running task: node transitions, retries, cancellation.

The engine feeds it what happened (a node's attempt ended, a cancel was asked) and persists the
`Transition`s it returns. Nothing here knows about devices, sockets or the store, which is what
lets a property test drive thousands of random runs through it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from orchestrator.domain import dag, fanout, retry
from orchestrator.domain.lifecycle import check_transition, task_outcome
from orchestrator.domain.model import TERMINAL_NODE_STATES, EdgeSpec, NodeSpec, NodeState, TaskState


class NodeTransition(NamedTuple):
    """A node of the DAG, or a fan-out child (`node_id` is then its unit, `fanout.child_unit`),
    moved from state `old` to `new`."""

    node_id: str
    old: NodeState
    new: NodeState


class TaskTransition(NamedTuple):
    """The task itself moved from state `old` to `new`."""

    old: TaskState
    new: TaskState


# What the engine persists and announces, in order. Named tuples, not frozen dataclasses: every
# transition of every node is built here, and a frozen dataclass costs twice as much to make.
Transition = NodeTransition | TaskTransition


@dataclass(slots=True)
class NodeRecord:
    spec: NodeSpec
    state: NodeState = NodeState.PENDING
    attempts: int = 0
    output: Any = None
    results: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, str] | None = None
    ready_since: float | None = None  # when it last became READY (queue timeout, FIFO order)
    not_before: float | None = None  # retry backoff: not dispatched before this time
    queued_on: str | None = None  # device whose queue holds it
    failed_on: set[str] = field(default_factory=set)  # devices where an attempt failed (retry elsewhere)
    unstarted: int = 0  # attempts that certainly never ran on their device (not counted as tries)

    @property
    def tries(self) -> int:
        """Attempts that may have run: what `retry.max_attempts` limits."""
        return self.attempts - self.unstarted


@dataclass(slots=True)
class AttemptOutcome:
    """How an attempt ended; never changed once made. Not a frozen dataclass only because every
    attempt's end builds one on the engine's hot path, where freezing it costs five times as much."""

    succeeded: bool
    output: Any = None
    results: list[dict[str, Any]] = field(default_factory=list)
    error_code: str = ""
    error_message: str = ""
    started: bool = True  # False: the attempt never ran on the device
    tool_hints: tuple[tuple[bool, bool], ...] = ()  # (read_only, idempotent) per tool used
    tools: tuple[str, ...] = ()  # the name of each tool in `tool_hints`
    # For a tool node: the index in the node's commands of each entry of `tool_hints` (so a
    # command declared `idempotent` counts as such); None for an agent node's tools.
    commands: tuple[int, ...] | None = None
    cancelled: bool = False
    # The code it fails with if the retry rules do not run it again (default `error_code`, by
    # which they judge): a failed probe judges by the unknown outcome, fails `verification_failed`.
    final_code: str = ""


class TaskRun:
    """Nodes of one task and the rules that move them. Single-threaded by contract."""

    def __init__(
        self,
        task_id: str,
        nodes: list[NodeSpec],
        edges: list[EdgeSpec],
        state: TaskState = TaskState.RUNNING,
        priority: int = 0,
    ) -> None:
        self.id = task_id
        self.priority = priority
        self.state = state
        self.cancel_requested = state is TaskState.CANCELLED
        self.edges = list(edges)
        self.graph = dag.Graph.build([n.id for n in nodes], edges)
        self.nodes: dict[str, NodeRecord] = {n.id: NodeRecord(n) for n in nodes}
        self._unfinished = len(self.nodes)  # kept by _set: the task can only end when this is 0
        # Re-planning (SPEC section 6): a node that fails for good is held, its successors left
        # pending, until the planner has had its chance to edit the part not yet run.
        self.hold_failures = False
        self.held: set[str] = set()
        self._view = _StateView(self.nodes, self.held)
        self.replanning: set[str] = set()  # held nodes the planner is working on
        self.replans_used = 0
        self.replan = False  # the task asked for re-planning (LLM-planned tasks always do)
        self.request: str | None = None
        self.version = 1
        # Fan-out nodes: each one's children, by unit, and the rollout releasing them.
        self.children: dict[str, NodeRecord] = {}
        self.rollouts: dict[str, fanout.Rollout] = {}

    # ---------------------------------------------------------------- queries

    def states(self) -> dict[str, NodeState]:
        return {k: r.state for k, r in self.nodes.items()}

    def record(self, unit: str) -> NodeRecord:
        """The record of a node of the DAG or of a fan-out child (by its unit)."""
        rec = self.nodes.get(unit)
        return rec if rec is not None else self.children[unit]

    def has(self, unit: str) -> bool:
        return unit in self.nodes or unit in self.children

    def units(self) -> Iterator[tuple[str, NodeRecord]]:
        """Every node of the DAG, then every fan-out child: what the engine places and runs."""
        yield from self.nodes.items()
        yield from self.children.items()

    def unit_of(self, node_id: str, device_id: str) -> str:
        """What ran on `device_id` for node `node_id`: its child there if it fans out, else itself."""
        return fanout.child_unit(node_id, device_id) if node_id in self.rollouts else node_id

    def outcome_of(self, node_id: str) -> dict[str, Any] | None:
        """What `${nodes.<id>...}` references see: output and results of a succeeded node."""
        rec = self.nodes.get(node_id)
        if rec is None or rec.state is not NodeState.SUCCEEDED:
            return None
        return {"output": rec.output, "results": rec.results}

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def recount(self) -> None:
        """Re-derive bookkeeping after node states were set from outside (restoring from the store)."""
        self._unfinished = sum(1 for r in self.nodes.values() if not r.state.terminal)
        for rollout in self.rollouts.values():
            rollout.recount({u: self.children[u].state for u in rollout.units})

    # ---------------------------------------------------------------- changes

    def start(self, now: float) -> list[Transition]:
        """Roots become READY, and so does any pending node whose edges are already decided
        (after a restart or a DAG edit). Idempotent."""
        out: list[Transition] = []
        for node_id, state in dag.initial_states(self.graph).items():
            if state is NodeState.READY and self.nodes[node_id].state is NodeState.PENDING:
                out += self._set(node_id, NodeState.READY, now)
        finished = [n for n, r in self.nodes.items() if r.state.terminal and n not in self.held]
        for node_id, state in dag.advance(self.graph, self._view, finished).items():
            out += self._set(node_id, state, now)
        for node_id in list(self.rollouts):
            if not self.nodes[node_id].state.terminal:
                out += self._roll(node_id, now)
        return out + self._maybe_finish()

    def fan_out(
        self, node_id: str, found: list[fanout.Target], left_out: list[dict[str, str]], now: float
    ) -> list[Transition]:
        """A READY fan-out node gets its children, one per device in `found` (in rollout order),
        and is RUNNING while they run; the first of them are released. With no device at all it
        fails `no_matching_device`. Idempotent."""
        rec = self.nodes[node_id]
        if rec.state is not NodeState.READY or node_id in self.rollouts:
            return []
        if not found:
            shown = "; ".join(f"{x['device']}: {x['reason']}" for x in left_out[:5])
            message = (
                "no device matched its for_each when it became ready"
                + (f" (left out: {shown}{'; ...' if len(left_out) > 5 else ''})" if shown else "")
                + ". Bring a matching device into service (uncordon, resume, connect it) and re-run the task."
            )
            return self.fail(node_id, fanout.NO_MATCHING_DEVICE, message, now)
        rollout = fanout.Rollout.of(rec.spec, found, left_out)
        for target in found:
            unit = fanout.child_unit(node_id, target.device_id)
            self.children[unit] = NodeRecord(fanout.child_spec(rec.spec, target.device_id))
        self.rollouts[node_id] = rollout
        rec.queued_on = None
        return self._set(node_id, NodeState.RUNNING, None) + self._roll(node_id, now)

    def verifying(self, unit: str, output: Any, results: list[dict[str, Any]]) -> list[Transition]:
        """Its attempt ended and its verify commands now decide; `output` and `results`
        are what it ends with if they pass."""
        rec = self.record(unit)
        if rec.state not in (NodeState.RUNNING, NodeState.WAITING_APPROVAL, NodeState.TAKEN_OVER):
            return []
        rec.output, rec.results = output, results
        return self._set(unit, NodeState.VERIFYING, None)

    def mark_queued(self, node_id: str, device_id: str) -> list[Transition]:
        rec = self.record(node_id)
        rec.queued_on = device_id
        if rec.state is NodeState.QUEUED:
            return []
        return self._set(node_id, NodeState.QUEUED, None)

    def unqueue(self, node_id: str) -> list[Transition]:
        """Back to READY (its device stopped taking work), keeping its place in time."""
        rec = self.record(node_id)
        rec.queued_on = None
        if rec.state is not NodeState.QUEUED:
            return []
        since = rec.ready_since
        out = self._set(node_id, NodeState.READY, since)
        return out

    def mark_running(self, node_id: str) -> list[Transition]:
        rec = self.record(node_id)
        rec.queued_on = None
        rec.attempts += 1
        rec.not_before = None
        return self._set(node_id, NodeState.RUNNING, None)

    def waiting_approval(self, node_id: str, waiting: bool) -> list[Transition]:
        """Its device waits for a person's approval (True), or the decision came (False)."""
        rec = self.record(node_id)
        if waiting and rec.state is NodeState.RUNNING:
            return self._set(node_id, NodeState.WAITING_APPROVAL, None)
        if not waiting and rec.state is NodeState.WAITING_APPROVAL:
            return self._set(node_id, NodeState.RUNNING, None)
        return []

    def taken_over(self, node_id: str, taken: bool, waiting_approval: bool = False) -> list[Transition]:
        """Its agent's device was taken over by a person (True), or handed back (False: running
        again, or waiting for the approval it asked before, `waiting_approval`)."""
        rec = self.record(node_id)
        if taken and rec.state in (NodeState.RUNNING, NodeState.WAITING_APPROVAL):
            return self._set(node_id, NodeState.TAKEN_OVER, None)
        if not taken and rec.state is NodeState.TAKEN_OVER:
            return self._set(node_id, NodeState.WAITING_APPROVAL if waiting_approval else NodeState.RUNNING, None)
        return []

    def attempt_ended(self, node_id: str, outcome: AttemptOutcome, now: float, jitter: float) -> list[Transition]:
        """Apply an attempt's end: success, a retry after backoff, or failure for good."""
        rec = self.record(node_id)
        if rec.state.terminal:
            return []
        if outcome.succeeded:
            rec.output, rec.results, rec.error = outcome.output, outcome.results, None
            return self._set(node_id, NodeState.SUCCEEDED, now) + self._ended(node_id, now, False)
        rec.results = outcome.results
        rec.error = {"code": outcome.error_code, "message": outcome.error_message}
        if self.cancel_requested or outcome.cancelled:
            return self._set(node_id, NodeState.CANCELLED, now) + self._ended(node_id, now, False)
        rec.queued_on = None
        halted = self._halted_rollout(node_id)
        if halted is not None:
            # A fan-out child whose rollout halted while it ran: no child may start again, so it
            # fails now instead of being placed again (a restart from the store would not place it
            # either: it would skip it as a child waiting in a halted rollout).
            rec.error["not_retried"] = f"not retried: {halted}"
            return self._set(node_id, NodeState.FAILED, now) + self._ended(node_id, now, True)
        if retry.never_started(outcome.error_code, outcome.started):
            # Nothing ran, so nothing failed: place it again without spending a try. Its queue
            # timeout keeps counting from when it first became ready (schedule-to-start), which
            # also bounds a device that keeps turning it away; backing off spaces the turns.
            rec.unstarted += 1
            rec.not_before = now + retry.backoff_s(rec.unstarted, rec.spec.retry, jitter)
            return self._set(node_id, NodeState.READY, None)
        hints = outcome.tool_hints
        if outcome.commands is not None:
            cmds = rec.spec.commands
            hints = retry.declared_hints(hints, [0 <= i < len(cmds) and cmds[i].idempotent for i in outcome.commands])
        safe = retry.retry_safe(outcome.error_code, outcome.started, hints)
        if retry.should_retry(rec.tries, rec.spec.retry, safe):
            # Ready again once the backoff is over; its queue timeout counts from then, so a long
            # backoff cannot use up the time it has to find a device.
            rec.not_before = now + retry.backoff_s(rec.tries, rec.spec.retry, jitter)
            return self._set(node_id, NodeState.READY, rec.not_before)
        if rec.tries < rec.spec.retry.max_attempts:  # tries were left: say why none was made
            rec.error["not_retried"] = retry.not_retried(
                outcome.error_code, outcome.tools, hints, agent=outcome.commands is None
            )
        if outcome.final_code:
            rec.error["code"] = outcome.final_code
        return self._set(node_id, NodeState.FAILED, now) + self._ended(node_id, now, True)

    def _halted_rollout(self, unit: str) -> str | None:
        """Why no child of its fan-out may start again, if `unit` is a child of a halted rollout."""
        if unit not in self.children:
            return None
        rollout = self.rollouts[fanout.split_unit(unit)[0]]
        code = rollout.halt()
        return rollout.halt_message(code) if code is not None else None

    def fail(self, node_id: str, code: str, message: str, now: float) -> list[Transition]:
        """Fail a node that has no attempt in flight (queue timeout, template error, ...)."""
        rec = self.record(node_id)
        if rec.state.terminal:
            return []
        rec.error = {"code": code, "message": message}
        if rec.tries < rec.spec.retry.max_attempts and code != "cancelled":
            rec.error["not_retried"] = retry.not_retried(code)
        rec.queued_on = None
        return self._set(node_id, NodeState.FAILED, now) + self._ended(node_id, now, True)

    def release(self, node_id: str, now: float) -> list[Transition]:
        """Let a held failure take its course (after re-planning, or when none will happen)."""
        if node_id not in self.held:
            return []
        self.held.discard(node_id)
        return self._progress(node_id, now)

    def replace_graph(self, nodes: list[NodeSpec], edges: list[EdgeSpec]) -> None:
        """Adopt an edited DAG (already validated by `domain.edits`): new nodes start PENDING,
        removed ones disappear, changed ones keep their (pending) record with the new spec."""
        records: dict[str, NodeRecord] = {}
        for spec in nodes:
            rec = self.nodes.get(spec.id)
            if rec is None:
                rec = NodeRecord(spec)
            else:
                rec.spec = spec
            records[spec.id] = rec
        self.nodes.clear()
        self.nodes.update(records)
        self.edges = list(edges)
        self.graph = dag.Graph.build([n.id for n in nodes], edges)
        self.recount()

    def specs(self) -> list[NodeSpec]:
        return [r.spec for r in self.nodes.values()]

    def cancel(self, now: float) -> list[Transition]:
        """Cancel: every node not yet running is cancelled; running ones end when their device
        reports (the engine sends `cancel` to those devices)."""
        if self.state.terminal:
            return []
        self.cancel_requested = True
        self.held.clear()
        out: list[Transition] = []
        for node_id, rec in self.units():
            if rec.state in (NodeState.PENDING, NodeState.READY, NodeState.QUEUED):
                rec.queued_on = None
                out += self._set(node_id, NodeState.CANCELLED, now)
        for node_id in list(self.rollouts):  # a fan-out whose children all ended is cancelled now
            if not self.nodes[node_id].state.terminal:
                out += self._roll(node_id, now)
        return out + self._maybe_finish()

    # ---------------------------------------------------------------- internals

    def _set(self, node_id: str, new: NodeState, now: float | None) -> list[Transition]:
        rec = self.nodes.get(node_id)
        if rec is None:  # a fan-out child: its rollout counts it, the task does not
            rec = self.children[node_id]
            check_transition(rec.state, new)
            self.rollouts[fanout.split_unit(node_id)[0]].note(node_id, rec.state, new)
        else:
            check_transition(rec.state, new)
            was_open, is_open = rec.state not in TERMINAL_NODE_STATES, new not in TERMINAL_NODE_STATES
            self._unfinished += is_open - was_open
        old, rec.state = rec.state, new
        if new is NodeState.READY:
            rec.ready_since = now if now is not None else rec.ready_since
        return [NodeTransition(node_id, old, new)]

    def _ended(self, unit: str, now: float, failed: bool) -> list[Transition]:
        """What follows a node or child reaching a terminal state."""
        if unit in self.children:
            return self._roll(fanout.split_unit(unit)[0], now)
        return self._failed(unit, now) if failed else self._progress(unit, now)

    def _roll(self, node_id: str, now: float) -> list[Transition]:
        """Move a fan-out node's rollout on: skip its waiting children once it halts, else release
        the next ones; once every child ended, the node ends by the rollout's verdict."""
        rollout = self.rollouts[node_id]
        out: list[Transition] = []
        code = rollout.halt()
        if code is not None and not rollout.stopped:
            rollout.stopped = True
            message = rollout.halt_message(code)
            for unit in rollout.units:
                child = self.children[unit]
                if child.state in (NodeState.PENDING, NodeState.READY, NodeState.QUEUED):
                    child.error, child.queued_on = {"code": fanout.HALTED, "message": message}, None
                    out += self._set(unit, NodeState.SKIPPED, now)
        elif code is None and not self.cancel_requested:
            for unit in rollout.release():
                out += self._set(unit, NodeState.READY, now)
        if rollout.done and not self.nodes[node_id].state.terminal:
            out += self._finish_rollout(node_id, rollout, now)
        return out

    def _finish_rollout(self, node_id: str, rollout: fanout.Rollout, now: float) -> list[Transition]:
        rec = self.nodes[node_id]
        children = [(rollout.names[u], self.children[u]) for u in rollout.units]
        rec.output = {name: child.output for name, child in children if child.state is NodeState.SUCCEEDED}
        rec.results = []
        if self.cancel_requested and any(c.state is NodeState.CANCELLED for _, c in children):
            rec.error = {"code": "cancelled", "message": "the task was cancelled while its children ran"}
            return self._set(node_id, NodeState.CANCELLED, now) + self._progress(node_id, now)
        code = rollout.verdict()
        if code is None:
            rec.error = None
            return self._set(node_id, NodeState.SUCCEEDED, now) + self._progress(node_id, now)
        failed = [(name, (c.error or {}).get("code", "failed")) for name, c in children if c.state is NodeState.FAILED]
        rec.error = {"code": code, "message": rollout.failure_message(code, failed)}
        return self._set(node_id, NodeState.FAILED, now) + self._failed(node_id, now)

    def _progress(self, node_id: str, now: float) -> list[Transition]:
        out: list[Transition] = []
        changes = dag.advance(self.graph, self._view, [node_id])
        for n, state in changes.items():
            cancelled = self.cancel_requested and state is NodeState.READY
            out += self._set(n, NodeState.CANCELLED if cancelled else state, now)
        return out + self._maybe_finish()

    def _failed(self, node_id: str, now: float) -> list[Transition]:
        if self.hold_failures and not self.cancel_requested:
            self.held.add(node_id)
            return []
        return self._progress(node_id, now)

    def _maybe_finish(self) -> list[Transition]:
        if self._unfinished or self.held:
            return []
        final = task_outcome(self.graph, self.states(), self.cancel_requested)
        if final is None or self.state is final:
            return []
        old = self.state
        self.state = final
        return [TaskTransition(old, final)]


class _StateView(Mapping[str, NodeState]):
    """Node states as a read-only mapping, without copying them for every progress step. A held
    failure is not final yet (the planner may still edit what follows it), so the edges out of
    it read as undecided: another predecessor finishing must not skip its successors."""

    def __init__(self, nodes: dict[str, NodeRecord], held: set[str]) -> None:
        self._nodes = nodes
        self._held = held

    def __getitem__(self, key: str) -> NodeState:
        if key in self._held:
            return NodeState.RUNNING
        return self._nodes[key].state

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)
