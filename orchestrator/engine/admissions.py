"""The engine's one door for new tasks: a submission is admitted once, however often it is asked
(a lost answer between replicas, a failover, an Idempotency-Key used twice), and its rows go into
the step's writes; the engine then starts it (the engine is the one writer of tasks)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from orchestrator.engine.intake import Admission, Submission
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store.models import Edge, Node, Task

ADMITTED_KEPT = 10_000  # submissions remembered in memory (older ones are found in the store)


class AdmittedLookup(Protocol):
    async def find_admitted(self, task_id: str, key: str | None) -> Task | None: ...


class Admissions:
    """Admits submissions and remembers the latest ones."""

    def __init__(self, store: AdmittedLookup, writer: StepWriter) -> None:
        self.store = store
        self.writer = writer
        # Lately admitted, by "id:<task id>" and "key:<Idempotency-Key>": a submission asked again,
        # or a key reused, in the same step as the first sees it before the store does.
        self._admitted: OrderedDict[str, Admission] = OrderedDict()

    async def admit(self, sub: Submission, asked_before: bool, now: float) -> tuple[Admission, bool]:
        """The answer, and whether the task is new (its rows are now in this step's writes).

        The store is asked only when it may already hold the task: the submission may have been
        asked before (through another replica), or its Idempotency-Key may have been used."""
        marks = [f"id:{sub.task_id}"] + ([f"key:{sub.idempotency_key}"] if sub.idempotency_key else [])
        for mark in marks:
            if (earlier := self._admitted.get(mark)) is not None:
                return {**earlier, "created": earlier["task_id"] == sub.task_id}, False
        if asked_before or sub.idempotency_key:
            row = await self.store.find_admitted(sub.task_id, sub.idempotency_key)
            if row is not None:
                return {"task_id": row.id, "created": row.id == sub.task_id, "body_hash": row.body_hash or ""}, False
        admitted: Admission = {"task_id": sub.task_id, "created": True, "body_hash": sub.body_hash or ""}
        for mark in marks:
            self._admitted[mark] = admitted
        while len(self._admitted) > ADMITTED_KEPT:
            self._admitted.popitem(last=False)
        self.writer.insert(Task, sub.task_row())
        nodes, edges = sub.graph_rows()
        for node in nodes:
            self.writer.insert(Node, node)
        for edge in edges:
            self.writer.insert(Edge, edge)
        self.writer.event(EventType.TASK_STATE, sub.task_id, None, now, state=sub.state.value)
        return admitted, True
