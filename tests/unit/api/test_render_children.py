"""A fan-out node's children in the task view (issue 20): each child carries its node's attempts
on its device (the node itself none), and the plain rendering writes the bytes the models do."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from orchestrator.api import render
from orchestrator.store.repo import TaskRows

AT = datetime(2026, 12, 2, 5, 40, 1, 250, tzinfo=UTC)


def _attempt(device: str, batch: str, kind: str = "tool", status: str = "succeeded") -> dict[str, Any]:
    return {
        "kind": kind,
        "node_id": "x",
        "n": 1,
        "device_id": device,
        "batch_id": batch,
        "status": status,
        "started_at": AT,
        "accepted_at": AT,
        "ended_at": AT,
        "commands": [{"call_id": "c1"}],
        "results": [{"status": "success", "result": {"ok": True}}],
        "error": None,
    }


def _rows() -> TaskRows:
    spec = {
        "for_each": {"labels": {"role": "web"}, "canary": 1},
        "commands": [{"tool": "shell.run", "arguments": {"argv": ["true"]}}],
        "verify": [{"tool": "files.read", "arguments": {"path": "marker"}}],
    }
    child = {"node_id": "x", "queued_on": None, "started_at": AT, "error": None}
    return TaskRows(
        task={
            "id": "task_1",
            "name": "t",
            "state": "running",
            "priority": 0,
            "labels": {},
            "request": None,
            "created_at": AT,
            "finished_at": None,
            "error": None,
            "dag_version": 1,
            "rerun_of": None,
        },
        nodes=[
            {
                "id": "x",
                "kind": "tool",
                "state": "running",
                "spec": spec,
                "queued_on": None,
                "output": None,
                "error": None,
                "started_at": AT,
                "finished_at": None,
                "fan_out": {"devices": 2, "left_out": [{"device": "web-9", "reason": "it was cordoned"}]},
                "verification": None,
            }
        ],
        edges=[],
        attempts=[
            _attempt("dev_1", "b1"),
            _attempt("dev_1", "b2", "verify"),
            _attempt("dev_2", "b3", status="dispatched"),
        ],
        children=[
            {
                **child,
                "device_id": "dev_1",
                "device_name": "web-1.example.com",
                "state": "succeeded",
                "output": {"ok": True},
                "verification": {"state": "passed", "after": "success"},
                "finished_at": AT,
            },
            {
                **child,
                "device_id": "dev_2",
                "device_name": "web-2",
                "state": "running",
                "output": None,
                "verification": None,
                "finished_at": None,
            },
        ],
    )


def test_each_child_shows_its_own_attempts_and_the_fan_out_node_none() -> None:
    (node,) = render.task_detail(_rows()).nodes or []
    assert node.attempts == []
    assert node.children is not None
    assert [(c.device, c.state, [a.batch_id for a in c.attempts]) for c in node.children] == [
        ("web-1.example.com", "succeeded", ["b1", "b2"]),
        ("web-2", "running", ["b3"]),
    ]
    assert [a.kind for a in node.children[0].attempts] == ["tool", "verify"]
    assert node.fan_out == {"devices": 2, "left_out": [{"device": "web-9", "reason": "it was cordoned"}]}
    assert node.for_each == {"labels": {"role": "web"}, "canary": 1}


def test_a_task_with_children_read_without_the_models_is_the_bytes_the_models_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = _rows()
    expected = render.task_detail(rows).model_dump_json(by_alias=True).encode()

    def no_models(_bundle: Any) -> Any:
        raise AssertionError("rendered through the models")

    monkeypatch.setattr(render, "task_detail", no_models)
    fast = render.task_json(_rows())
    assert fast == expected
    assert orjson.loads(fast)["nodes"][0]["children"][1]["attempts"][0]["batch_id"] == "b3"
