"""The device agent's guarantees under faults, with a real orchestrator and real agent processes.

SPEC section 4 guarantees, tested through the faults that threaten them: the orchestrator
killed and restarted, the agent killed at each step of a batch (`ORRERY_AGENT_CRASH_AT`), the
agent's own disk refusing writes, and a second agent started on the same data dir.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Agent, Fleet, child_env, fleet, stop_agents, wait_until

RECONNECT_BOUND_S = 3.0


def echo(text: object) -> dict[str, Any]:
    return {"tool": "system.echo", "arguments": {"text": str(text)}}


def append_line() -> dict[str, Any]:
    """The countable side effect: one more line in out.txt each time it runs."""
    return {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "echo line >> out.txt"]}}


def connections(agent: Agent) -> int:
    return agent.log().count("connected to ")


def retry_delays(agent: Agent) -> list[float]:
    return [float(d) for d in re.findall(r"retrying in ([0-9.]+)s", agent.log())]


def test_an_agent_is_back_within_seconds_of_an_orchestrator_restart_after_an_eight_second_outage(
    tmp_path: Path,
) -> None:
    """The old 30 s-capped schedule waits up to 8, 16, then 30 s between attempts after 8 s of
    outage; the fast window keeps every delay under 2 s, so a restarted orchestrator is found
    within about a second of coming back (device_agent/reconnect.py)."""
    with fleet(tmp_path) as f:
        a = f.agent("phoenix")
        before = connections(a)
        f.server.kill()
        down = time.monotonic()
        wait_until(
            lambda: time.monotonic() - down >= 8.0 and len(retry_delays(a)) >= 3,
            30,
            "an outage of 8 s in which the agent kept trying",
        )
        f.server.start()
        back = time.monotonic()
        wait_until(lambda: connections(a) > before, RECONNECT_BOUND_S, "the agent to reconnect")
        assert time.monotonic() - back <= RECONNECT_BOUND_S
        assert f.wait_device(a.device_id, "idle", timeout=5)["state"] == "idle"
        assert max(retry_delays(a)) <= 2.0, retry_delays(a)


def test_a_data_dir_reused_by_a_new_enrollment_runs_the_new_devices_batches(tmp_path: Path) -> None:
    """Fences are counted per device on the server; a ledger mark left by the old device must
    not make the new device's first batches stale (defect 7)."""
    with fleet(tmp_path) as f:
        old = f.agent("before", {"slot": "one"})
        for i in range(3):
            task = f.submit({"nodes": [{"id": "n", "placement": {"device": old.device_id}, "commands": [echo(i)]}]})
            assert f.wait_task(task["id"])["state"] == "succeeded"
        # The server acknowledged the old device's last results (a task is done when they are
        # durable there; the ack reaches the agent a moment later). Stopped before it, the old
        # ledger would still hold them, and another device may not take it over (LedgerOwned).
        wait_until(lambda: _outbox_size(old.data_dir) == 0, 30, "the old agent's outbox to be acknowledged")
        old.stop()
        new = f.agent("after", {"slot": "one"}, start=False)
        new.data_dir = old.data_dir  # same ledger, new device
        new.start()
        f.wait_device(new.device_id, "idle")
        task = f.submit({"nodes": [{"id": "n", "placement": {"device": new.device_id}, "commands": [echo("new")]}]})
        done = f.wait_task(task["id"])
        assert done["state"] == "succeeded", f.node(done, "n")["attempts"]
        assert f.node(done, "n")["output"] == {"text": "new"}


def _outbox_size(data_dir: Path) -> int:
    """Results the agent's ledger still holds for the server (read-only; the ledger is in WAL mode)."""
    with contextlib.closing(sqlite3.connect(f"file:{data_dir / 'ledger.sqlite3'}?mode=ro", uri=True)) as db:
        (count,) = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        return int(count)


# ---------------------------------------------------------------- the agent's own disk fails


def _chattr_works(probe: Path) -> str | None:
    """Why `chattr +i` cannot make a file refuse writes here, or None if it can."""
    if shutil.which("chattr") is None:
        return "chattr is not installed (apt-get install e2fsprogs)"
    probe.write_text("")
    try:
        made = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            return f"this filesystem or container refuses chattr +i: {made.stderr.strip()}"
        try:
            with probe.open("a") as f:
                f.write("x")
        except PermissionError:
            return None
        return "an immutable file still took a write"
    finally:
        subprocess.run(["chattr", "-i", str(probe)], check=False)


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """Make `path` refuse every write, to root too, until the block ends.

    chmod does not stop root, and a read-only bind mount or a full tmpfs needs mount rights and
    cannot be aimed at one open file. The immutable attribute (chattr +i) is enforced by the
    kernel on every write, including through descriptors opened before it was set, so the
    agent's already-open ledger or audit log fails for real, with the errno a broken disk gives.
    """
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.fixture
def chattr(tmp_path: Path) -> None:
    reason = _chattr_works(tmp_path / "chattr-probe")
    if reason is not None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{reason}; under CI the disk-failure tests must run")
        pytest.skip(reason)


