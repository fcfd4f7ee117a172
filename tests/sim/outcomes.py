"""Invariants of fan-out nodes and verified outcomes (issue 20), checked on the store's rows at the
end of a simulated run, independently of the domain code that made them: how a fan-out node
ends follows from its children's states and options; canaries went first and max_parallel was
kept (from the attempts' times); a node that succeeded with `verify` passed it after its last
attempt; nothing ran before the edges into it were decided."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.domain.model import NodeSpec
from orchestrator.store.models import Attempt, Node, NodeChild

Fail = Callable[[str], None]
TERMINAL = ("succeeded", "failed", "skipped", "cancelled")
UNKNOWN = ("uncertain", "device_lost")


def check_fan_out(
    fail: Fail, where: str, node: Node, kids: list[NodeChild], attempts: list[Attempt], skew_s: float = 0.0
) -> None:
    """How a fan-out node ended follows from its children; canaries went first and max_parallel
    was kept (attempts' times compared within `skew_s`: each is stamped by its leader's clock)."""
    spec = NodeSpec.model_validate(node.spec)
    fan = spec.for_each
    assert fan is not None
    kids = sorted(kids, key=lambda c: c.position)
    devices = {c.device_id for c in kids}
    for a in attempts:
        if a.device_id not in devices:
            fail(f"{where} ran on {a.device_id}, which is none of its children's devices")
    for c in kids:
        if c.state not in TERMINAL:
            fail(f"{where} child {c.device_name} is {c.state} in a finished task")
    failed = sum(c.state == "failed" for c in kids)
    canary = min(fan.canary, len(kids))
    halted = any(c.state == "failed" for c in kids[:canary]) or (
        fan.failure_budget is not None and failed >= fan.failure_budget
    )
    if any(c.state == "skipped" for c in kids) and not halted:
        fail(f"{where} skipped children although its rollout never halted")
    _check_ending(fail, where, node, kids, failed, halted, fan.failure_budget, canary)
    _check_canaries(fail, where, kids, attempts, canary, skew_s)
    if fan.max_parallel is not None:
        _check_parallel(fail, where, kids, attempts, fan.max_parallel, skew_s)


def _check_ending(
    fail: Fail,
    where: str,
    node: Node,
    kids: list[NodeChild],
    failed: int,
    halted: bool,
    budget: int | None,
    canary: int,
) -> None:
    code = (node.error or {}).get("code")
    succeeded = sum(c.state == "succeeded" for c in kids)
    if node.state == "succeeded":
        if halted or (failed and budget is None) or not succeeded:
            fail(f"{where} succeeded with {failed} failed and {succeeded} succeeded children (budget {budget})")
        wanted = {c.device_name for c in kids if c.state == "succeeded"}
        if set(node.output or {}) != wanted:
            fail(f"{where} output has keys {sorted(node.output or {})}, its succeeded children are {sorted(wanted)}")
    elif node.state == "failed":
        expected = {
            "no_matching_device": not kids,
            "canary_failed": any(c.state == "failed" for c in kids[:canary]),
            "failure_budget_exhausted": budget is not None and failed >= budget,
            "fan_out_failed": bool(failed) and (budget is None or not succeeded) and not halted,
        }
        if not expected.get(str(code), False):
            fail(f"{where} failed {code}, which its children ({failed} failed, budget {budget}) do not explain")
    elif node.state == "skipped" and kids:
        fail(f"{where} was skipped but has children")


def _check_canaries(
    fail: Fail, where: str, kids: list[NodeChild], attempts: list[Attempt], canary: int, skew_s: float
) -> None:
    if not canary or len(kids) <= canary:
        return
    first = kids[:canary]
    later = {c.device_id for c in kids[canary:]}
    started = [a.started_at for a in attempts if a.device_id in later]
    if not started:
        return
    if not all(c.state == "succeeded" for c in first):
        fail(f"{where} ran a child past its canaries although a canary did not succeed")
        return
    done = max(c.finished_at for c in first if c.finished_at is not None)
    if min(started).timestamp() < done.timestamp() - skew_s:
        fail(f"{where} started a child past its canaries before they had all succeeded")


def _check_parallel(
    fail: Fail, where: str, kids: list[NodeChild], attempts: list[Attempt], most: int, skew_s: float
) -> None:
    """At each child's start, the children surely running then (by times within `skew_s`)."""
    spans = []
    for c in kids:
        own = [a for a in attempts if a.device_id == c.device_id and a.ended_at is not None]
        if own:
            ended = max(a.ended_at for a in own if a.ended_at is not None)
            spans.append((min(a.started_at for a in own).timestamp(), ended.timestamp()))
    for i, (start, _) in enumerate(spans):
        running = sum(
            1 for j, (s, e) in enumerate(spans) if (start < e if j == i else s + skew_s <= start and start + skew_s < e)
        )
        if running > most:
            fail(f"{where} had {running} children running at once, above max_parallel {most}")


