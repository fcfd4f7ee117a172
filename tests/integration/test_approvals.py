"""Approvals end to end (issue 18): real orchestrator and agent processes on loopback.

A command whose tool is on the agent's `approval_required` list waits (node `waiting_approval`)
until an operator approves (it runs), denies (`approval_denied`, it never ran) or nobody decides
within `approval_timeout_s` (`approval_timeout`). Pending approvals survive an orchestrator
restart and an agent killed with SIGKILL, and a device whose owner requires it takes decisions
only at the device (`orrery agent approve ID`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Agent, Fleet, run_cli, wait_until

APPROVE_WRITES = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["files.write"]'}


def write(path: str, content: str = "ran\n") -> dict[str, Any]:
    return {"tool": "files.write", "arguments": {"path": path, "content": content}}


def one_node(device: str, *commands: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "n1", "placement": {"device": device}, "commands": list(commands), **spec}], "edges": []}


def pending(fleet: Fleet, task_id: str) -> dict[str, Any]:
    """The task's one pending approval, once its node shows `waiting_approval`."""

    def found() -> dict[str, Any] | None:
        with fleet.server.client() as c:
            items = c.get("/v1/approvals", params={"state": "pending", "task_id": task_id}).json()["items"]
        node = fleet.node(fleet.task(task_id), "n1")
        return items[0] if items and node["state"] == "waiting_approval" else None

    return wait_until(found, 30, f"a pending approval of task {task_id}")


def events(fleet: Fleet, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    with fleet.server.client() as c:
        text = c.get(f"/v1/tasks/{task_id}/events", params={"after": 0}, timeout=30).text
    out, kind = [], ""
    for line in text.splitlines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            out.append((kind, json.loads(line[6:])))
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("approvals")) as f:
        f.agent("desk", **APPROVE_WRITES)
        yield f


def test_approved_command_runs_after_the_decision_and_the_stream_says_so(fleet: Fleet) -> None:
    agent = fleet.agents[0]
    task = fleet.submit(one_node("desk", write("approved.txt")))
    approval = pending(fleet, task["id"])
    assert approval["tool"] == "files.write"
    assert approval["arguments"] == {"path": "approved.txt", "content": "ran\n"}
    assert approval["device_id"] == agent.device_id and approval["node_id"] == "n1"
    assert approval["expires_at"] > approval["created_at"]
    assert not (agent.workspace / "approved.txt").exists()  # nothing ran while it waits

    with fleet.server.client() as c:
        r = c.post(f"/v1/approvals/{approval['id']}/approve", json={"reason": "looks right"})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "approved" and r.json()["decision_reason"] == "looks right"
    done = fleet.wait_task(task["id"])
    assert done["state"] == "succeeded", done
    assert (agent.workspace / "approved.txt").read_text() == "ran\n"

    seen = events(fleet, task["id"])
    states = [d["state"] for k, d in seen if k == "node.state"]
    assert states[states.index("running") :] == ["running", "waiting_approval", "running", "succeeded"]
    requested = [d for k, d in seen if k == "approval.requested"]
    decided = [d for k, d in seen if k == "approval.decided"]
    assert [d["approval_id"] for d in requested] == [approval["id"]]
    assert [(d["approval_id"], d["decision"]) for d in decided] == [(approval["id"], "approved")]


def test_denied_command_never_runs_and_its_node_fails_with_approval_denied(fleet: Fleet) -> None:
    agent = fleet.agents[0]
    task = fleet.submit(one_node("desk", write("denied.txt"), retry={"max_attempts": 3}))
    approval = pending(fleet, task["id"])
    with fleet.server.client() as c:
        r = c.post(f"/v1/approvals/{approval['id']}/deny", json={"reason": "not on a Friday"})
        assert r.status_code == 200, r.text
        again = c.post(f"/v1/approvals/{approval['id']}/approve")
    assert again.status_code == 409 and again.json()["code"] == "conflict"  # the first decision stands
    done = fleet.wait_task(task["id"])
    node = fleet.node(done, "n1")
    assert done["state"] == "failed"
    assert node["error"]["code"] == "approval_denied", node
    assert "not on a Friday" in node["error"]["message"]
    assert len(node["attempts"]) == 1  # a denial is final: not retried
    assert not (agent.workspace / "denied.txt").exists()


