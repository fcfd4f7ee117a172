"""Fault injection against real processes: the guarantees of SPEC section 4 under kill -9,
cut connections, a frozen agent and a crashed orchestrator."""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path

from tests.support import Agent, TcpProxy, child_env, fleet, shell, wait_until


def marker_command(workspace_marker: str, then: str) -> list[str]:
    """A command that marks that it started, then does `then` (all inside the workspace)."""
    return ["sh", "-c", f"touch {workspace_marker}; {then}"]


def test_agent_killed_mid_command_reports_it_uncertain_and_never_runs_it_twice(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("victim")
        dag = {
            "nodes": [
                {"id": "append", "commands": [shell(marker_command("started", "sleep 1.5; echo line >> out.txt"))]}
            ]
        }
        task = f.submit(dag)
        wait_until((a.workspace / "started").exists, 30, "the command to start")
        a.kill()  # SIGKILL: the agent dies, and its command with it (device_agent/orphans.py)
        a.start()
        done = f.wait_task(task["id"])
        node = f.node(done, "append")
        assert node["state"] == "failed"
        assert node["error"]["code"] == "uncertain"
        assert len(node["attempts"]) == 1
        assert node["attempts"][0]["results"][0]["status"] == "uncertain"
        assert not (a.workspace / "out.txt").exists()  # it neither finished nor ran again


def test_a_cut_connection_resumes_the_session_and_the_result_arrives_once(tmp_path: Path) -> None:
    with fleet(tmp_path, heartbeat_interval_s="1") as f:
        proxy = TcpProxy(f.server.port)
        try:
            a = f.agent("cut", start=False)
            a.server_url = proxy.url
            a.start()
            f.wait_device(a.device_id, "idle")
            dag = {"nodes": [{"id": "work", "commands": [shell(marker_command("started", "sleep 1; echo finished"))]}]}
            task = f.submit(dag)
            wait_until((a.workspace / "started").exists, 30, "the command to start")
            proxy.sever()
            done = f.wait_task(task["id"])
            node = f.node(done, "work")
            assert done["state"] == "succeeded"
            assert node["output"]["stdout"] == "finished\n"
            assert len(node["attempts"]) == 1
            assert proxy.connections >= 2
            assert "resumed=True" in a.log()
            assert "refused results" not in f.server.log()
        finally:
            proxy.close()


def test_results_wait_in_the_outbox_through_an_agent_kill_and_are_delivered_after_restart(tmp_path: Path) -> None:
    import sqlite3

    with fleet(tmp_path) as f:
        proxy = TcpProxy(f.server.port)
        try:
            a = f.agent("outboxer", start=False)
            a.server_url = proxy.url
            a.start()
            f.wait_device(a.device_id, "idle")
            task = f.submit(
                {"nodes": [{"id": "n", "commands": [shell(marker_command("started", "sleep 0.5; echo kept"))]}]}
            )
            wait_until((a.workspace / "started").exists, 30, "the command to start")
            proxy.pause()  # the agent can finish but cannot deliver

            def outbox() -> int:
                with sqlite3.connect(a.data_dir / "ledger.sqlite3") as db:
                    return int(db.execute("SELECT count(*) FROM outbox").fetchone()[0])

            wait_until(outbox, 30, "the result to be in the outbox")
            a.kill()
            proxy.resume()
            a.start()
            done = f.wait_task(task["id"])
            assert done["state"] == "succeeded"
            assert f.node(done, "n")["output"]["stdout"] == "kept\n"
            wait_until(lambda: outbox() == 0, 20, "the acknowledged result to leave the outbox")
        finally:
            proxy.close()


def test_orchestrator_killed_mid_task_recovers_and_runs_no_batch_twice(tmp_path: Path) -> None:
    with fleet(tmp_path, heartbeat_interval_s="1") as f:
        a = f.agent("steady")
        steps = [f"s{i}" for i in range(4)]
        dag = {
            "nodes": [{"id": s, "commands": [shell(["sh", "-c", f"echo {s} >> ran.txt; sleep 0.7"])]} for s in steps],
            "edges": [{"from": x, "to": y} for x, y in itertools.pairwise(steps)],
        }
        task = f.submit(dag)
        ran = a.workspace / "ran.txt"
        wait_until(lambda: ran.exists() and len(ran.read_text().split()) >= 2, 30, "two steps to have run")
        f.server.kill()  # SIGKILL, no shutdown
        f.server.start()
        done = f.wait_task(task["id"], timeout=90)
        assert done["state"] == "succeeded", done
        assert ran.read_text().split() == steps
        assert all(len(n["attempts"]) == 1 for n in done["nodes"])
        # The event history survived the crash: a stream resumed after it has no gap or repeat.
        with f.server.client() as c:
            text = c.get(f"/v1/tasks/{task['id']}/events").text
        ids = [int(line[3:]) for line in text.splitlines() if line.startswith("id:")]
        assert ids == sorted(set(ids))
        with f.server.client() as c:
            tail = c.get(f"/v1/tasks/{task['id']}/events", params={"after": ids[2]}).text
        assert [int(line[3:]) for line in tail.splitlines() if line.startswith("id:")] == ids[3:]


def test_a_frozen_agent_goes_suspect_then_offline_its_read_only_node_moves_and_it_is_fenced_after(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, heartbeat_interval_s="0.5", heartbeat_timeout_s="3") as f:
        frozen = f.agent("frozen", {"pool": "p"})
        frozen.signal(signal.SIGSTOP)
        dag = {
            "nodes": [
                {
                    "id": "look",
                    "placement": {"labels": {"pool": "p"}},
                    "commands": [{"tool": "system.info", "arguments": {}}],
                    "retry": {"max_attempts": 3},
                }
            ]
        }
        task = f.submit(dag)
        wait_until(lambda: f.node(f.task(task["id"]), "look")["attempts"], 20, "the node to be dispatched")
        assert f.node(f.task(task["id"]), "look")["attempts"][0]["device_id"] == frozen.device_id
        f.wait_device(frozen.device_id, "suspect", timeout=20)
        helper = f.agent("helper", {"pool": "p"})
        f.wait_device(frozen.device_id, "offline", timeout=20)
        done = f.wait_task(task["id"])
        node = f.node(done, "look")
        assert done["state"] == "succeeded"
        assert [a["device_id"] for a in node["attempts"]] == [frozen.device_id, helper.device_id]
        assert node["attempts"][0]["error"]["code"] == "device_lost"
        frozen.signal(signal.SIGCONT)
        f.wait_device(frozen.device_id, "idle", timeout=30)
        wait_until(
            lambda: "stale_fence" in frozen.log() or "no longer current" in frozen.log(),
            20,
            "the stale result to be refused",
        )
        after = f.task(task["id"])
        assert f.node(after, "look")["attempts"] == node["attempts"]  # nothing changed


def test_cancel_stops_the_running_command_skips_the_rest_and_cancels_waiting_nodes(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("busy")
        dag = {
            "nodes": [
                {"id": "long", "commands": [shell(["sh", "-c", "echo $$ > pid; sleep 60"]), shell(["echo", "never"])]},
                {"id": "after", "commands": [shell(["echo", "after"])]},
            ],
            "edges": [{"from": "long", "to": "after"}],
        }
        task = f.submit(dag)
        pid_file = a.workspace / "pid"
        wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 30, "the long command to start")
        pid = int(pid_file.read_text())
        with f.server.client() as c:
            r = c.post(f"/v1/tasks/{task['id']}/cancel")
        assert r.status_code == 202
        done = f.wait_task(task["id"], timeout=30)
        assert done["state"] == "cancelled"
        long_, after = f.node(done, "long"), f.node(done, "after")
        assert long_["state"] == "cancelled"
        results = long_["attempts"][0]["results"]
        assert [r["status"] for r in results] == ["failure", "skipped"]
        assert results[0]["error"]["code"] == "cancelled"
        assert after["state"] == "cancelled"
        wait_until(lambda: not _alive(pid), 10, "the killed command's process to be gone")
        with f.server.client() as c:
            assert c.post(f"/v1/tasks/{task['id']}/cancel").status_code == 409


def test_an_attempt_past_its_timeout_is_cancelled_on_the_device_and_fails_with_timeout(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("slow")
        dag = {"nodes": [{"id": "slow", "timeout_s": 1, "commands": [shell(["sh", "-c", "echo $$ > pid; sleep 60"])]}]}
        done = f.wait_task(f.submit(dag)["id"], timeout=30)
        node = f.node(done, "slow")
        assert done["state"] == "failed"
        assert node["error"]["code"] == "timeout"
        pid = int((a.workspace / "pid").read_text())
        wait_until(lambda: not _alive(pid), 10, "the timed-out command to be killed")
        f.wait_device(a.device_id, "idle", timeout=20)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and ") Z " in stat.read_text())


__all__ = ["Agent", "child_env"]
