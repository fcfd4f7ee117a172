"""The emergency stop end to end (issue 18): real server, real agents. A stop kills the running
command at once (`device_stopped`), the device takes no work while its queued and new nodes run
elsewhere, the stop outlasts an agent kill -9 and an orchestrator restart, and only resume lifts
it. Roles and bad input get stable codes."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from device_agent.datadir import LEDGER_NAME
from tests.fakellm import FakeLLM, call
from tests.support import Fleet, fleet, run_cli, shell, wait_until


def started_then_sleep(marker: str) -> dict[str, Any]:
    """Writes its pid to `marker`, then sleeps (the same process: exec)."""
    return shell(["sh", "-c", f"echo $$ > {marker}.tmp && mv {marker}.tmp {marker}; exec sleep 300"], timeout_s=600)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"  # a zombie is dead too
    except FileNotFoundError:
        return True


def node_state(f: Fleet, task_id: str, node_id: str = "a") -> dict[str, Any]:
    return f.node(f.task(task_id), node_id)


def history(f: Fleet, device_id: str) -> list[dict[str, Any]]:
    with f.server.client() as c:
        items: list[dict[str, Any]] = c.get(f"/v1/devices/{device_id}/history").json()["items"]
        return items


def attempts_on(f: Fleet, device_id: str) -> list[dict[str, Any]]:
    with f.server.client() as c:
        items: list[dict[str, Any]] = c.get(f"/v1/devices/{device_id}/attempts").json()["items"]
        return items


def test_a_stop_kills_the_running_batch_takes_no_work_outlasts_restarts_and_only_resume_lifts_it(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, heartbeat_interval_s="1") as f:
        target = f.agent("es-target", {"pool": "es"})
        other = f.agent("es-other", {"pool": "es-other"})

        # (1) a long shell.run is killed within a bounded time; its node ends `device_stopped`.
        long = f.submit(
            {"nodes": [{"id": "a", "placement": {"device": "es-target"}, "commands": [started_then_sleep("started")]}]}
        )
        wait_until((target.workspace / "started").exists, 60, "the long command to start")
        with f.server.client() as c:
            began = time.monotonic()
            r = c.post(f"/v1/devices/{target.device_id}/stop", json={"reason": "runaway clicks"})
            assert r.status_code == 200, r.text
            assert r.json()["state"] == "stopped" and "runaway clicks" in r.json()["stop_reason"]
        ended = f.wait_task(long["id"], timeout=30)
        assert time.monotonic() - began < 15, "the running command outlived the stop"
        pid = int((target.workspace / "started").read_text())
        wait_until(lambda: gone(pid), 10, "the stopped command's process to be gone")
        node = f.node(ended, "a")
        assert ended["state"] == "failed" and node["state"] == "failed", node
        assert node["error"]["code"] == "device_stopped", node
        dev = f.device(target.device_id)
        assert dev["state"] == "stopped" and dev["admin_state"] == "stopped"
        newest = history(f, target.device_id)[0]
        assert newest["state"] == "stopped" and "runaway clicks" in newest["reason"] and "key " in newest["reason"]

        # (2) while stopped it takes no work: a node it could run goes elsewhere, one pinned to it waits.
        pinned = f.submit(
            {
                "nodes": [
                    {
                        "id": "a",
                        "placement": {"device": "es-target"},
                        "commands": [shell(["sh", "-c", "echo ran > pinned.txt"])],
                    }
                ]
            }
        )
        free = f.submit({"nodes": [{"id": "a", "commands": [shell(["sh", "-c", "echo ran > free.txt"])]}]})
        assert f.wait_task(free["id"])["state"] == "succeeded"
        assert (other.workspace / "free.txt").exists() and not (target.workspace / "free.txt").exists()
        assert node_state(f, pinned["id"])["state"] in ("ready", "queued")
        assert len(attempts_on(f, target.device_id)) == 1  # only the stopped batch

        # (3) kill -9 the agent and restart it: its ledger keeps the stop, the device stays stopped.
        target.kill()
        ledger = sqlite3.connect(target.data_dir / LEDGER_NAME)
        try:
            (kept,) = ledger.execute("SELECT value FROM meta WHERE key='control'").fetchone()
        finally:
            ledger.close()
        assert "runaway clicks" in kept
        target.start()
        wait_until(lambda: f.device(target.device_id)["connected"], 60, "the restarted agent to connect")
        assert "stopped by an operator" in target.log()
        # ... and an orchestrator restart.
        f.server.stop()
        f.server.start()
        wait_until(lambda: f.device(target.device_id)["connected"], 60, "the agent to reconnect")
        assert f.device(target.device_id)["state"] == "stopped"
        assert node_state(f, pinned["id"])["state"] in ("ready", "queued")
        assert not (target.workspace / "pinned.txt").exists()

        # Drain, cordon and uncordon do not lift a stop.
        with f.server.client() as c:
            for verb in ("drain", "cordon", "uncordon"):
                r = c.post(f"/v1/devices/es-target/{verb}")
                assert r.status_code == 409 and r.json()["code"] == "conflict", r.text
                assert "resume" in r.json()["detail"]

            # (4) resume lifts it, and work runs there again.
            r = c.post("/v1/devices/es-target/resume")
            assert r.status_code == 200, r.text
            assert r.json()["admin_state"] == "active" and r.json()["stop_reason"] is None
        assert f.wait_task(pinned["id"])["state"] == "succeeded"
        assert (target.workspace / "pinned.txt").exists()
        assert any("resumed by an operator" in h["reason"] for h in history(f, target.device_id))
        wait_until(lambda: "resumed by an operator" in target.log(), 30, "the agent to hear the resume")


def test_stop_and_resume_roles_and_bad_input(shared_fleet: Fleet) -> None:
    enrolled = shared_fleet.enroll("es-roles")
    with shared_fleet.server.client() as admin:
        viewer = admin.post("/v1/api-keys", json={"role": "viewer"}).json()["key"]
        operator = admin.post("/v1/api-keys", json={"role": "operator"}).json()["key"]
    base = shared_fleet.server.url
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {viewer}"}) as c:
        for verb in ("stop", "resume"):
            r = c.post(f"/v1/devices/{enrolled['id']}/{verb}")
            assert r.status_code == 403 and r.json()["code"] == "forbidden", r.text
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {operator}"}) as c:
        for verb in ("stop", "resume"):
            r = c.post(f"/v1/devices/no-such-device/{verb}")
            assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
        for body in ({"reason": "x" * 201}, {"reason": 123}, {"reason": None}, {"why": "typo"}, {"reason": "a\x00b"}):
            r = c.post(f"/v1/devices/{enrolled['id']}/stop", json=body)
            assert r.status_code == 422 and r.json()["code"] == "validation_error", (body, r.text)
        r = c.post(
            f"/v1/devices/{enrolled['id']}/stop", content=b"not json", headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 422 and r.json()["code"] == "validation_error", r.text
        assert c.get(f"/v1/devices/{enrolled['id']}").json()["state"] == "enrolled"  # nothing changed

        r = c.post(f"/v1/devices/{enrolled['id']}/stop")  # no body: no reason
        assert r.status_code == 200 and r.json()["state"] == "stopped", r.text
        again = c.post(f"/v1/devices/{enrolled['id']}/stop", json={"reason": "twice"})
        assert again.status_code == 200 and "twice" not in (again.json()["stop_reason"] or "")  # no change
        assert c.post(f"/v1/devices/{enrolled['id']}/resume").json()["state"] == "enrolled"
        assert c.post(f"/v1/devices/{enrolled['id']}/resume").status_code == 200  # not stopped: no change
    with shared_fleet.server.client() as admin:
        assert admin.delete(f"/v1/devices/{enrolled['id']}").status_code == 200
        for verb in ("stop", "resume"):
            r = admin.post(f"/v1/devices/{enrolled['id']}/{verb}")
            assert r.status_code == 409 and r.json()["code"] == "conflict", r.text


def test_orrery_devices_stop_and_resume(shared_fleet: Fleet) -> None:
    shared_fleet.enroll("es-cli")
    stopped = run_cli(shared_fleet, "devices", "stop", "es-cli", "--reason", "checking the cabling")
    assert stopped.returncode == 0, stopped.stderr
    assert (
        stopped.stdout.startswith("es-cli: stopped by an operator (key ")
        and "checking the cabling" in stopped.stdout
        and stopped.stdout.count("stopped") == 1
    )
    listed = json.loads(run_cli(shared_fleet, "devices", "list", "--json").stdout)
    assert next(d for d in listed if d["name"] == "es-cli")["state"] == "stopped"
    refused = run_cli(shared_fleet, "devices", "cordon", "es-cli")
    assert refused.returncode != 0 and "orrery devices resume es-cli" in refused.stderr + refused.stdout
    too_long = run_cli(shared_fleet, "devices", "stop", "es-cli", "--reason", "x" * 201)
    assert too_long.returncode != 0 and "200" in too_long.stderr + too_long.stdout
    missing = run_cli(shared_fleet, "devices", "stop", "no-such-device")
    assert missing.returncode != 0 and "no-such-device" in missing.stderr + missing.stdout
    resumed = run_cli(shared_fleet, "devices", "resume", "es-cli")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # Never connected: it is resumed in the store, and its agent gets it when it connects.
    assert resumed.stdout.startswith("es-cli: enrolled; its agent is not connected"), resumed.stdout
    help_text = run_cli(None, "devices", "stop", "--help").stdout
    assert "--reason" in help_text and "Emergency stop" in help_text


def test_a_stop_ends_an_agent_node_on_the_device_with_device_stopped(tmp_path: Path) -> None:
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env()) as f:
            box = f.agent("es-agent-box")
            llm.add(call("shell__run", argv=["sh", "-c", "touch started; exec sleep 300"], timeout_s=600))
            dag = {
                "nodes": [
                    {"id": "helper", "kind": "agent", "placement": {"device": "es-agent-box"}, "instruction": "work"}
                ]
            }
            with f.server.client() as c:
                task = c.post("/v1/tasks", json={"dag": dag}).json()
                wait_until((box.workspace / "started").exists, 60, "the agent's command to start")
                began = time.monotonic()
                assert c.post("/v1/devices/es-agent-box/stop", json={"reason": "enough"}).status_code == 200
            done = f.wait_task(task["id"], timeout=30)
            assert time.monotonic() - began < 15
            node = done["nodes"][0]
            assert done["state"] == "failed" and node["error"]["code"] == "device_stopped", node
            assert "enough" in node["error"]["message"]
            assert len(llm.requests) == 1  # the model was not asked again
            wait_until(lambda: f.device(box.device_id)["current_batch"] is None, 30, "the device to be free")
    finally:
        llm.close()