def test_roles_and_bad_requests(fleet: Fleet) -> None:
    with fleet.server.client() as c:
        viewer = c.post("/v1/api-keys", json={"name": "v", "role": "viewer"}).json()["key"]
    task = fleet.submit(one_node("desk", write("roles.txt")))
    approval = pending(fleet, task["id"])
    with fleet.server.client(viewer) as v:
        assert v.get(f"/v1/approvals/{approval['id']}").status_code == 200  # a viewer may look
        r = v.post(f"/v1/approvals/{approval['id']}/approve")
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
    with fleet.server.client() as c:
        assert c.post("/v1/approvals/apr_nope/approve").json()["code"] == "not_found"
        bad = c.post(f"/v1/approvals/{approval['id']}/deny", json={"reason": 7})
        assert bad.status_code == 422, bad.text
        extra = c.post(f"/v1/approvals/{approval['id']}/deny", json={"why": "x"})
        assert extra.status_code == 422, extra.text
        assert c.get("/v1/approvals", params={"state": "maybe"}).status_code == 422
        assert c.get("/v1/approvals", params={"cursor": "garbage"}).json()["code"] == "bad_request"
        assert c.get(f"/v1/approvals/{approval['id']}").json()["state"] == "pending"  # bad input changed nothing
        c.post(f"/v1/approvals/{approval['id']}/deny")
    assert fleet.wait_task(task["id"])["state"] == "failed"


