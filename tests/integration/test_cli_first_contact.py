"""The client CLI as a new user meets it (issue 13): clear one-line errors and never a traceback,
`--version`, whole ids in listings, device names and attempts, `--watch` line by line in a pipe,
`orrery tools`. Every command runs as a real subprocess against a real server and agent."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support import ROOT, Fleet, child_env, free_port, run_cli


def orrery(
    fleet: Fleet | None, *args: str, timeout: float = 60, cwd: Path = ROOT, **env: str
) -> subprocess.CompletedProcess[str]:
    return run_cli(fleet, *args, timeout=timeout, cwd=cwd, columns=80, **env)


def assert_short_error(result: subprocess.CompletedProcess[str], *needles: str, code: int | None = None) -> None:
    """Non-zero exit, one or two lines on stderr, no traceback, and each needle in them."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0, result
    if code is not None:
        assert result.returncode == code, result
    assert "Traceback" not in result.stderr + result.stdout
    assert 1 <= len(lines) <= 2, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


# ---------------------------------------------------------------- errors (issue 13, item 6)


def test_malformed_yaml_is_one_line_with_file_line_and_column(shared_fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text("name: broken\nnodes:\n  - id: a\n   commands: [1\n")
    result = orrery(shared_fleet, "submit", str(dag))
    assert_short_error(result, f"{dag}:4:4", "invalid YAML", code=2)


def test_malformed_json_is_one_line_with_file_line_and_column(shared_fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.json"
    dag.write_text('{"nodes": [\n  {"id": "a",}\n]}\n')
    assert_short_error(orrery(shared_fleet, "submit", str(dag)), f"{dag}:2:14", "invalid JSON", code=2)


def test_a_missing_file_is_one_line(shared_fleet: Fleet, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert_short_error(orrery(shared_fleet, "submit", str(missing)), f"{missing}: no such file", code=2)
    assert_short_error(orrery(shared_fleet, "validate", str(missing)), f"{missing}: no such file", code=2)


def test_submit_without_arguments_says_what_to_give() -> None:
    result = orrery(None, "submit")
    assert_short_error(result, "FILE", "--request", code=2)


def test_a_server_that_is_not_running_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = orrery(None, "tasks", "list", ORRERY_URL=url, ORRERY_API_KEY="orrk_x")
    assert_short_error(result, f"cannot reach the orchestrator at {url}: is `orrery serve` running?", code=1)


def test_a_missing_admin_key_is_one_line_saying_where_to_put_it(shared_fleet: Fleet, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "devices", "list"],
        capture_output=True,
        text=True,
        env=child_env(ORRERY_URL=shared_fleet.server.url, ORRERY_DATA_DIR=str(tmp_path / "empty")),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert_short_error(result, "no API key", "ORRERY_API_KEY", "--api-key", code=1)


def test_server_text_is_printed_literally_not_as_markup(shared_fleet: Fleet) -> None:
    result = orrery(shared_fleet, "tasks", "show", "task_[index]_[bold]x")
    assert_short_error(result, "not_found", "task_[index]_[bold]x", code=1)


def test_a_validation_problem_from_the_server_is_short_and_literal(shared_fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text("nodes:\n  - id: a\n    commands: [{tool: shell.run, arguments: {argv: [x]}}]\n    bogus: 1\n")
    result = orrery(shared_fleet, "submit", str(dag))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "validation_error" in result.stderr and "bogus" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr


def test_bad_label_changes_and_unknown_commands_exit_2_without_a_traceback() -> None:
    assert_short_error(orrery(None, "devices", "label", "dev_x", "novalue"), "KEY=VALUE", "KEY-", code=2)
    unknown = orrery(None, "frobnicate")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr


# ---------------------------------------------------------------- YAML `on:` (issue 13, item 1)


def test_an_unquoted_on_key_in_a_yaml_dag_is_an_edge_condition(shared_fleet: Fleet, tmp_path: Path) -> None:
    shared_fleet.agent("fc-yaml", {"role": "fc-yaml"})
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "name: fc-on-always\n"
        "nodes:\n"
        "  - id: first\n"
        "    placement: {labels: {role: fc-yaml}}\n"
        "    commands:\n"
        "      - {tool: shell.run, arguments: {argv: [echo, yes]}}\n"
        "  - id: then\n"
        "    placement: {labels: {role: fc-yaml}}\n"
        "    commands:\n"
        "      - {tool: shell.run, arguments: {argv: [echo, no]}}\n"
        "edges:\n"
        "  - {from: first, to: then, on: always}\n"
    )
    result = orrery(shared_fleet, "submit", str(dag), "--json")
    assert result.returncode == 0, result.stderr
    task = json.loads(result.stdout)
    assert task["edges"] == [{"from": "first", "to": "then", "on": "always"}]
    done = shared_fleet.wait_task(task["id"])
    assert done["state"] == "succeeded"
    assert shared_fleet.node(done, "first")["output"]["stdout"] == "yes\n"  # `yes` stays a string


# ---------------------------------------------------------------- what users expect (issue 13)


def test_version() -> None:
    result = orrery(None, "--version")
    assert result.returncode == 0
    from importlib.metadata import version

    assert result.stdout.strip() == f"orrery {version('orrery')}"


def test_listings_show_whole_ids_in_a_narrow_pipe(shared_fleet: Fleet) -> None:
    long_name = "fc-a-device-with-a-really-quite-long-name-for-a-narrow-terminal"
    labels = {"role": "fc-long", "zone": "eu-west-1-availability-zone-b", "owner": "platform-observability"}
    shared_fleet.enroll(long_name, labels)
    with shared_fleet.server.client() as c:
        ids = {d["id"] for d in c.get("/v1/devices").json()["items"]}
        task_ids = {t["id"] for t in c.get("/v1/tasks").json()["items"]}
    devices = orrery(shared_fleet, "devices", "list")
    assert devices.returncode == 0, devices.stderr
    for device_id in ids:
        assert device_id in devices.stdout
    assert long_name in devices.stdout and "…" not in devices.stdout
    tasks = orrery(shared_fleet, "tasks", "list")
    assert tasks.returncode == 0
    for task_id in task_ids:
        assert task_id in tasks.stdout
    assert "…" not in tasks.stdout


def test_tasks_show_names_the_device_and_counts_attempts(shared_fleet: Fleet) -> None:
    agent = shared_fleet.agent("fc-show-box", {"role": "fc-show"})
    task = shared_fleet.submit(
        {
            "nodes": [
                {
                    "id": "only",
                    "placement": {"labels": {"role": "fc-show"}},
                    "commands": [{"tool": "system.echo", "arguments": {"text": "hi"}}],
                    "retry": {"max_attempts": 2},
                }
            ],
            "edges": [],
        },
        name="fc-show",
    )
    shared_fleet.wait_task(task["id"])
    shown = orrery(shared_fleet, "tasks", "show", task["id"], COLUMNS="160")
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if "✔ only" in line)
    assert "fc-show-box" in line and agent.device_id not in line
    assert "attempt 1/2" in line


def test_watch_in_a_pipe_prints_each_node_change_as_it_happens(shared_fleet: Fleet, tmp_path: Path) -> None:
    shared_fleet.agent("fc-watch-box", {"role": "fc-watch"})
    dag = tmp_path / "dag.yaml"
    dag.write_text(
        "name: fc-watch\n"
        "nodes:\n"
        "  - id: quick\n"
        "    placement: {labels: {role: fc-watch}}\n"
        "    commands: [{tool: system.echo, arguments: {text: quick}}]\n"
        "  - id: slow\n"
        "    placement: {labels: {role: fc-watch}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [sleep, '120']}, timeout_s: 150}]\n"
        "edges:\n"
        "  - {from: quick, to: slow}\n"
    )
    env = child_env(ORRERY_URL=shared_fleet.server.url, ORRERY_API_KEY=shared_fleet.server.api_key, COLUMNS="80")
    env.pop("PYTHONUNBUFFERED")  # a real pipe: output must be flushed line by line
    with subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "submit", str(dag), "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    ) as proc:
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        seen: list[str] = []

        def until(needle: str) -> str:
            while True:
                line = lines.get(timeout=60)
                assert line is not None, "".join(seen)
                seen.append(line)
                if needle in line:
                    return line

        try:
            task_id = until("task task_").split()[1]
            assert "fc-watch-box" in until("◐ quick running")
            assert "fc-watch-box" in until("✔ quick succeeded")
            assert "fc-watch-box" in until("◐ slow running")  # while slow still runs: nothing is held back
            with shared_fleet.server.client() as c:
                assert c.post(f"/v1/tasks/{task_id}/cancel").status_code in (200, 202)
            until("⊘ slow cancelled")
            rest = []
            while (line := lines.get(timeout=60)) is not None:
                rest.append(line)
            assert proc.wait(timeout=30) == 1
            reader.join(timeout=10)
            assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    summary = "".join(rest)
    assert "fc-watch ⊘ cancelled" in summary and "Outputs" in summary


def test_tools_lists_every_tool_with_schema_and_retry_safety(shared_fleet: Fleet) -> None:
    agent = shared_fleet.agent("fc-tools-box", {"role": "fc-tools"})
    listed = orrery(shared_fleet, "tools", "--json")
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in json.loads(listed.stdout)}
    assert tools["shell.run"]["retry_safe"] is False
    assert tools["files.read"]["retry_safe"] is True and tools["files.read"]["read_only"] is True
    assert "argv" in tools["shell.run"]["input_schema"]["properties"]
    assert "fc-tools-box" in tools["shell.run"]["devices"]
    assert tools["shell.run"]["description"]

    for ref in ("fc-tools-box", agent.device_id, agent.device_id[:10]):
        one = orrery(shared_fleet, "tools", ref)
        assert one.returncode == 0, one.stderr
        assert "shell.run  not retry-safe" in one.stdout
        assert "files.read  retry-safe (read-only)" in one.stdout
        assert "args: argv: array" in one.stdout
    missing = orrery(shared_fleet, "tools", "fc-no-such-device")
    assert_short_error(missing, "not_found", code=1)


@pytest.mark.parametrize("command", [["devices", "list"], ["tasks", "list"], ["tools"]])
def test_listings_exit_0_and_json_parses(shared_fleet: Fleet, command: list[str]) -> None:
    result = orrery(shared_fleet, *command, "--json")
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)