def check_verified(
    fail: Fail, where: str, state: str, spec: NodeSpec, attempts: list[Attempt], skew_s: float = 0.0
) -> None:
    """A node (or fan-out child) with `verify` that succeeded passed its verify commands after its
    last attempt ended, which had succeeded or ended with its outcome unknown (times compared
    within `skew_s`, how far one leader's clock may be behind another's)."""
    if not spec.verify:
        if any(a.kind == "verify" for a in attempts):
            fail(f"{where} ran verify commands it does not have")
        return
    if state != "succeeded":
        return
    # By attempt number: start times are stamped by each leader's clock, and one may be behind
    # another's (a failover can make a later attempt look earlier by its time).
    main = sorted((a for a in attempts if a.kind not in ("verify", "step")), key=lambda a: (a.n, a.started_at))
    if not main:
        fail(f"{where} succeeded without an attempt")
        return
    last = main[-1]
    code = (last.error or {}).get("code")
    if last.status != "succeeded" and code not in UNKNOWN:
        fail(f"{where} succeeded after an attempt that failed {code}")
    passed = [
        a
        for a in attempts
        if a.kind == "verify"
        and a.status == "succeeded"
        and last.ended_at
        and a.started_at.timestamp() >= last.ended_at.timestamp() - skew_s
    ]
    if not passed:
        fail(f"{where} succeeded without passing its verify commands after its last attempt")


def check_edge_times(
    fail: Fail,
    task_id: str,
    nodes: dict[str, Node],
    edges: list[Any],
    attempts: list[Attempt],
    skew_s: float = 0.0,
) -> None:
    """Nothing ran before every edge into it was decided (its sources had finished). The times
    are the leaders' clocks: with one behind by up to `skew_s`, two stamped by different leaders
    are compared within that much."""
    first: dict[str, Any] = {}
    for a in attempts:
        if a.node_id not in first or a.started_at < first[a.node_id]:
            first[a.node_id] = a.started_at
    for e in edges:
        began, source = first.get(e.target), nodes.get(e.source)
        if began is None or source is None:
            continue
        if source.finished_at is None or began.timestamp() < source.finished_at.timestamp() - skew_s:
            fail(f"{task_id}/{e.target} started before {e.source}, an edge into it, had finished")


def coverage(nodes: Iterable[Node], children: Iterable[NodeChild]) -> Counter[str]:
    """What a run exercised of fan-out and verify: how fan-out nodes ended (by code), how
    children ended, and how verifications were decided (and after what), for the sweep's checks
    that its DAGs reach every path."""
    seen: Counter[str] = Counter()
    for n in nodes:
        if n.spec.get("for_each") is not None:
            seen[f"fan_out {n.state} {(n.error or {}).get('code')}"] += 1
    for row in [*nodes, *children]:
        v = row.verification
        if v:
            seen[f"verify {v.get('state')} after {v.get('after')}"] += 1
    for c in children:
        seen[f"child {c.state}"] += 1
    return seen
