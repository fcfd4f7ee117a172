"""The answer to a submission comes from the rows handed to the engine, and says what the same
rows read back as stored objects would; the NUL scan skips a DAG that has none."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

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
    """`task_json` skips the models and FastAPI's dump, validate and serialize; the bytes must be
    the ones FastAPI sends for the model under `response_model` (aliases such as an edge's
    `from`/`to`, defaults, non-ASCII text, warnings), so a FastAPI upgrade that changes them fails here."""
    from fastapi import FastAPI, Response
    from fastapi.testclient import TestClient

    from orchestrator.api.render import task_json
    from orchestrator.api.schemas import TaskOut, WarningOut

    sub = submission()
    nodes, edges = sub.graph_rows()
    warning = {"code": "retry_not_safe", "message": "é", "node_id": "a"}
    out = task_detail(NewTask(sub.task_row(), nodes, edges))
    out.warnings = [WarningOut.model_validate(warning)]
    app = FastAPI()

    @app.get("/model", response_model=TaskOut)
    async def as_model() -> TaskOut:
        return out

    @app.get("/one-pass", response_model=TaskOut)
    async def one_pass() -> Any:
        shown = [WarningOut.model_validate(warning).model_dump()]
        return Response(task_json(NewTask(sub.task_row(), nodes, edges), shown), 201, media_type="application/json")

    with TestClient(app) as client:
        rendered, ours = client.get("/model"), client.get("/one-pass")
    assert ours.status_code == 201 and ours.headers["content-type"] == rendered.headers["content-type"]
    assert b'"from":"a"' in ours.content and "é".encode() in ours.content
    assert ours.content == rendered.content


def _rows(output: Any, timeout_s: Any = 5, micro: int = 0) -> Any:
    """A finished task as the store's plain rows: a node with two attempts, one still open."""
    from orchestrator.store.repo import TaskRows

    at = datetime(2026, 12, 2, 5, 40, 1, micro, tzinfo=UTC)
    spec = {"commands": [{"tool": "shell.run", "arguments": {"argv": ["ls"]}}], "retry": {"max_attempts": 2}}
    attempt = {"node_id": "a", "device_id": "dev_1", "batch_id": "b1", "status": "failure", "started_at": at}
    return TaskRows(
        task={
            "id": "task_1",
            "name": "t",
            "state": "failed",
            "priority": 0,
            "labels": None,
            "request": None,
            "created_at": at,
            "finished_at": at,
            "error": {"code": "node_failed", "message": "a\n\x01"},
            "dag_version": None,
            "rerun_of": None,
        },
        nodes=[
            {
                "id": "a",
                "kind": "tool",
                "state": "failed",
                "spec": {**spec, "timeout_s": timeout_s},
                "queued_on": None,
                "output": output,
                "error": {"code": "tool_error"},
                "started_at": at,
                "finished_at": at,
            },
            {
                "id": "b",
                "kind": "agent",
                "state": "skipped",
                "spec": {"instruction": "ünï", "queue_timeout_s": 2.5, "priority": 3},
                "queued_on": "dev_1",
                "output": None,
                "error": None,
                "started_at": None,
                "finished_at": None,
            },
        ],
        edges=[{"source": "a", "target": "b", "on": "success"}],
        attempts=[
            {
                **attempt,
                "n": 1,
                "accepted_at": at,
                "ended_at": at,
                "commands": [{"call_id": "c1"}],
                "results": [{"status": "failure", "duration_ms": 1.5}],
                "error": {"code": "tool_error"},
            },
            {
                **attempt,
                "n": 2,
                "accepted_at": None,
                "ended_at": None,
                "commands": None,
                "results": None,
                "error": None,
            },
        ],
    )


@pytest.mark.parametrize(
    ("output", "timeout_s", "micro"),
    [
        ({"stdout": 'é\u2028\x1f"q"', "exit_code": 0, "ratio": 0.1, "big": 1e22, "tiny": 5e-324}, 5, 0),
        ([1, [2, {"x": None}], True, False, -(2**63)], 7.5, 123456),
        ("plain", None, 500000),
        (float("nan"), 30, 1),
    ],
)
def test_a_task_read_without_the_models_is_the_bytes_the_models_give(
    output: Any, timeout_s: Any, micro: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same bytes as `task_detail(...).model_dump_json(by_alias=True)`: field order, UTC
    datetimes with and without a fraction, an int timeout shown as a float, defaults for what a row
    leaves empty (labels, dag_version, an attempt's commands), control characters and NaN in
    output. And rendered without them: the models' path is not taken."""
    from orchestrator.api import render

    rows = _rows(output, timeout_s, micro)
    expected = render.task_detail(rows).model_dump_json(by_alias=True).encode()

    def no_models(_bundle: Any) -> Any:
        raise AssertionError("rendered through the models")

    monkeypatch.setattr(render, "task_detail", no_models)
    assert render.task_json(rows) == expected


def test_what_the_plain_rendering_cannot_reproduce_is_rendered_through_the_models(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An int over 64 bits (orjson refuses it) and a type a row does not normally hold (a float
    priority, which the model turns into an int) still answer, with the models' bytes."""
    from orchestrator.api import render

    calls: list[Any] = []
    real = render.task_detail

    def counted(bundle: Any) -> Any:
        calls.append(bundle)
        return real(bundle)

    monkeypatch.setattr(render, "task_detail", counted)
    huge = _rows({"n": 2**64 + 1})
    assert render.task_json(huge) == real(huge).model_dump_json(by_alias=True).encode()
    assert b"18446744073709551617" in render.task_json(huge)
    odd = _rows(None)
    odd.nodes[1]["spec"]["priority"] = 3.0
    assert render.task_json(odd) == real(odd).model_dump_json(by_alias=True).encode()
    assert len(calls) == 3