def test_cli_lists_and_decides(fleet: Fleet) -> None:
    agent = fleet.agents[0]
    task = fleet.submit(one_node("desk", write("cli.txt")))
    approval = pending(fleet, task["id"])
    listed = run_cli(fleet, "approvals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert approval["id"] in [a["id"] for a in json.loads(listed.stdout)["items"]]
    shown = run_cli(fleet, "approvals", "list")
    assert approval["id"] in shown.stdout and "files.write" in shown.stdout
    ok = run_cli(fleet, "approvals", "approve", approval["id"], "--reason", "fine")
    assert ok.returncode == 0, ok.stderr
    assert fleet.wait_task(task["id"])["state"] == "succeeded"
    assert (agent.workspace / "cli.txt").exists()
    twice = run_cli(fleet, "approvals", "deny", approval["id"])
    assert twice.returncode != 0 and "already approved" in twice.stderr


def test_approval_request_tool_waits_like_any_approval(fleet: Fleet) -> None:
    ask = {"tool": "approval.request", "arguments": {"reason": "about to wipe the cache"}}
    task = fleet.submit(one_node("desk", ask, {"tool": "system.echo", "arguments": {"text": "after"}}))
    approval = pending(fleet, task["id"])
    assert approval["tool"] == "approval.request" and approval["reason"] == "about to wipe the cache"
    with fleet.server.client() as c:
        c.post(f"/v1/approvals/{approval['id']}/approve")
    done = fleet.wait_task(task["id"])
    assert done["state"] == "succeeded", done
    results = fleet.node(done, "n1")["attempts"][-1]["results"]
    assert results[0]["result"]["approved"] is True
    assert results[1]["result"]["text"] == "after"


def test_nobody_decides_approval_timeout(tmp_path: Path) -> None:
    with Fleet(tmp_path, approval_timeout_s="1.5") as fleet:
        agent = fleet.agent("desk", **APPROVE_WRITES)
        task = fleet.submit(one_node("desk", write("late.txt")))
        done = fleet.wait_task(task["id"])
        node = fleet.node(done, "n1")
        assert node["error"]["code"] == "approval_timeout", node
        with fleet.server.client() as c:
            items = c.get("/v1/approvals", params={"task_id": task["id"]}).json()["items"]
        assert [a["state"] for a in items] == ["expired"]
        assert not (agent.workspace / "late.txt").exists()


def test_pending_approvals_survive_an_orchestrator_restart_and_an_agent_kill(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        agent = fleet.agent("desk", **APPROVE_WRITES)
        task = fleet.submit(one_node("desk", write("first.txt"), write("second.txt", "two\n")))
        first = pending(fleet, task["id"])
        with fleet.server.client() as c:
            c.post(f"/v1/approvals/{first['id']}/approve")
        wait_until((agent.workspace / "first.txt").exists, 30, "the first command to run")
        second = pending(fleet, task["id"])  # the batch's second command waits in turn
        assert second["id"] != first["id"] and second["arguments"]["path"] == "second.txt"

        fleet.server.kill()  # kill -9 while the device waits
        fleet.server.start()
        assert pending(fleet, task["id"])["id"] == second["id"]
        agent.kill()  # and the agent too: its ledger keeps the approval
        agent.start()
        wait_until(lambda: fleet.device(agent.device_id)["state"] in ("busy", "idle"), 30, "the agent back")
        assert pending(fleet, task["id"])["id"] == second["id"]
        assert not (agent.workspace / "second.txt").exists()

        with fleet.server.client() as c:
            r = c.post(f"/v1/approvals/{second['id']}/approve")
            assert r.status_code == 200, r.text
        done = fleet.wait_task(task["id"])
        assert done["state"] == "succeeded", done
        assert (agent.workspace / "first.txt").read_text() == "ran\n"  # ran once, not again after the restarts
        assert (agent.workspace / "second.txt").read_text() == "two\n"
        results = fleet.node(done, "n1")["attempts"][-1]["results"]
        assert [r["status"] for r in results] == ["success", "success"]


def owner(agent: Agent, *args: str) -> Any:
    return run_cli(None, "agent", *args, "--data-dir", str(agent.data_dir))


def test_local_only_approvals_are_decided_at_the_device(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        agent = fleet.agent("desk", ORRERY_AGENT_APPROVALS_LOCAL_ONLY="true", **APPROVE_WRITES)
        task = fleet.submit(one_node("desk", write("local.txt")))
        approval = pending(fleet, task["id"])
        assert approval["local_only"] is True
        with fleet.server.client() as c:
            r = c.post(f"/v1/approvals/{approval['id']}/approve")
        assert r.status_code == 403 and r.json()["code"] == "approval_local_only", r.text
        assert f"orrery agent approve {approval['id']}" in r.json()["detail"]

        listed = owner(agent, "approvals")
        assert listed.returncode == 0 and approval["id"] in listed.stdout, listed.stderr
        ok = owner(agent, "approve", approval["id"], "--reason", "I am at the desk")
        assert ok.returncode == 0, ok.stderr
        done = fleet.wait_task(task["id"])
        assert done["state"] == "succeeded", done
        assert (agent.workspace / "local.txt").exists()
        with fleet.server.client() as c:
            seen = c.get(f"/v1/approvals/{approval['id']}").json()
        assert seen["state"] == "approved" and "at the device" in seen["decided_by"]
        assert seen["decision_reason"] == "I am at the desk"
        assert owner(agent, "approve", approval["id"]).returncode == 1  # decided already
        assert owner(agent, "deny", "apr_none").returncode == 1


def test_an_approval_is_not_needed_when_unattended(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        agent = fleet.agent("desk", extra_args=["--unattended"], **APPROVE_WRITES)
        done = fleet.wait_task(fleet.submit(one_node("desk", write("free.txt")))["id"])
        assert done["state"] == "succeeded", done
        assert (agent.workspace / "free.txt").exists()
        with fleet.server.client() as c:
            assert c.get("/v1/approvals").json()["items"] == []


def test_the_approvals_endpoints_need_a_key(fleet: Fleet) -> None:
    r = httpx.get(f"{fleet.server.url}/v1/approvals")
    assert r.status_code == 401


def test_a_history_pages_newest_first(fleet: Fleet) -> None:
    for name in ("h1.txt", "h2.txt", "h3.txt"):
        task = fleet.submit(one_node("desk", write(name)))
        with fleet.server.client() as c:
            c.post(f"/v1/approvals/{pending(fleet, task['id'])['id']}/deny")
        fleet.wait_task(task["id"])
    with fleet.server.client() as c:
        oldest = [a["id"] for a in c.get("/v1/approvals", params={"limit": 500}).json()["items"]]
        newest, cursor = [], None
        while True:
            params = {"order": "newest", "limit": 2, **({"cursor": cursor} if cursor else {})}
            page = c.get("/v1/approvals", params=params).json()
            newest += [a["id"] for a in page["items"]]
            if not (cursor := page["next_cursor"]):
                break
        assert c.get("/v1/approvals", params={"order": "sideways"}).status_code == 422
    assert len(oldest) >= 3 and newest == oldest[::-1]


def test_nobody_is_asked_to_approve_what_the_kill_switch_refuses_anyway(tmp_path: Path) -> None:
    with Fleet(tmp_path) as fleet:
        agent = fleet.agent("desk", **APPROVE_WRITES)
        assert owner(agent, "kill-switch", "on").returncode == 0
        done = fleet.wait_task(fleet.submit(one_node("desk", write("switched.txt")))["id"])
        node = fleet.node(done, "n1")
        assert node["error"]["code"] == "policy_denied" and "kill switch" in node["error"]["message"]
        with fleet.server.client() as c:
            assert c.get("/v1/approvals", params={"task_id": done["id"]}).json()["items"] == []
        assert owner(agent, "kill-switch", "off").returncode == 0
        task = fleet.submit(one_node("desk", write("switched.txt")))
        assert pending(fleet, task["id"])["tool"] == "files.write"  # asked once the switch is off
        assert not (agent.workspace / "switched.txt").exists()
