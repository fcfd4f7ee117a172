"""The answer to a submission comes from the rows handed to the engine, and says what the same
rows read back as stored objects would; the NUL scan skips a DAG that has none."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from orchestrator.api.render import NewTask, task_detail
from orchestrator.api.submission import nul_problems
from orchestrator.domain.model import DagSpec
from orchestrator.engine.intake import KeptNode, Submission
from orchestrator.store.models import Edge, Node, Task
from orchestrator.store.repo import TaskBundle

DAG: dict[str, Any] = {
    "nodes": [
        {"id": "a", "commands": [{"tool": "shell.run", "arguments": {"argv": ["ls"]}}], "retry": {"max_attempts": 2}},
        {"id": "b", "commands": [{"tool": "files.read", "arguments": {"path": "é"}, "idempotent": True}]},
        {"id": "c", "kind": "agent", "instruction": "look", "placement": {"labels": {"gpu": "1"}}, "timeout_s": 5},
    ],
    "edges": [{"from": "a", "to": "b"}, {"from": "a", "to": "c", "on": "failure"}],
}


def submission(rerun_of: str | None = None, kept: dict[str, KeptNode] | None = None) -> Submission:
    return Submission(
        task_id="task_new",
        name="t",
        body_hash="h",
        created=time.time(),
        spec=DagSpec.model_validate(DAG),
        request="do it",
        priority=3,
        labels={"team": "x"},
        replan=False,
        idempotency_key="key",
        rerun_of=rerun_of,
        kept=kept or {},
    )


def as_stored(sub: Submission) -> TaskBundle:
    """The rows as objects, as the answer was built before (and as a read of the store gives them)."""
    nodes, edges = sub.graph_rows()
    return TaskBundle(
        Task(**sub.task_row()),
        [Node(**{"output": None, "results": None, "error": None, **n}) for n in nodes],
        [Edge(**e) for e in edges],
        [],
    )


def test_the_answer_from_the_rows_is_the_answer_from_the_stored_objects() -> None:
    sub = submission()
    nodes, edges = sub.graph_rows()
    fresh = task_detail(NewTask(sub.task_row(), nodes, edges))
    assert fresh.model_dump_json() == task_detail(as_stored(sub)).model_dump_json()
    assert fresh.node_counts == {"pending": 3}  # as the rows are written; the engine readies roots next
    assert [e.model_dump(by_alias=True) for e in fresh.edges or []] == [
        {"from": "a", "to": "b", "on": "success"},
        {"from": "a", "to": "c", "on": "failure"},
    ]


def test_a_rerun_answers_with_its_kept_nodes_as_they_ended() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    kept = {
        "a": KeptNode(state="succeeded", output={"stdout": "x"}, results=[{"ok": True}], started_at=at, finished_at=at)
    }
    sub = submission("task_old", kept)
    nodes, edges = sub.graph_rows()
    answer = task_detail(NewTask(sub.task_row(), nodes, edges))
    assert answer.model_dump_json() == task_detail(as_stored(sub)).model_dump_json()
    (a,) = [n for n in answer.nodes or [] if n.id == "a"]
    assert (a.state, a.output, a.finished_at) == ("succeeded", {"stdout": "x"}, at)
    assert answer.rerun_of == "task_old"


def test_a_nul_is_found_past_the_shortcut_and_its_escaped_text_is_no_nul() -> None:
    clean = DagSpec.model_validate({"nodes": [{"id": "a", "instruction": "write \\u0000 here", "kind": "agent"}]})
    assert nul_problems(clean) == []  # a backslash and 'u0000' is text, not a NUL
    dirty = DagSpec.model_validate(
        {"nodes": [{"id": "a", "instruction": "x", "kind": "agent", "placement": {"labels": {"k\x00": "v"}}}]}
    )
    (p,) = nul_problems(dirty)
    assert (p.code, p.extra) == ("validation_error", {"field": "dag.nodes.0.placement.labels.k\\u0000", "node_id": "a"})
    in_arguments = DagSpec.model_validate(
        {"nodes": [{"id": "a", "commands": [{"tool": "x.y", "arguments": {"p": "\x00"}}]}]}
    )
    assert nul_problems(in_arguments) == []  # left to the tool's schema


def test_a_task_answered_in_one_pass_is_the_answer_fastapi_renders_from_the_model() -> None:
    """`json_answer` skips FastAPI's dump, validate and serialize of a returned model; the bytes must
    be the ones FastAPI sends for that model under `response_model` (aliases such as an edge's
    `from`/`to`, defaults, non-ASCII text, warnings), so a FastAPI upgrade that changes them fails here."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from orchestrator.api.render import json_answer
    from orchestrator.api.schemas import TaskOut, WarningOut

    sub = submission()
    nodes, edges = sub.graph_rows()
    out = task_detail(NewTask(sub.task_row(), nodes, edges))
    out.warnings = [WarningOut.model_validate({"code": "retry_not_safe", "message": "é", "node_id": "a"})]
    app = FastAPI()

    @app.get("/model", response_model=TaskOut)
    async def as_model() -> TaskOut:
        return out

    @app.get("/one-pass", response_model=TaskOut)
    async def one_pass() -> Any:
        return json_answer(out, 201)

    with TestClient(app) as client:
        rendered, ours = client.get("/model"), client.get("/one-pass")
    assert ours.status_code == 201 and ours.headers["content-type"] == rendered.headers["content-type"]
    assert b'"from":"a"' in ours.content and "é".encode() in ours.content
    assert ours.content == rendered.content
