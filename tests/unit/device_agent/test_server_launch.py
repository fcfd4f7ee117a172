"""How the agent starts a stdio MCP server (device_agent/launch.py): its own working directory,
npm pinned to it, the agent's environment not passed on, the sandbox's binds. The end-to-end
attacks are in tests/security/test_tool_server_launch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from device_agent.config import BrowserProfile, McpServerConfig
from device_agent.launch import LaunchRefused, stdio_target
from device_agent.sandbox import Limits, Sandbox


def test_launch_settings_pin_npm_and_drop_the_agents_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, ws = tmp_path / "data", tmp_path / "data" / "workspace"
    ws.mkdir(parents=True)
    monkeypatch.setenv("NODE_OPTIONS", "--require /tmp/evil.js")
    monkeypatch.setenv("PATH", f"{ws / 'bin'}:relative/bin:/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(ws))
    server = McpServerConfig(namespace="tiny", command="node", args=["x.js"], env={"PYTHONPATH": "/opt/lib"})
    target = stdio_target(server, ws, data, None)
    env = target.env or {}
    assert target.cwd == str(data / "mcp" / "tiny") and (data / "mcp" / "tiny" / "npm-cache").is_dir()
    assert "NODE_OPTIONS" not in env and env["PYTHONPATH"] == "/opt/lib"  # only what the owner gives
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["HOME"] == str(data / "mcp" / "tiny")  # ~/.npmrc, ~/.local would be workspace files
    assert env["npm_config_userconfig"] == str(data / "mcp" / "tiny" / "npmrc")
    assert env["npm_config_cache"] == str(data / "mcp" / "tiny" / "npm-cache")
    assert env["npm_config_ignore_scripts"] == "true"
    assert (target.command, target.args) == ("node", ["x.js"])


def test_launch_refuses_a_working_directory_in_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(LaunchRefused, match="in the workspace"):
        stdio_target(McpServerConfig(namespace="a", command="node", cwd=ws / "sub"), ws, tmp_path / "data", None)
    # The workspace holds the data dir: the server's own directory would be in the workspace.
    with pytest.raises(LaunchRefused, match="give the agent a data dir outside its workspace"):
        stdio_target(McpServerConfig(namespace="a", command="node"), tmp_path, tmp_path / ".orrery-agent", None)
    box = Sandbox.create(ws, tmp_path / "data", network=False, limits=Limits())
    with pytest.raises(LaunchRefused, match="would show the whole data dir"):
        stdio_target(
            McpServerConfig(namespace="a", command="node", sandbox_readable=[tmp_path]), ws, tmp_path / "data", box
        )


def test_launch_in_the_sandbox_binds_the_servers_own_paths(tmp_path: Path) -> None:
    data, ws = tmp_path / "data", tmp_path / "data" / "workspace"
    ws.mkdir(parents=True)
    box = Sandbox.create(ws, data, network=False, limits=Limits())
    server = McpServerConfig(namespace="web", command="npx", args=["pkg"], sandbox_writable=[data / "web-state"])
    target = stdio_target(server, ws, data, box)
    argv = [target.command, *target.args]
    own = data / "mcp" / "web"
    assert argv[0] == box.bwrap and argv[-2:] == ["npx", "pkg"]
    assert "--share-net" not in argv  # the agent's sandbox_network
    options = " ".join(argv[: argv.index("--")])
    assert f"--tmpfs {data}" in options and f"--bind {ws} {ws}" in options
    assert f"--ro-bind {own} {own}" in options and f"--bind {own / 'npm-cache'} {own / 'npm-cache'}" in options
    assert f"--bind {data / 'web-state'} {data / 'web-state'}" in options and (data / "web-state").is_dir()
    assert f"--chdir {own}" in options
    assert options.index(f"--tmpfs {data}") < options.index(f"--ro-bind {own}")  # shown after the hiding
    networked = stdio_target(server.model_copy(update={"sandbox_network": True}), ws, data, box)
    assert "--share-net" in networked.args


def test_the_browser_profile_starts_outside_the_workspace_with_its_own_binds(tmp_path: Path) -> None:
    data, ws = tmp_path / "data", tmp_path / "data" / "workspace"
    ws.mkdir(parents=True)
    server = BrowserProfile().server(data, ws)
    assert server.cwd is None and server.sandbox_network is True
    assert server.sandbox_writable == [data / "browser"]
    assert server.env["XDG_CACHE_HOME"] == str(data / "browser" / "cache")
    box = Sandbox.create(ws, data, network=False, limits=Limits())
    target = stdio_target(server, ws, data, box)
    assert target.cwd == str(data / "mcp" / "browser")
    assert "--share-net" in target.args and f"--bind {data / 'browser'} {data / 'browser'}" in " ".join(target.args)
    custom = BrowserProfile(env={"npm_config_registry": "https://npm.internal/"}).server(data, ws)
    assert custom.env["npm_config_registry"] == "https://npm.internal/"
