"""How the agent starts a stdio MCP server: where, with what environment, in which sandbox.

Files in the workspace are written by tools (a sandboxed `shell.run`, `files.write`), so nothing
the agent starts outside the sandbox may read them as configuration or code:

- The working directory is the server's own, `<data dir>/mcp/<namespace>/`, never the workspace:
  `npx` reads a project `.npmrc` from its working directory (and from above it, as far as a
  `package.json` or `node_modules`), whose `node-options` would load workspace code into the
  server's Node process; `python -m` puts its working directory on `sys.path`. An owner's `cwd`
  is the owner's choice, but never in the workspace; and the agent's own directory for a server
  is refused when the workspace holds the data dir (the search above would reach the workspace).
- The environment is what the agent passes on (HOME, PATH, USER, LOGNAME, SHELL, TERM: never
  NODE_OPTIONS, PYTHONPATH or anything else of the agent's own), with PATH entries in the
  workspace or relative ones dropped and HOME moved to the server's directory if the workspace
  holds it; npm's user config (not `~/.npmrc`) and cache are the server's own, install scripts
  off (`npm_config_*` variables, which also outrank a project `.npmrc`); then the server's
  configured `env`, which wins (the owner may set NODE_OPTIONS or a registry there).
- With `sandbox = "bwrap"` the server runs in the sandbox (device_agent/sandbox.py): workspace
  writable, data dir hidden but for the server's own directory (read-only) and npm cache
  (writable), its `sandbox_writable`/`sandbox_readable` paths, and its network setting.
"""

from __future__ import annotations

import os
from pathlib import Path

from mcp import StdioServerParameters

from device_agent.config import McpServerConfig
from device_agent.sandbox import Sandbox

SERVERS_DIR = "mcp"
# What a server gets of the agent's environment (the MCP SDK's own default list).
INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


class LaunchRefused(ValueError):
    """The server cannot be started as configured; `str(exc)` says why and what to do."""


def server_dir(data_dir: Path, namespace: str) -> Path:
    return data_dir / SERVERS_DIR / namespace


def inside(path: Path, folder: Path) -> bool:
    return path == folder or path.is_relative_to(folder)


def stdio_target(
    server: McpServerConfig, workspace: Path, data_dir: Path, sandbox: Sandbox | None
) -> StdioServerParameters:
    """The process the agent starts for `server` (it has a `command`); creates its directory."""
    assert server.command is not None
    workspace, data_dir = workspace.resolve(), data_dir.resolve()
    own = server_dir(data_dir, server.namespace)
    cwd = server.cwd.expanduser().resolve() if server.cwd is not None else own
    if inside(cwd, workspace):
        if server.cwd is not None:
            raise LaunchRefused(
                f"MCP server '{server.namespace}': cwd {cwd} is in the workspace {workspace}, where tools "
                "write files it would read as configuration or code; give it a directory outside the workspace"
            )
        raise LaunchRefused(
            f"MCP server '{server.namespace}' would start in {cwd}, inside the workspace {workspace} "
            "(the workspace holds the data dir), where tools write files it would read as configuration "
            "or code; give the agent a data dir outside its workspace (--data-dir)"
        )
    for path in (*server.sandbox_writable, *server.sandbox_readable):
        if inside(data_dir, path.expanduser().resolve()):
            raise LaunchRefused(
                f"MCP server '{server.namespace}': sandbox path {path} would show the whole data dir "
                f"{data_dir} (ledger, audit log, token); name a directory inside it or elsewhere"
            )
    cache = own / "npm-cache"
    npmrc = own / "npmrc"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    npmrc.write_text("")  # empty at every start: npm's user config, the agent's (not ~/.npmrc)
    env = environment(server, workspace, own, npmrc, cache)
    argv = [server.command, *server.args]
    if sandbox is not None:
        writable = [cache, *(p.expanduser().resolve() for p in server.sandbox_writable)]
        for path in writable:
            if inside(path, data_dir):  # the agent's to create; elsewhere it is the owner's
                path.mkdir(parents=True, exist_ok=True, mode=0o700)
        readable = [own, *(p.expanduser().resolve() for p in server.sandbox_readable)]
        if server.cwd is not None:
            readable.append(cwd)
        for path in (*writable, *readable):
            if not path.exists():
                raise LaunchRefused(f"MCP server '{server.namespace}': sandbox path {path} does not exist")
        network = sandbox.network if server.sandbox_network is None else server.sandbox_network
        argv = sandbox.wrap_server(argv, cwd, network=network, writable=writable, readable=readable)
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(cwd))


def environment(server: McpServerConfig, workspace: Path, own: Path, npmrc: Path, cache: Path) -> dict[str, str]:
    """The server's whole environment (the SDK adds nothing it does not also set here)."""
    env = {k: v for k in INHERITED if (v := os.environ.get(k)) is not None and not v.startswith("()")}
    if "PATH" in env:  # a program found in the workspace would be the workspace's code
        kept = [p for p in env["PATH"].split(os.pathsep) if p and os.path.isabs(p)]
        env["PATH"] = os.pathsep.join(p for p in kept if not inside(Path(p).resolve(), workspace))
    if "HOME" in env and inside(Path(env["HOME"]).resolve(), workspace):  # ~/.npmrc, ~/.local, ...
        env["HOME"] = str(own)
    env.update(
        npm_config_userconfig=str(npmrc),
        npm_config_cache=str(cache),
        npm_config_ignore_scripts="true",
        npm_config_update_notifier="false",
    )
    return {**env, **server.env}
