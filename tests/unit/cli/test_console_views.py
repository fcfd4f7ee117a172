"""Terminal views of the CLI: ids are never cut off, tools are summarised from their schemas."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from orchestrator.console import devices_table, print_table, schema_summary, task_view, tasks_table, tool_rows


def _device(i: int) -> dict[str, Any]:
    return {
        "id": f"dev_{i:020x}",
        "name": f"a-rather-long-device-name-{i}",
        "state": "idle",
        "platform": "linux",
        "labels": {"role": "web", "zone": "eu-west-1", "rack": f"r{i}", "owner": "team-observability"},
        "current_batch": f"batch_{i:020x}",
        "queue_length": 0,
        "last_seen": "2025-01-01T00:00:00+00:00",
    }


def _render(table: Any, width: int, terminal: bool) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=terminal, color_system=None)
    print_table(console, table)
    return out.getvalue()


def test_device_and_task_ids_are_whole_on_a_narrow_terminal_and_in_a_pipe() -> None:
    devices = [_device(i) for i in range(3)]
    tasks = [
        {"id": f"task_{i:020x}", "name": "n" * 40, "state": "succeeded", "node_counts": {"succeeded": 2}}
        for i in range(3)
    ]
    for terminal in (True, False):
        shown = _render(devices_table(devices), 80, terminal)
        for d in devices:
            assert d["id"] in shown
            if not terminal:  # on a narrow terminal long names may fold onto a second line
                assert d["name"] in shown and d["current_batch"] in shown
        shown = _render(tasks_table(tasks), 80, terminal)
        for t in tasks:
            assert t["id"] in shown
    piped = _render(devices_table(devices), 80, terminal=False)
    rows = [line for line in piped.splitlines() if "dev_" in line]
    assert len(rows) == 3  # one line per device when piped: grep and cut work
    assert all("…" not in line for line in piped.splitlines())


def test_tool_rows_union_devices_and_say_whether_a_retry_is_safe() -> None:
    shell = {
        "name": "shell.run",
        "description": "Run a program.\n\nMore.",
        "input_schema": {
            "type": "object",
            "properties": {"argv": {"type": "array", "items": {"type": "string"}}, "cwd": {"type": ["string", "null"]}},
            "required": ["argv"],
        },
        "annotations": {"read_only": False, "idempotent": False},
    }
    read = {"name": "files.read", "input_schema": {}, "annotations": {"read_only": True}}
    rows = tool_rows(
        [{"name": "a", "tools": [shell, read]}, {"name": "b", "tools": [shell]}, {"name": "c", "tools": []}]
    )
    assert [(r["name"], r["retry_safe"], r["devices"]) for r in rows] == [
        ("files.read", True, ["a"]),
        ("shell.run", False, ["a", "b"]),
    ]
    assert rows[1]["arguments"] == "argv: array[string], cwd?: string|null"
    assert schema_summary({}) == "(none)"
    assert schema_summary({"properties": {"mode": {"enum": ["a", "b"]}}}) == 'mode?: "a"|"b"'


def test_task_view_names_the_device_and_counts_attempts() -> None:
    task = {
        "id": "task_1",
        "name": "t",
        "state": "failed",
        "nodes": [
            {
                "id": "web",
                "state": "failed",
                "retry": {"max_attempts": 3},
                "attempts": [{"device_id": "dev_1"}, {"device_id": "dev_2"}],
                "error": {"code": "tool_error", "message": "boom [index]", "not_retried": "not retried: x"},
            }
        ],
        "edges": [],
    }
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(task_view(task, names={"dev_2": "web-2"}))
    text = out.getvalue()
    assert "web-2" in text and "dev_2" not in text
    assert "attempt 2/3" in text
    assert "boom [index]" in text and "not retried: x" in text


def test_outputs_show_text_as_written_not_as_json_escapes() -> None:
    """An output that is not plain stdout is shown as JSON, with its non-ASCII text as the tool
    wrote it (a user reading "h\\u00e9llo" has to decode it)."""
    from orchestrator.console import outputs_view

    task = {"nodes": [{"id": "b", "output": {"text": "héllo ✓"}, "error": None}]}
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(outputs_view(task))
    assert '"text": "héllo ✓"' in out.getvalue() and "\\u00e9" not in out.getvalue()
