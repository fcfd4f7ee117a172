"""The client CLI over a real server, and `orrery demo` from start to finish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT, Fleet, child_env, run_cli


def orrery(fleet: Fleet, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_cli(fleet, *args, timeout=timeout)


def test_enroll_list_submit_yaml_watch_and_show(shared_fleet: Fleet, tmp_path: Path) -> None:
    enrolled = orrery(shared_fleet, "devices", "enroll", "cli-box", "--label", "role=cli", "--json")
    assert enrolled.returncode == 0, enrolled.stderr
    token = json.loads(enrolled.stdout)["token"]
    assert token.startswith("orrd_")
    shared_fleet.agent("cli-runner", {"role": "cli-runner"})
    listed = json.loads(orrery(shared_fleet, "devices", "list", "--json").stdout)
    assert {"cli-box", "cli-runner"} <= {d["name"] for d in listed}

    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "name: cli-yaml\n"
        "nodes:\n"
        "  - id: hello\n"
        "    placement: {labels: {role: cli-runner}}\n"
        "    commands:\n"
        "      - {tool: shell.run, arguments: {argv: [echo, from-yaml]}}\n"
        "edges: []\n"
    )
    watched = orrery(shared_fleet, "submit", str(dag), "--watch")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert "succeeded" in watched.stdout and "from-yaml" in watched.stdout

    tasks = json.loads(orrery(shared_fleet, "tasks", "list", "--json").stdout)
    task = next(t for t in tasks if t["name"] == "cli-yaml")
    shown = json.loads(orrery(shared_fleet, "tasks", "show", task["id"], "--json").stdout)
    assert shown["nodes"][0]["output"]["stdout"] == "from-yaml\n"
    human = orrery(shared_fleet, "tasks", "show", task["id"])
    assert "✔ hello" in human.stdout


def test_an_api_problem_is_a_readable_error_and_exit_1(shared_fleet: Fleet) -> None:
    result = orrery(shared_fleet, "tasks", "show", "task_missing")
    assert result.returncode == 1
    assert "not_found" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_demo_runs_a_multi_device_dag_and_exits_0(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=child_env(COLUMNS="160"),
        cwd=ROOT,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Server errors (HTTP 500) across web-1 and web-2: 3" in result.stdout
    assert "task succeeded" in result.stdout


def test_api_keys_are_created_and_revoked_from_the_cli(shared_fleet: Fleet) -> None:
    created = orrery(shared_fleet, "api-keys", "create", "--role", "viewer", "--json")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    assert key["role"] == "viewer" and key["key"].startswith("orrk_")
    revoked = orrery(shared_fleet, "api-keys", "revoke", key["id"])
    assert revoked.returncode == 0
    import httpx

    r = httpx.get(f"{shared_fleet.server.url}/v1/tasks", headers={"Authorization": f"Bearer {key['key']}"})
    assert r.status_code == 401
