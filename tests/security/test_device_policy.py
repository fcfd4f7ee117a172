"""The device owner's protections, end to end: the orchestrator asks, the agent's policy refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Agent, Fleet, child_env, shell, wait_until

SECRET = "correct-horse-battery-staple"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Agent, Path]]:
    tmp = tmp_path_factory.mktemp("policy")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not touch\n")
    with Fleet(tmp) as f:
        enrolled = f.enroll("guarded", {"pool": "guarded"})
        agent = Agent(
            "guarded",
            enrolled["id"],
            enrolled["token"],
            tmp / "agents" / "guarded",
            f.server.url,
            {"pool": "guarded"},
            child_env(
                ORRERY_AGENT_TOKEN=enrolled["token"],
                ORRERY_AGENT_SHELL_DENY='["rm"]',
                ORRERY_AGENT_APPROVAL_REQUIRED='["files.delete"]',
                AWS_SECRET_ACCESS_KEY=SECRET,
            ),
        )
        f.agents.append(agent)
        agent.workspace.mkdir(parents=True)
        (agent.workspace / "escape").symlink_to(outside / "secret.txt")
        (agent.workspace / "escape-dir").symlink_to(outside, target_is_directory=True)
        agent.start()
        f.wait_device(agent.device_id, "idle")
        yield f, agent, outside


def run(f: Fleet, *commands: dict[str, Any], pool: str = "guarded") -> dict[str, Any]:
    task = f.submit({"nodes": [{"id": "n", "placement": {"labels": {"pool": pool}}, "commands": list(commands)}]})
    node: dict[str, Any] = f.node(f.wait_task(task["id"]), "n")
    return node


def files(tool: str, **args: Any) -> dict[str, Any]:
    return {"tool": f"files.{tool}", "arguments": args}


@pytest.mark.parametrize(
    "command",
    [
        files("read", path="../../../etc/passwd"),
        files("read", path="/etc/passwd"),
        files("read", path="escape"),
        files("write", path="escape", content="pwned"),
        files("write", path="escape-dir/new.txt", content="pwned"),
        files("list", path="escape-dir"),
        shell(["cat", "secret.txt"], cwd="escape-dir"),
    ],
)
def test_paths_out_of_the_workspace_are_policy_denied_and_touch_nothing(
    env: tuple[Fleet, Agent, Path], command: dict[str, Any]
) -> None:
    f, _agent, outside = env
    node = run(f, command)
    assert node["state"] == "failed"
    assert node["error"]["code"] == "policy_denied"
    assert (outside / "secret.txt").read_text() == "do not touch\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_shell_metacharacters_in_arguments_are_passed_literally(env: tuple[Fleet, Agent, Path]) -> None:
    f, agent, _ = env
    payload = "a; touch pwned1 && $(touch pwned2) `touch pwned3` | touch pwned4 > pwned5 '\""
    node = run(f, shell(["echo", payload]))
    assert node["state"] == "succeeded"
    assert node["output"]["stdout"] == payload + "\n"
    assert not [p for p in agent.workspace.iterdir() if p.name.startswith("pwned")]


def test_a_denied_program_is_refused(env: tuple[Fleet, Agent, Path]) -> None:
    f, agent, _ = env
    (agent.workspace / "keep.txt").write_text("keep")
    node = run(f, shell(["rm", "keep.txt"]))
    assert node["error"]["code"] == "policy_denied"
    assert (agent.workspace / "keep.txt").exists()


def test_a_tool_needing_approval_waits_and_a_denial_keeps_the_file(env: tuple[Fleet, Agent, Path]) -> None:
    """While attended, a tool on approval_required is not run until a person decides (issue 18);
    denied, it never runs."""
    f, agent, _ = env
    (agent.workspace / "precious.txt").write_text("keep")
    dag = {
        "nodes": [
            {
                "id": "n",
                "placement": {"labels": {"pool": "guarded"}},
                "commands": [files("delete", path="precious.txt")],
            }
        ]
    }
    task_id = f.submit(dag)["id"]
    with f.server.client() as c:
        approval = wait_until(
            lambda: c.get("/v1/approvals", params={"task_id": task_id, "state": "pending"}).json()["items"],
            30,
            "the delete to wait for approval",
        )[0]
        assert (agent.workspace / "precious.txt").exists()
        assert c.post(f"/v1/approvals/{approval['id']}/deny").status_code == 200
    node = f.wait_task(task_id)["nodes"][0]
    assert node["error"]["code"] == "approval_denied"
    assert (agent.workspace / "precious.txt").exists()


def test_child_processes_do_not_inherit_secrets(env: tuple[Fleet, Agent, Path]) -> None:
    f, agent, _ = env
    node = run(f, shell(["env"]))
    assert node["state"] == "succeeded"
    out = node["output"]["stdout"]
    assert SECRET not in out and "AWS_SECRET_ACCESS_KEY" not in out
    assert agent.token not in out and "ORRERY_AGENT_TOKEN" not in out


def test_the_audit_log_records_every_call_without_arguments_or_content(env: tuple[Fleet, Agent, Path]) -> None:
    f, agent, _ = env
    typed = "typed-text-canary-4711"
    node = run(f, files("write", path="note.txt", content=typed), shell(["echo", typed]))
    assert node["state"] == "succeeded"
    text = (agent.data_dir / "audit.jsonl").read_text()
    assert typed not in text and SECRET not in text and agent.token not in text
    entries = [json.loads(line) for line in text.splitlines()]
    batch = node["attempts"][0]["batch_id"]
    mine = [e for e in entries if e.get("batch_id") == batch]
    # Each call: its intent line before it runs, its outcome line after (issue 18).
    assert [(e["tool"], e["phase"]) for e in mine] == [
        ("files.write", "intent"),
        ("files.write", "outcome"),
        ("shell.run", "intent"),
        ("shell.run", "outcome"),
    ]
    outcomes = [e for e in mine if e["phase"] == "outcome"]
    assert all({"ts", "batch_id", "call_id", "tool", "decision", "duration_ms", "status"} <= set(e) for e in outcomes)
    assert all({"ts", "batch_id", "call_id", "tool", "decision"} <= set(e) for e in mine)
    denied = [e for e in entries if e["decision"] == "denied"]
    assert denied and all(e.get("error_code") in ("policy_denied", "approval_denied") for e in denied)
    assert any(e.get("error_code") == "approval_denied" and "approval" in e["reason"] for e in denied)
    assert oct((agent.data_dir / "audit.jsonl").stat().st_mode & 0o777) == "0o600"


def test_the_kill_switch_stops_action_tools_but_not_read_only_ones(tmp_path: Path) -> None:
    with Fleet(tmp_path) as f:
        f.agent("switched", {"pool": "switched"}, ORRERY_AGENT_KILL_SWITCH="1")
        refused = run(f, shell(["touch", "x"]), pool="switched")
        allowed = run(f, {"tool": "system.info", "arguments": {}}, pool="switched")
        assert refused["error"]["code"] == "policy_denied" and "kill switch" in refused["error"]["message"]
        assert allowed["state"] == "succeeded"


def test_an_unattended_agent_runs_tools_that_need_approval(tmp_path: Path) -> None:
    with Fleet(tmp_path) as f:
        agent = f.agent(
            "unattended", {"pool": "u"}, extra_args=["--unattended"], ORRERY_AGENT_APPROVAL_REQUIRED='["files.delete"]'
        )
        (agent.workspace / "gone.txt").write_text("x")
        assert run(f, files("delete", path="gone.txt"), pool="u")["state"] == "succeeded"
        assert not (agent.workspace / "gone.txt").exists()
