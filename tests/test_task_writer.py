"""One writer of tasks (issue 15): only the engine writes the rows of tasks, their nodes and
edges; the API hands it a checked submission through the cluster and does not need to know which
replica leads (the cluster layer finds the engine)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASK_TABLES = {"Task", "Node", "Edge"}
WRITES = {"insert", "update", "delete", "add"}


def _task_writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WRITES
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in TASK_TABLES
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.attr}({node.args[0].id}, ...)")
    return found


def test_only_the_engine_writes_task_node_and_edge_rows() -> None:
    outside = [p for p in sorted((ROOT / "orchestrator").rglob("*.py")) if p.parent.name not in ("engine", "store")]
    assert len(outside) > 40  # the walk really covers the API, planner, gateway, cluster, ...
    assert [w for p in outside for w in _task_writes(p)] == []
    engine = [w for p in sorted((ROOT / "orchestrator" / "engine").glob("*.py")) for w in _task_writes(p)]
    assert any("insert(Task" in w for w in engine)  # the check sees writes where they are


def test_the_api_does_not_ask_who_leads_to_submit_a_task() -> None:
    for name in ("submission.py", "tasks.py"):
        source = (ROOT / "orchestrator" / "api" / name).read_text()
        assert "is_leader" not in source, name
