"""Issue 13, as a new user meets the agent: a real orchestrator and real agent processes.

- two agents started from one directory get a data dir each (item 2), one data dir holds one
  agent, and a device's unreported work is not taken over by another device;
- a refused token ends the agent with one line and status 3; nothing listening is retried (item 7);
- the device's policy is visible in `GET /v1/devices/{id}` (contract: `hello.info.policy`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support import ROOT, Agent, Fleet, child_env, fleet, free_port, wait_until

REFUSED = "the orchestrator refused this device's token: revoked or wrong; enroll again or pass the right --token"


def shell_task(device_id: str, script: str) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "n",
                "placement": {"device": device_id},
                "commands": [{"tool": "shell.run", "arguments": {"argv": ["sh", "-c", script]}}],
            }
        ]
    }


@contextmanager
def agent_process(cwd: Path, log: Path, *args: str, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """`orrery agent ARGS` as a user types it in `cwd` (no --data-dir unless given); killed at the end."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orrery", "agent", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=child_env(PYTHONPATH=str(ROOT), **env),
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(15)


def exited(proc: subprocess.Popen[bytes], within: float) -> int:
    wait_until(lambda: proc.poll() is not None, within, "the agent to exit")
    return proc.returncode


def lines(log: Path) -> list[str]:
    return [line for line in log.read_text(errors="replace").splitlines() if line.strip()]


# ---------------------------------------------------------------- item 2: a data dir per device


def test_two_agents_started_from_one_directory_each_get_their_own_data_dir_and_both_run_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with fleet(tmp_path) as f:
        one, two = f.enroll("one"), f.enroll("two")
        with (
            agent_process(home, tmp_path / "one.log", "--server", f.server.url, "--token", one["token"]),
            agent_process(home, tmp_path / "two.log", "--server", f.server.url, "--token", two["token"]),
        ):
            for device in (one, two):
                f.wait_device(device["id"], "idle")
            tasks = [f.submit(shell_task(d["id"], "echo ran > out.txt")) for d in (one, two)]
            for task in tasks:
                assert f.wait_task(task["id"])["state"] == "succeeded", task
        for device in (one, two):
            data_dir = home / ".orrery-agent" / device["id"]
            assert (data_dir / "ledger.sqlite3").is_file()
            assert (data_dir / "workspace" / "out.txt").read_text() == "ran\n"
        assert not (home / ".orrery-agent" / "ledger.sqlite3").exists()  # the old shared default


def test_a_second_agent_on_an_explicit_data_dir_in_use_exits_2_with_one_line(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        first = f.agent("first")
        other = f.enroll("second")
        log = tmp_path / "second.log"
        args = ["--server", f.server.url, "--token", other["token"], "--data-dir", str(first.data_dir)]
        with agent_process(tmp_path, log, *args) as second:
            assert exited(second, 60) == 2
        [line] = lines(log)
        assert f"the data dir {first.data_dir.resolve()} is in use by another agent" in line
        assert first.proc is not None and f"pid {first.proc.pid}" in line and "--data-dir" in line
        task = f.submit(shell_task(first.device_id, "true"))  # the holder is untouched
        assert f.wait_task(task["id"])["state"] == "succeeded"


def test_a_data_dir_holding_another_devices_unreported_results_is_refused_until_they_are_delivered(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("owner", ORRERY_AGENT_CRASH_AT="finished")  # dies with the results in its outbox
        task = f.submit(shell_task(a.device_id, "echo once >> out.txt"))
        wait_until(lambda: a.proc is not None and a.proc.poll() is not None, 60, "the owner's agent to crash")
        b = f.enroll("intruder")
        log = tmp_path / "intruder.log"
        args = ["--server", f.server.url, "--token", b["token"], "--data-dir", str(a.data_dir)]
        with agent_process(tmp_path, log, *args) as intruder:
            assert exited(intruder, 60) == 2
        [line] = lines(log)
        assert f"holds the ledger of device {a.device_id}" in line and f"device {b['id']}" in line, line
        a.env = child_env()
        a.start()  # the owner delivers what it ran, once
        done = f.wait_task(task["id"])
        assert done["state"] == "succeeded", done
        assert (a.workspace / "out.txt").read_text() == "once\n"


# ---------------------------------------------------------------- item 7: a refused token


def refused_line(log: Path) -> str:
    errors = [line for line in lines(log) if " ERROR " in line]
    assert len(errors) == 1, lines(log)
    assert REFUSED in errors[0], errors[0]
    text = log.read_text()
    assert "Traceback" not in text and '{"' not in text, text  # no raw JSON problem bodies
    return errors[0]


def test_an_agent_with_a_wrong_token_exits_3_within_seconds_with_one_clear_line(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        real = f.enroll("real")
        wrong = real["token"][:-4] + "oops"
        log = tmp_path / "wrong.log"
        with agent_process(tmp_path, log, "--server", f.server.url, "--token", wrong) as proc:
            started = time.monotonic()
            assert exited(proc, 60) == 3
            assert time.monotonic() - started < 30
        assert real["id"] in refused_line(log)
        assert len([line for line in lines(log) if "HTTP 401" in line]) == 3, lines(log)


def test_a_revoked_devices_running_agent_exits_3(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("doomed")
        with f.server.client() as c:
            assert c.delete(f"/v1/devices/{a.device_id}").status_code == 200
        wait_until(lambda: a.proc is not None and a.proc.poll() is not None, 60, "the revoked agent to exit")
        assert a.proc is not None and a.proc.returncode == 3
        refused_line(a.log_path)


def test_an_agent_pointed_where_nothing_listens_keeps_retrying(tmp_path: Path) -> None:
    log = tmp_path / "lonely.log"
    token = "orrd_dev_0123456789abcdef0123.secret"
    with agent_process(tmp_path, log, "--server", f"http://127.0.0.1:{free_port()}", "--token", token) as proc:
        wait_until(lambda: log.exists() and log.read_text().count("retrying in") >= 4, 60, "four retries")
        assert proc.poll() is None  # still trying: an orchestrator that comes up later finds it
        assert "refused this device's token" not in log.read_text()


# ---------------------------------------------------------------- the contract: hello.info.policy


def test_the_devices_policy_is_shown_by_the_rest_api(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("guarded", extra_args=["--unattended"], ORRERY_AGENT_SHELL_ALLOW='["ls", "echo"]')
        assert policy_of(f, a) == {
            "shell_allow": ["ls", "echo"],
            "shell_deny": [],
            "approval_required": [
                *("gui.click", "gui.double_click", "gui.type", "gui.key", "gui.scroll", "gui.drag"),
                *("gui.set_value", "gui.focus_window", "gui.launch"),
            ],
            "unattended": True,
            "approvals_local_only": False,
            "kill_switch": False,
            "sandbox": {"kind": "none"},
            "safety_budgets": {"max_destructive_per_minute": 0, "max_consecutive_bad_outcomes": 0},
        }


def policy_of(f: Fleet, a: Agent) -> Any:
    return f.device(a.device_id)["info"]["policy"]
