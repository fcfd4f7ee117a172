"""Diagnoses that name the real cause, as a new user meets them through the CLI: a device whose
agent never connected, a device that is offline, stopped or cordoned, an agent that stopped cleanly
(offline at once, not `idle` until the heartbeat timeout), and an https URL for a plain-http
server. Real server, real agents, the CLI as a subprocess."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Agent, Fleet, child_env, run_cli, shell, wait_until


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    # The default liveness timers (heartbeat 10 s, offline after 50 s): a device that reads offline
    # within seconds of its agent stopping was told so, not timed out.
    with Fleet(tmp_path_factory.mktemp("diagnoses")) as f:
        yield f


def orrery(fleet: Fleet, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(fleet, *args, columns=400, **env)


def dag_file(tmp: Path, labels: dict[str, str], name: str = "dag.json") -> Path:
    path = tmp / name
    node = {"id": "probe", "kind": "tool", "placement": {"labels": labels}, "commands": [shell(["true"])]}
    path.write_text(json.dumps({"nodes": [node], "edges": []}))
    return path


def post(fleet: Fleet, path: str, body: dict[str, Any] | None = None) -> None:
    with fleet.server.client() as c:
        r = c.post(path, json=body or {})
        assert r.status_code < 300, r.text


# ---------------------------------------------------------------- a device never connected


def test_a_never_connected_device_is_named_with_how_to_start_its_agent(fleet: Fleet, tmp_path: Path) -> None:
    fleet.agent("web-1", {"role": "web"})  # some device offers shell.run, so the tool is known
    fleet.enroll("cache-1", {"role": "cache"})  # enrolled; its agent was never started
    dag = dag_file(tmp_path, {"role": "cache"})

    checked = orrery(fleet, "validate", str(dag))
    assert checked.returncode == 1, checked
    out = checked.stdout
    assert "cache-1: never connected, so its tools are unknown" in out, out
    assert "cache-1 has never connected" in out, out
    assert "ORRERY_AGENT_TOKEN=" in out and "orrery agent --server" in out, out
    assert "no tool shell.run" not in out and "Enroll or label" not in out, out

    # `submit` refuses it the same way, with the same diagnosis (its tools are not known yet).
    submitted = orrery(fleet, "submit", str(dag))
    assert submitted.returncode == 1, submitted
    assert "cache-1 has never connected" in submitted.stderr, submitted.stderr
    assert "orrery agent --server" in submitted.stderr, submitted.stderr

    # A tool no connected device offers: it may well be on cache-1, whose tools are not known yet.
    other = tmp_path / "other.json"
    node = {"id": "flush", "placement": {"labels": {"role": "cache"}}, "commands": [{"tool": "cache.flush"}]}
    other.write_text(json.dumps({"nodes": [node], "edges": []}))
    checked = orrery(fleet, "validate", str(other))
    assert checked.returncode == 1, checked
    assert "unknown_tool" in checked.stdout and "cache-1 has never connected" in checked.stdout, checked.stdout
    submitted = orrery(fleet, "submit", str(other))
    assert submitted.returncode == 1 and "cache-1 has never connected" in submitted.stderr, submitted


# ---------------------------------------------------------------- a clean shutdown, then offline


def test_a_cleanly_stopped_agent_reads_offline_at_once_and_validate_says_the_node_waits(
    fleet: Fleet, tmp_path: Path
) -> None:
    db = fleet.agent("db-1", {"role": "db"})
    db.stop()  # SIGTERM: the agent says goodbye
    began = time.monotonic()
    fleet.wait_device(db.device_id, "offline", timeout=10)  # not idle until the 50 s timeout
    assert time.monotonic() - began < 10
    assert "is offline (its agent stopped)" in fleet.server.log()

    dag = dag_file(tmp_path, {"role": "db"})
    checked = orrery(fleet, "validate", str(dag))
    assert checked.returncode == 0, checked  # accepted: the node waits for the device
    out = checked.stdout
    assert "no_device_available" in out, out
    assert "db-1 is offline since " in out, out
    assert "queue_timeout_s=300" in out, out

    # `submit` accepts it with the same warning (on stderr).
    submitted = orrery(fleet, "submit", str(dag))
    assert submitted.returncode == 0, submitted
    assert "db-1 is offline since " in submitted.stderr, submitted.stderr


# ---------------------------------------------------------------- stopped and cordoned


def test_stopped_and_cordoned_devices_are_named_with_their_state(fleet: Fleet, tmp_path: Path) -> None:
    agent: Agent = fleet.agent("edge-1", {"role": "edge"})
    dag = dag_file(tmp_path, {"role": "edge"})
    post(fleet, f"/v1/devices/{agent.device_id}/stop", {"reason": "disk swap"})
    fleet.wait_device(agent.device_id, "stopped")
    checked = orrery(fleet, "validate", str(dag))
    assert checked.returncode == 0, checked
    assert "edge-1 is stopped by an operator" in checked.stdout and "disk swap" in checked.stdout, checked.stdout
    assert "operator (stopped by an operator" not in checked.stdout, checked.stdout
    assert "queue_timeout_s=300" in checked.stdout, checked.stdout

    post(fleet, f"/v1/devices/{agent.device_id}/resume")
    post(fleet, f"/v1/devices/{agent.device_id}/cordon")
    wait_until(lambda: fleet.device(agent.device_id)["state"] == "cordoned", 30, "edge-1 cordoned")
    checked = orrery(fleet, "validate", str(dag))
    assert "edge-1 is cordoned" in checked.stdout, checked.stdout

    post(fleet, f"/v1/devices/{agent.device_id}/uncordon")
    fleet.wait_device(agent.device_id, "idle")
    checked = orrery(fleet, "validate", str(dag))
    assert "no_device_available" not in checked.stdout, checked.stdout  # in service: no warning


# ---------------------------------------------------------------- https against plain http


def test_the_cli_says_the_server_does_not_speak_tls(fleet: Fleet) -> None:
    https = fleet.server.url.replace("http://", "https://")
    result = orrery(fleet, "devices", "list", ORRERY_URL=https)
    assert result.returncode == 1, result
    assert "answered, but not with TLS" in result.stderr, result.stderr
    assert "--tls-cert" in result.stderr and "http://" in result.stderr, result.stderr
    assert "is `orrery serve` running?" not in result.stderr, result.stderr


def test_the_agent_says_once_that_the_server_does_not_speak_tls(fleet: Fleet) -> None:
    enrolled = fleet.enroll("tls-1")
    agent = Agent(
        "tls-1",
        enrolled["id"],
        enrolled["token"],
        fleet.tmp / "agents" / "tls-1",
        fleet.server.url.replace("http://", "https://"),
        {},
        child_env(),
        ["--log-level", "debug"],
    )
    fleet.agents.append(agent)
    agent.start()
    # Retries go on with backoff (the server may be reconfigured): two more attempts after the first.
    wait_until(lambda: agent.log().count("still no TLS") >= 2, 30, "the agent to retry")
    log = agent.log()
    assert log.count("answered, but not with TLS") == 1, log
    assert "--tls-cert" in log, log
    assert "WRONG_VERSION_NUMBER" not in log, log
    assert agent.proc is not None and agent.proc.poll() is None  # still running, still retrying
