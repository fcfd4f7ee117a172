"""Third-party MCP servers configured in the agent's TOML file, driven through the orchestrator."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT, Agent, Fleet, child_env, wait_until

NPM_PACKAGE = "@modelcontextprotocol/server-filesystem@2026.8.31"
EVERYTHING_PACKAGE = "@modelcontextprotocol/server-everything@2026.8.31"
NPM_PREFIX = Path(os.environ.get("ORRERY_TEST_NPM_PREFIX", ROOT / ".ci" / "npm"))


def npm_server(package: str, binary_name: str) -> Path:
    """An MCP server from npm (installed by .ci/run; installed here if missing)."""
    binary = NPM_PREFIX / "node_modules" / ".bin" / binary_name
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            if os.environ.get("CI"):
                raise AssertionError("npm is required in CI for the third-party MCP server tests")
            pytest.skip("npm is not installed")
        subprocess.run(
            [npm, "install", "--silent", "--prefix", str(NPM_PREFIX), package],
            check=True,
            timeout=600,
            capture_output=True,
        )
    return binary


def filesystem_server() -> Path:
    return npm_server(NPM_PACKAGE, "mcp-server-filesystem")


def everything_server() -> Path:
    return npm_server(EVERYTHING_PACKAGE, "mcp-server-everything")


def venv_tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is a test dependency (pip install -e '.[test]')"
    return str(path)


def agent_with(fleet: Fleet, name: str, toml: str) -> Agent:
    enrolled = fleet.enroll(name, {"kind": name})
    data = fleet.tmp / "agents" / name
    data.mkdir(parents=True, exist_ok=True)
    config = data / "agent.toml"
    config.write_text(toml)
    agent = Agent(
        name, enrolled["id"], enrolled["token"], data, fleet.server.url, {}, child_env(), ["--config", str(config)]
    )
    fleet.agents.append(agent)
    return agent.start()


def test_a_dag_calls_tools_of_real_third_party_mcp_servers(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("from a third-party server\n")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "new.txt").write_text("x")
    toml = f"""
[agent]
toolsets = ["system"]

[[agent.mcp_servers]]
namespace = "time"
command = "{venv_tool("mcp-server-time")}"
args = ["--local-timezone", "UTC"]

[[agent.mcp_servers]]
namespace = "git"
command = "{venv_tool("mcp-server-git")}"
args = ["--repository", "{repo}"]

[[agent.mcp_servers]]
namespace = "fs"
command = "{filesystem_server()}"
args = ["{shared}"]
read_only_tools = ["read_text_file", "list_directory"]
# The filesystem server works in the client's MCP roots (the agent's workspace by default)
# instead of the directories on its command line: point it at the shared directory.
roots = ["{shared}"]
"""
    with Fleet(tmp_path) as f:
        agent = agent_with(f, "third-party", toml)
        f.wait_device(agent.device_id, "idle")
        tools = {t["name"] for t in f.device(agent.device_id)["tools"]}
        assert {"time.get_current_time", "git.git_status", "fs.read_text_file"} <= tools
        dag = {
            "nodes": [
                {
                    "id": "n",
                    "placement": {"labels": {"kind": "third-party"}},
                    "commands": [
                        {"tool": "time.get_current_time", "arguments": {"timezone": "UTC"}},
                        {"tool": "git.git_status", "arguments": {"repo_path": str(repo)}},
                        {"tool": "fs.read_text_file", "arguments": {"path": str(shared / "hello.txt")}},
                    ],
                }
            ]
        }
        done = f.wait_task(f.submit(dag)["id"])
        node = done["nodes"][0]
        assert done["state"] == "succeeded", node
        results = [r["result"] for r in node["attempts"][0]["results"]]
        assert "UTC" in str(results[0])
        assert "new.txt" in str(results[1])
        assert "from a third-party server" in str(results[2])


def test_a_killed_server_fails_the_call_is_restarted_and_its_new_tools_are_announced(tmp_path: Path) -> None:
    state = tmp_path / "slow-state"
    state.mkdir()
    toml = f"""
[agent]
toolsets = ["system"]

