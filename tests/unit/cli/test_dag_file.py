"""DAG files as the CLI reads them: YAML `on:` keys stay strings, syntax errors name file:line:column."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from orchestrator.api.schemas import TaskCreate
from orchestrator.dagfile import DagFileError, load_dag_file, parse_dag_text
from tests.support import ROOT

# The README's example DAG (README.md, "A task"), verbatim as it stood when issue 13 was filed.
README_DAG = """\
# dag.yaml — orrery submit dag.yaml --watch
name: uname-everywhere
nodes:
  - id: web
    placement: {labels: {role: web}}
    commands:
      - {tool: shell.run, arguments: {argv: [uname, -a]}, timeout_s: 30}
    retry: {max_attempts: 3, backoff_s: 1}     # only when retry-safe (read-only/idempotent tools)
  - id: save
    placement: {device: analysis}
    commands:
      - {tool: files.write, arguments: {path: uname.txt, content: "${nodes.web.output.stdout}"}}
  - id: tidy
    kind: agent                                  # an LLM drives the device's tools (needs an LLM)
    instruction: "Delete temporary files older than a day in the workspace, then report what went."
edges:
  - {from: web, to: save}          # on: success (default) | failure | always
  - {from: save, to: tidy, on: always}
"""


def _keys(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [*value, *(k for v in value.values() for k in _keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


def test_the_readme_example_keeps_its_unquoted_on_key_and_is_a_valid_submission() -> None:
    data = parse_dag_text(README_DAG, "dag.yaml")
    assert data["edges"][1] == {"from": "save", "to": "tidy", "on": "always"}
    assert all(isinstance(k, str) for k in _keys(data))
    TaskCreate.model_validate({"name": data["name"], "dag": {"nodes": data["nodes"], "edges": data["edges"]}})


def test_every_yaml_dag_in_the_readme_parses_without_boolean_keys() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    dags = [b for b in blocks if "nodes:" in b]
    assert dags, "README.md has no YAML DAG example"
    for block in dags:
        data = parse_dag_text(block, "README.md")
        assert all(isinstance(k, str) for k in _keys(data)), block
        for edge in data.get("edges") or []:
            assert edge.get("on", "success") in ("success", "failure", "always"), edge


def test_yes_no_on_off_stay_strings_and_true_false_stay_booleans() -> None:
    data = parse_dag_text("a: [yes, no, on, off, Yes, OFF, y, n]\nb: true\nc: False\nd: 3\ne: null\n", "x.yaml")
    assert data == {"a": ["yes", "no", "on", "off", "Yes", "OFF", "y", "n"], "b": True, "c": False, "d": 3, "e": None}


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("dag.yaml", "nodes:\n  - id: a\n   x: [1\n", "dag.yaml:3:4: invalid YAML"),
        ("dag.yaml", "nodes: [a, b\nedges: []\n", "dag.yaml:2:6: invalid YAML"),
        ("dag.yaml", "nodes:\n\t- id: a\n", "dag.yaml:2:1: invalid YAML"),
        ("dag.json", '{"nodes": [1,}', "dag.json:1:14: invalid JSON"),
    ],
)
def test_a_syntax_error_names_file_line_and_column_in_one_line(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DagFileError) as info:
        load_dag_file(path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / where.split(':', maxsplit=1)[0]}:"), message
    assert where.split(":", 1)[1] in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda p: None, "no such file"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: p.write_bytes(b"\xff\xfe\x00bad"), "not UTF-8 text"),
        (lambda p: p.write_text("- just\n- a list\n"), "must hold an object with 'nodes'"),
        (lambda p: p.write_text(""), "must hold an object with 'nodes'"),
    ],
)
def test_unreadable_or_shapeless_files_are_one_line_errors(tmp_path: Path, setup: Any, expected: str) -> None:
    path = tmp_path / "dag.yaml"
    setup(path)
    with pytest.raises(DagFileError, match=expected) as info:
        load_dag_file(path)
    assert "\n" not in str(info.value)
