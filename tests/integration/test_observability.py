"""Metrics, structured logs with ids, request ids, and the live CLI view in a real terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ROOT, Fleet, child_env, shell


def scrape(fleet: Fleet) -> dict[str, float]:
    text = httpx.get(f"{fleet.server.url}/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_metrics_parse_and_move_when_a_dag_runs(tmp_path: Path) -> None:
    with Fleet(tmp_path) as f:
        f.agent("measured")
        before = scrape(f)
        dag = {"nodes": [{"id": "a", "commands": [shell(["true"])]}, {"id": "b", "commands": [shell(["false"])]}]}
        f.wait_task(f.submit(dag)["id"])
        with f.server.client() as c:
            c.get("/v1/tasks/task_nope")
        after = scrape(f)
        assert (
            after["orrery_batches_total{outcome=succeeded}"] - before.get("orrery_batches_total{outcome=succeeded}", 0)
            == 1
        )
        assert after["orrery_batches_total{outcome=tool_error}"] >= 1
        assert after["orrery_node_transitions_total{state=succeeded}"] >= 1
        assert after["orrery_schedule_to_start_seconds_count{}"] >= 2
        assert after["orrery_batch_roundtrip_seconds_count{}"] >= 2
        assert after["orrery_devices{state=idle}"] == 1
        assert after["orrery_websocket_connections_open{}"] == 1
        assert after["orrery_errors_total{code=not_found}"] >= 1
        # the garbage collector's pauses, exposed for each generation
        assert {f"orrery_gc_pause_seconds_count{{generation={g}}}" for g in "012"} <= after.keys()
        assert not any("task_" in key or "dev_" in key for key in after)  # bounded label sets


def test_a_dispatched_batch_logs_all_four_ids_as_json_and_requests_carry_an_id(tmp_path: Path) -> None:
    with Fleet(tmp_path, log_format="json", log_level="debug") as f:
        agent = f.agent("logged")
        task = f.wait_task(f.submit({"nodes": [{"id": "n", "commands": [shell(["true"])]}]})["id"])
        lines = [json.loads(line) for line in f.server.log().splitlines() if line.startswith("{")]
        dispatched = [entry for entry in lines if entry.get("msg") == "batch dispatched"]
        assert dispatched, "no dispatch line was logged"
        entry = dispatched[0]
        assert entry["task_id"] == task["id"] and entry["node_id"] == "n"
        assert entry["device_id"] == agent.device_id
        assert entry["batch_id"] == task["nodes"][0]["attempts"][0]["batch_id"]
        with f.server.client() as c:
            echoed = c.get("/healthz", headers={"X-Request-ID": "trace-me-123"})
            fresh = c.get("/healthz")
        assert echoed.headers["x-request-id"] == "trace-me-123"
        assert fresh.headers["x-request-id"].startswith("req_")


def test_tasks_watch_in_a_terminal_shows_the_final_states(tmp_path: Path) -> None:
    with Fleet(tmp_path) as f:
        f.agent("watched")
        dag = {
            "nodes": [
                {"id": "first", "commands": [shell(["sleep", "0.5"])]},
                {"id": "second", "commands": [shell(["false"])]},
                {"id": "third", "commands": [shell(["true"])]},
            ],
            "edges": [{"from": "first", "to": "second"}, {"from": "second", "to": "third"}],
        }
        task = f.submit(dag)
        env = child_env(
            ORRERY_URL=f.server.url, ORRERY_API_KEY=f.server.api_key, COLUMNS="120", LINES="40", TERM="xterm-256color"
        )
        main, child = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "tasks", "watch", task["id"]],
            stdin=child,
            stdout=child,
            stderr=child,
            env=env,
            cwd=ROOT,
            close_fds=True,
        )
        os.close(child)
        screen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1)
            if ready:
                try:
                    chunk = os.read(main, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                screen += chunk
            elif proc.poll() is not None:
                break
        proc.wait(10)
        os.close(main)
        text = screen.decode("utf-8", "replace")
        assert "✔ first" in text and "✘ second" in text and "↷ third" in text
        assert "3/3 nodes finished" in text
        assert proc.returncode == 1  # the task failed
