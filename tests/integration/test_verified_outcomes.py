"""Verified outcomes end to end (issue 20) with real agents: an agent `kill -9`ed in the middle of
a command, then back, and the node's verify commands (the probe) decide whether it succeeded,
also across a `kill -9` of the orchestrator while the node waits for its device."""

from __future__ import annotations

from pathlib import Path

from tests.support import Agent, Fleet, shell, wait_until

SLOW = shell(["sh", "-c", "touch started; sleep 60; touch done"])


def pinned(verify_path: str) -> dict[str, object]:
    return {
        "nodes": [
            {
                "id": "upgrade",
                "placement": {"device": "box"},
                "commands": [SLOW],
                "verify": [{"tool": "files.read", "arguments": {"path": verify_path}}],
            },
            {"id": "after", "placement": {"device": "box"}, "commands": [shell(["true"])]},
        ],
        "edges": [{"from": "upgrade", "to": "after"}],
    }


def node(fleet: Fleet, task_id: str, node_id: str = "upgrade") -> dict[str, object]:
    return fleet.node(fleet.task(task_id), node_id)


def kill_mid_command(agent: Agent) -> None:
    wait_until((agent.workspace / "started").exists, 30, "the command to start on the device")
    agent.kill()  # kill -9: the agent and the command it runs


def test_the_probe_decides_success_when_the_killed_agent_is_back_even_after_an_orchestrator_restart(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, heartbeat_interval_s="1", heartbeat_timeout_s="4") as fleet:
        box = fleet.agent("box")
        task = fleet.submit(pinned("started"))["id"]
        kill_mid_command(box)
        wait_until(
            lambda: (n := node(fleet, task))["state"] == "verifying" and n["verification"]["state"] == "probing",
            30,
            "the node to wait for its device to be probed",
        )
        assert node(fleet, task, "after")["state"] == "pending"  # no success edge fires meanwhile
        fleet.server.kill()  # kill -9 of the orchestrator while it waits
        fleet.server.start()
        assert node(fleet, task)["state"] == "verifying"
        box.start()
        done = fleet.wait_task(task, timeout=60)
        upgrade = fleet.node(done, "upgrade")
        assert done["state"] == "succeeded", upgrade
        assert upgrade["verification"]["state"] == "passed"
        assert upgrade["verification"]["after"] == "unknown"
        assert [(a["kind"], a["status"]) for a in upgrade["attempts"]] == [("tool", "failed"), ("verify", "succeeded")]
        assert upgrade["attempts"][0]["error"]["code"] == "device_lost"
        assert not (box.workspace / "done").exists()  # it was decided, not run again


def test_the_probe_decides_failure_when_the_work_did_not_take_effect(tmp_path: Path) -> None:
    with Fleet(tmp_path, heartbeat_interval_s="1", heartbeat_timeout_s="4") as fleet:
        box = fleet.agent("box")
        task = fleet.submit(pinned("done"))["id"]
        kill_mid_command(box)
        box.start()  # back at once: its ledger reports the command `uncertain`, or the device was lost
        done = fleet.wait_task(task, timeout=60)
        upgrade = fleet.node(done, "upgrade")
        assert (done["state"], upgrade["state"]) == ("failed", "failed")
        assert upgrade["error"]["code"] == "verification_failed"
        assert "had not taken effect" in upgrade["error"]["message"]
        assert "files.read" in upgrade["error"]["message"]
        assert fleet.node(done, "after")["state"] == "skipped"
        assert sum(1 for a in upgrade["attempts"] if a["kind"] == "tool") == 1  # never run twice