[[agent.mcp_servers]]
namespace = "slow"
command = "{sys.executable}"
args = ["{ROOT / "tests" / "fixtures" / "slow_mcp.py"}"]
env = {{ SLOW_MCP_DIR = "{state}", PYTHONPATH = "{ROOT}" }}
"""
    with Fleet(tmp_path) as f:
        agent = agent_with(f, "slow-box", toml)
        f.wait_device(agent.device_id, "idle")
        place = {"labels": {"kind": "slow-box"}}
        task = f.submit(
            {
                "nodes": [
                    {
                        "id": "long",
                        "placement": place,
                        "commands": [{"tool": "slow.sleep", "arguments": {"seconds": 60}}],
                    }
                ]
            }
        )
        wait_until((state / "pid").exists, 30, "the slow call to start")
        (state / "extra").write_text("yes")  # the restarted server will offer one more tool
        os.kill(int((state / "pid").read_text()), signal.SIGKILL)
        done = f.wait_task(task["id"], timeout=30)  # fails at once instead of hanging for 60 s
        node = done["nodes"][0]
        assert node["state"] == "failed" and node["error"]["code"] == "tool_error"
        assert "slow" in node["error"]["message"]
        wait_until(
            lambda: "slow.extra" in {t["name"] for t in f.device(agent.device_id)["tools"]},
            30,
            "the restarted server's tools to reach the orchestrator (tools_changed)",
        )
        again = f.wait_task(
            f.submit(
                {"nodes": [{"id": "quick", "placement": place, "commands": [{"tool": "slow.extra", "arguments": {}}]}]}
            )["id"]
        )
        assert again["state"] == "succeeded" and again["nodes"][0]["output"] == {"result": "extra"}


def test_two_servers_with_one_namespace_are_refused_at_start_up(tmp_path: Path) -> None:
    toml = f"""
[agent]
[[agent.mcp_servers]]
namespace = "time"
command = "{venv_tool("mcp-server-time")}"
[[agent.mcp_servers]]
namespace = "time"
command = "{venv_tool("mcp-server-time")}"
"""
    config = tmp_path / "agent.toml"
    config.write_text(toml)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "device_agent",
            "--server",
            "http://127.0.0.1:9",
            "--token",
            "orrd_dev_x.y",
            "--data-dir",
            str(tmp_path / "a"),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 2
    assert "namespace 'time' is configured twice" in result.stderr


def test_server_everything_gets_the_workspace_as_its_root_a_declined_elicitation_and_no_sampling(
    tmp_path: Path,
) -> None:
    """The agent's MCP client declares roots (the workspace) and elicitation (always declined),
    not sampling: the reference server shows exactly the tools those capabilities allow."""
    toml = f"""
[agent]
toolsets = ["system"]

[[agent.mcp_servers]]
namespace = "everything"
command = "{everything_server()}"
args = ["stdio"]
"""
    with Fleet(tmp_path) as f:
        agent = agent_with(f, "everything", toml)
        f.wait_device(agent.device_id, "idle")
        # The server registers capability-dependent tools after the handshake and announces them.
        tools = wait_until(
            lambda: (
                (names := {t["name"] for t in f.device(agent.device_id)["tools"]})
                >= {"everything.get-roots-list", "everything.trigger-elicitation-request"}
                and names
            ),
            30,
            "the roots and elicitation tools to be announced (tools_changed)",
        )
        assert not {t for t in tools if "sampling" in t}, sorted(tools)  # sampling is not declared
        place = {"labels": {"kind": "everything"}}
        done = f.wait_task(
            f.submit(
                {
                    "nodes": [
                        {
                            "id": "ask",
                            "placement": place,
                            "commands": [
                                {"tool": "everything.get-roots-list", "arguments": {}, "timeout_s": 30},
                                # The server would wait 10 minutes for a person; the agent declines at once.
                                {"tool": "everything.trigger-elicitation-request", "arguments": {}, "timeout_s": 30},
                            ],
                        }
                    ]
                }
            )["id"],
            timeout=60,
        )
        node = done["nodes"][0]
        assert done["state"] == "succeeded", node
        roots, elicited = (str(r["result"]) for r in node["attempts"][0]["results"])
        assert agent.workspace.resolve().as_uri() in roots, roots
        assert "1 total" in roots  # the workspace and nothing else
        assert '"action": "decline"' in elicited, elicited