def wait_line_command(marker: str, then: str) -> dict[str, Any]:
    """A command that marks it started, waits for a `go` file, then does `then`."""
    script = f"touch {marker}; while [ ! -e go ]; do sleep 0.05; done; {then}"
    return {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", script]}}


def exit_status(agent: Agent, timeout: float = 30) -> int:
    """The agent's exit status once it has exited by itself (negative: the signal that killed it)."""
    wait_until(lambda: agent.proc is not None and agent.proc.poll() is not None, timeout, "the agent to exit")
    assert agent.proc is not None
    return agent.proc.returncode


@pytest.mark.usefixtures("chattr")
@pytest.mark.parametrize(
    ("broken", "says"),
    [("ledger.sqlite3-wal", "the ledger"), ("audit.jsonl", "the batch executor stopped unexpectedly (PermissionError")],
)
def test_a_disk_that_refuses_the_agents_writes_mid_batch_stops_the_agent_loudly_and_the_call_is_uncertain(
    tmp_path: Path, broken: str, says: str
) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("brittle")
        task = f.submit({"nodes": [{"id": "n", "commands": [wait_line_command("started", "echo line >> out.txt")]}]})
        wait_until((a.workspace / "started").exists, 30, "the command to start")
        with immutable(a.data_dir / broken):
            (a.workspace / "go").touch()
            code = exit_status(a)
        assert code > 0, code  # a clean non-zero exit, not a signal and not success
        error = [line for line in a.log().splitlines() if "agent stopping with an error" in line]
        assert error, a.log()[-3000:]
        assert says in error[0], error[0]
        a.start()  # a supervisor restarts it; recovery reports the interrupted call
        done = f.wait_task(task["id"])
        node = f.node(done, "n")
        assert node["state"] == "failed", node
        assert node["attempts"][-1]["error"]["code"] == "uncertain"
        assert len(node["attempts"]) == 1  # shell.run is not retry-safe
        assert (a.workspace / "out.txt").read_text() == "line\n"


@pytest.mark.usefixtures("chattr")
def test_a_ledger_that_cannot_record_a_delivered_batch_stops_the_agent_before_anything_runs(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("unrecorded")
        with immutable(a.data_dir / "ledger.sqlite3-wal"):
            task = f.submit({"nodes": [{"id": "n", "commands": [append_line()]}]})
            code = exit_status(a)
        assert code > 0, code
        assert any("failed in receive" in line for line in a.log().splitlines()), a.log()[-3000:]
        assert not (a.workspace / "out.txt").exists()
        a.start()
        done = f.wait_task(task["id"], timeout=120)
        assert done["state"] == "succeeded", f.node(done, "n")
        assert (a.workspace / "out.txt").read_text() == "line\n"


# ---------------------------------------------------------------- the agent killed at each step of a batch

# point -> (node state, error code, lines in out.txt) after the agent restarts without the crash point.
CRASH_OUTCOMES = {
    "received": ("succeeded", None, 1),  # never started: retry-safe, runs once
    "accepted": ("succeeded", None, 1),
    "call_started": ("failed", "uncertain", 0),  # shell.run is not retry-safe: reported, not re-run
    "call_done": ("failed", "uncertain", 1),
    "finished": ("succeeded", None, 1),  # the outbox delivers the recorded result
    "sent": ("succeeded", None, 1),  # the server de-duplicates the re-sent result
}


@pytest.fixture(scope="module")
def crash_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One server for every crash point: each point has a device (and data dir) of its own."""
    with Fleet(tmp_path_factory.mktemp("crash-points")) as f:
        yield f


@pytest.mark.parametrize("point", list(CRASH_OUTCOMES))
def test_an_agent_killed_at_a_crash_point_runs_the_command_at_most_once_and_the_node_ends(
    crash_fleet: Fleet, point: str
) -> None:
    state, code, lines = CRASH_OUTCOMES[point]
    f = crash_fleet
    name = f"crashy-{point.replace('_', '-')}"
    a = f.agent(name, ORRERY_AGENT_CRASH_AT=point)
    try:
        task = f.submit({"nodes": [{"id": "n", "placement": {"device": name}, "commands": [append_line()]}]})
        assert exit_status(a) == -signal.SIGKILL
        assert f"crash point {point} reached" in a.log()
        a.env = child_env()  # the supervisor restarts it, without the crash point
        a.start()
        done = f.wait_task(task["id"], timeout=120)
        node = f.node(done, "n")
        out = a.workspace / "out.txt"
        written = out.read_text().splitlines() if out.exists() else []
        assert len(written) <= 1, written  # never twice, whatever else happens
        assert node["state"] in ("succeeded", "failed"), node
        assert (node["state"], (node["attempts"][-1].get("error") or {}).get("code"), len(written)) == (
            state,
            code,
            lines,
        ), node["attempts"]
    finally:
        stop_agents([a])


# ---------------------------------------------------------------- an orchestrator restored from a backup


@pytest.mark.skipif(
    bool(os.environ.get("ORRERY_TEST_POSTGRES_SERVER")), reason="restores the SQLite file of the embedded store"
)
def test_an_orchestrator_restored_from_a_backup_runs_new_work_once_despite_its_older_fences(tmp_path: Path) -> None:
    """Issue 12, defect 7: fences are bound to the server and the device, and a server whose
    database went back in time raises its fence past what the agent's ledger has seen."""
    with fleet(tmp_path) as f:
        a = f.agent("survivor")
        f.wait_task(f.submit({"nodes": [{"id": "n", "commands": [echo(1)]}]})["id"])
        f.server.stop()
        backup = tmp_path / "backup"
        shutil.copytree(f.server.data_dir, backup)
        f.server.start()
        for i in range(2, 4):  # fences the backup never saw
            f.wait_task(f.submit({"nodes": [{"id": "n", "commands": [echo(i)]}]})["id"])
        f.server.kill()
        shutil.rmtree(f.server.data_dir)
        shutil.copytree(backup, f.server.data_dir)
        f.server.start()
        f.wait_device(a.device_id, "idle")
        task = f.submit({"nodes": [{"id": "n", "commands": [append_line()]}]})
        done = f.wait_task(task["id"], timeout=120)
        assert done["state"] == "succeeded", [(t["status"], t["error"]) for t in f.node(done, "n")["attempts"]]
        assert (a.workspace / "out.txt").read_text() == "line\n"
