"""CLI commands over server features built on other branches of issue 13 (see /work/briefs/contracts.md):
`validate` (dry_run), submission warnings, `tasks rerun`, `devices label`, `devices rotate-token`,
`devices history`, ids by prefix and name. These fail until those server branches are merged."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support import Fleet, run_cli


def orrery(fleet: Fleet, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli(fleet, *args, timeout=timeout)


def _task_names(fleet: Fleet) -> list[str]:
    with fleet.server.client() as c:
        return [t["name"] for t in c.get("/v1/tasks", params={"limit": 500}).json()["items"]]


def test_validate_shows_placement_and_creates_nothing(shared_fleet: Fleet, tmp_path: Path) -> None:
    shared_fleet.agent("ne-valid-box", {"role": "ne-valid"})
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "name: ne-validate-ok\n"
        "nodes:\n"
        "  - id: a\n"
        "    placement: {labels: {role: ne-valid}}\n"
        "    commands: [{tool: system.echo, arguments: {text: hi}}]\n"
        "edges: []\n"
    )
    result = orrery(shared_fleet, "validate", str(dag))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node a: would run on ne-valid-box" in result.stdout
    assert "valid" in result.stdout.splitlines()[-1]
    answer = json.loads(orrery(shared_fleet, "validate", str(dag), "--json").stdout)
    assert answer["valid"] is True and answer["nodes"][0]["would_run_on"] == "ne-valid-box"
    assert "ne-validate-ok" not in _task_names(shared_fleet)


def test_validate_names_argument_errors_and_exits_1(shared_fleet: Fleet, tmp_path: Path) -> None:
    shared_fleet.agent("ne-invalid-box", {"role": "ne-invalid"})
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "name: ne-validate-bad\n"
        "nodes:\n"
        "  - id: a\n"
        "    placement: {labels: {role: ne-invalid}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: not-a-list}}]\n"
        "edges: []\n"
    )
    result = orrery(shared_fleet, "validate", str(dag))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error invalid_arguments node a command 0 field argv" in result.stdout
    assert "not valid" in result.stdout
    assert "Traceback" not in result.stderr
    assert "ne-validate-bad" not in _task_names(shared_fleet)


def test_submit_prints_retry_not_safe_warnings_on_stderr(shared_fleet: Fleet, tmp_path: Path) -> None:
    shared_fleet.agent("ne-warn-box", {"role": "ne-warn"})
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "name: ne-warn\n"
        "nodes:\n"
        "  - id: web\n"
        "    placement: {labels: {role: ne-warn}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [uname, -a]}}]\n"
        "    retry: {max_attempts: 3}\n"
    )
    result = orrery(shared_fleet, "submit", str(dag))
    assert result.returncode == 0, result.stderr
    assert "warning retry_not_safe node web:" in result.stderr
    assert "task task_" in result.stdout


def test_tasks_rerun_from_a_node_and_whole(shared_fleet: Fleet) -> None:
    shared_fleet.agent("ne-rerun-box", {"role": "ne-rerun"})
    echo = {"tool": "system.echo", "arguments": {"text": "x"}}
    placement = {"labels": {"role": "ne-rerun"}}
    task = shared_fleet.submit(
        {
            "nodes": [
                {"id": "first", "placement": placement, "commands": [echo]},
                {"id": "second", "placement": placement, "commands": [echo]},
            ],
            "edges": [{"from": "first", "to": "second"}],
        },
        name="ne-rerun",
    )
    assert shared_fleet.wait_task(task["id"])["state"] == "succeeded"
    partial = orrery(shared_fleet, "tasks", "rerun", task["id"], "--from", "second", "--json")
    assert partial.returncode == 0, partial.stderr
    new = json.loads(partial.stdout)
    assert new["rerun_of"] == task["id"] and new["id"] != task["id"]
    assert shared_fleet.wait_task(new["id"])["state"] == "succeeded"

    whole = orrery(shared_fleet, "tasks", "rerun", task["id"][:12], "--watch")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert "succeeded" in whole.stdout


def test_devices_label_rotate_token_and_history_by_name(shared_fleet: Fleet) -> None:
    enrolled = shared_fleet.enroll("ne-admin-box", {"role": "ne-admin", "gone": "soon"})
    labelled = orrery(shared_fleet, "devices", "label", "ne-admin-box", "zone=b", "gone-", "--json")
    assert labelled.returncode == 0, labelled.stderr
    assert json.loads(labelled.stdout)["labels"] == {"role": "ne-admin", "zone": "b"}
    human = orrery(shared_fleet, "devices", "label", enrolled["id"][:10], "zone=c")
    assert human.returncode == 0 and "zone=c" in human.stdout

    rotated = orrery(shared_fleet, "devices", "rotate-token", "ne-admin-box", "--json")
    assert rotated.returncode == 0, rotated.stderr
    answer = json.loads(rotated.stdout)
    assert answer["id"] == enrolled["id"] and answer["token"].startswith("orrd_")
    assert answer["token"] != enrolled["token"]

    assert orrery(shared_fleet, "devices", "cordon", "ne-admin-box").returncode == 0
    history = orrery(shared_fleet, "devices", "history", "ne-admin-box", "--json")
    assert history.returncode == 0, history.stderr
    # A device that never connected still shows `enrolled`; the entry says what the operator did.
    newest = json.loads(history.stdout)[0]
    assert (newest["state"], newest["reason"]) == ("enrolled", "cordoned by an operator")
    table = orrery(shared_fleet, "devices", "history", "ne-admin-box")
    assert table.returncode == 0 and "cordoned by an operator" in table.stdout


def test_ids_by_prefix_and_name(shared_fleet: Fleet) -> None:
    agent = shared_fleet.agent("ne-prefix-box", {"role": "ne-prefix"})
    shown = orrery(shared_fleet, "devices", "show", "ne-prefix-box")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == agent.device_id
    task = shared_fleet.submit(
        {
            "nodes": [
                {
                    "id": "a",
                    "placement": {"labels": {"role": "ne-prefix"}},
                    "commands": [{"tool": "system.echo", "arguments": {"text": "p"}}],
                }
            ],
            "edges": [],
        },
        name="ne-prefix-task",
    )
    shared_fleet.wait_task(task["id"])
    by_prefix = orrery(shared_fleet, "tasks", "show", task["id"][:12], "--json")
    assert by_prefix.returncode == 0, by_prefix.stderr
    assert json.loads(by_prefix.stdout)["id"] == task["id"]
    by_name = orrery(shared_fleet, "tasks", "watch", "ne-prefix-task")
    assert by_name.returncode == 0, by_name.stdout + by_name.stderr
