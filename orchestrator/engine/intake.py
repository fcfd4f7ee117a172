"""A new task on its way in: checked by the API, given its id, and not stored yet.

The engine is the one writer of tasks: the API validates a submission against the fleet
and hands it over as a `Submission`; the engine leader inserts its rows in the commit of the step
that starts it, so a task is never in the store without the engine knowing it, and no replica but
the leader writes task rows. A submission is plain data: it crosses replicas as JSON (`as_json`,
`from_json`) when the API and the engine leader are on different replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

from orchestrator.domain.model import DagSpec, NodeState, TaskState
from orchestrator.domain.run import TaskRun
from orchestrator.engine.times import utc
from orchestrator.store.rows import node_rows


@dataclass(frozen=True)
class KeptNode:
    """A node a re-run keeps as it ended in the task it re-runs (SPEC section 3, re-runs)."""

    state: str
    output: Any = None
    results: list[Any] | None = None
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class Submission:
    task_id: str
    name: str
    body_hash: str | None  # None when no Idempotency-Key came with it (nothing to compare)
    created: float  # when the API accepted it (the task's created_at and started_at)
    spec: DagSpec | None  # None: planned from `request` by the LLM planner
    request: str | None = None
    priority: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    replan: bool = False
    idempotency_key: str | None = None
    rerun_of: str | None = None
    kept: dict[str, KeptNode] = field(default_factory=dict)

    @property
    def state(self) -> TaskState:
        return TaskState.RUNNING if self.spec is not None else TaskState.PLANNING

    def task_row(self) -> dict[str, Any]:
        return {
            "id": self.task_id,
            "name": self.name,
            "state": self.state.value,
            "priority": self.priority,
            "labels": self.labels,
            "request": self.request,
            "replan": self.replan,
            "idempotency_key": self.idempotency_key,
            "body_hash": self.body_hash,
            "created_at": utc(self.created),
            "started_at": utc(self.created),
            "rerun_of": self.rerun_of,
        }

    def graph_rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Node rows (kept nodes of a re-run as they ended) and edge rows."""
        if self.spec is None:
            return [], []
        nodes, edges = node_rows(self.task_id, self.spec)
        if self.rerun_of is not None:
            fresh = KeptNode(state=NodeState.PENDING.value)
            for row in nodes:  # every row has the same keys (one executemany)
                kept = self.kept.get(row["id"], fresh)
                row.update(
                    state=kept.state,
                    output=kept.output,
                    results=kept.results,
                    error=kept.error,
                    started_at=kept.started_at,
                    finished_at=kept.finished_at,
                )
        return nodes, edges

    def run(self) -> TaskRun:
        """The engine's runtime record of an explicit DAG (kept nodes as they ended)."""
        assert self.spec is not None, "a planned task has no graph until its plan arrives"
        run = TaskRun(self.task_id, self.spec.nodes, self.spec.edges, priority=self.priority)
        run.replan = self.replan
        run.request = self.request
        if self.kept:
            for node_id, kept in self.kept.items():
                rec = run.nodes[node_id]
                rec.state = NodeState(kept.state)
                rec.output, rec.results, rec.error = kept.output, list(kept.results or []), kept.error
            run.recount()
        return run

    # ---------------------------------------------------------------- across replicas

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "name": self.name,
            "body_hash": self.body_hash,
            "created": self.created,
            "spec": self.spec.model_dump(mode="json", by_alias=True) if self.spec is not None else None,
            "request": self.request,
            "priority": self.priority,
            "labels": self.labels,
            "replan": self.replan,
            "idempotency_key": self.idempotency_key,
            "rerun_of": self.rerun_of,
            "kept": {
                node_id: {
                    "state": k.state,
                    "output": k.output,
                    "results": k.results,
                    "error": k.error,
                    "started_at": k.started_at.isoformat() if k.started_at else None,
                    "finished_at": k.finished_at.isoformat() if k.finished_at else None,
                }
                for node_id, k in self.kept.items()
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Submission:
        spec = data.get("spec")
        return cls(
            task_id=str(data["task_id"]),
            name=str(data["name"]),
            body_hash=data.get("body_hash"),
            created=float(data["created"]),
            spec=DagSpec.model_validate(spec) if spec is not None else None,
            request=data.get("request"),
            priority=int(data.get("priority") or 0),
            labels=dict(data.get("labels") or {}),
            replan=bool(data.get("replan")),
            idempotency_key=data.get("idempotency_key"),
            rerun_of=data.get("rerun_of"),
            kept={
                node_id: KeptNode(
                    state=str(k["state"]),
                    output=k.get("output"),
                    results=k.get("results"),
                    error=k.get("error"),
                    started_at=_when(k.get("started_at")),
                    finished_at=_when(k.get("finished_at")),
                )
                for node_id, k in (data.get("kept") or {}).items()
            },
        )


class Admission(TypedDict):
    """The engine's answer to a submission: the task it made now (`created`), or the one an earlier
    submission with the same id or Idempotency-Key made (with that one's body hash, so the API can
    tell a retry from a conflicting reuse of the key)."""

    task_id: str
    created: bool
    body_hash: str


def _when(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None
