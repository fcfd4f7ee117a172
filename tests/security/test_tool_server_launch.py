"""MCP tool servers never run workspace code, and run in the sandbox: real agents, real npx, real bwrap.

Tools write the workspace (a sandboxed `shell.run`, `files.write`). A server started there reads
it as configuration: npx reads a project `.npmrc`, whose `node-options = --require ./x.js` loads
workspace code into the server's Node process, outside every policy and outside the sandbox, at
the server's next start. The agent starts every stdio server in a directory of its own, with
npm's configuration pinned, and with `sandbox = "bwrap"` inside the sandbox (data dir hidden).

The server here is a tiny stdio MCP server in Node (no network, no npm registry): `npx --yes DIR`
installs it from a local directory, as `npx --yes @playwright/mcp@...` would from the registry.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from device_agent.datadir import AUDIT_NAME, LEDGER_NAME
from tests.integration.test_browser_device import LoopbackPage, browser, browser_agent, node, page, ref
from tests.support import ROOT, Agent, Fleet, child_env, shell, wait_until

__all__ = ["page"]  # the loopback page fixture

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.skipif(shutil.which("npx") is None, reason="Node.js with npx is not installed"),
]

# A stdio MCP server in plain Node: `where` tells its working directory, `probe` reads and writes
# the paths it is given and says what happened (an errno code, or ok).
SERVER_JS = r"""#!/usr/bin/env node
const fs = require('fs');
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const text = (id, t) => send({jsonrpc: '2.0', id, result: {content: [{type: 'text', text: t}]}});
const attempt = (f) => { try { f(); return 'ok'; } catch (e) { return e.code || String(e); } };
const str = {type: 'string'};
const tools = [
  {name: 'where', inputSchema: {type: 'object', properties: {}}},
  {name: 'probe', inputSchema: {type: 'object', properties: {read: str, write: str}}},
];
require('readline').createInterface({input: process.stdin}).on('line', (line) => {
  const msg = JSON.parse(line);
  if (msg.id === undefined) return;
  const p = msg.params || {};
  if (msg.method === 'initialize') {
    send({jsonrpc: '2.0', id: msg.id, result: {protocolVersion: p.protocolVersion,
      capabilities: {tools: {}}, serverInfo: {name: 'tiny', version: '1.0.0'}}});
  } else if (msg.method === 'tools/list') {
    send({jsonrpc: '2.0', id: msg.id, result: {tools}});
  } else if (msg.method === 'tools/call' && p.name === 'where') {
    text(msg.id, JSON.stringify({cwd: process.cwd(), node_options: process.env.NODE_OPTIONS || null}));
  } else if (msg.method === 'tools/call' && p.name === 'probe') {
    const a = p.arguments || {};
    text(msg.id, JSON.stringify({
      read: a.read ? attempt(() => fs.readFileSync(a.read)) : null,
      write: a.write ? attempt(() => fs.writeFileSync(a.write, 'from the server\n')) : null,
    }));
  } else {
    send({jsonrpc: '2.0', id: msg.id, error: {code: -32601, message: 'no such method'}});
  }
});
"""


@pytest.fixture(scope="module")
def tiny_package() -> Iterator[Path]:
    """The server as an npm package: a directory, and its tarball (what `npx --yes SPEC` installs,
    as from the registry), where the sandbox can see them (its /tmp is private)."""
    pkg = Path(tempfile.mkdtemp(prefix="orrery-tiny-mcp-", dir="/var/tmp"))
    (pkg / "package.json").write_text(
        json.dumps({"name": "orrery-tiny-mcp", "version": "1.0.0", "bin": {"orrery-tiny-mcp": "server.js"}})
    )
    (pkg / "server.js").write_text(SERVER_JS)
    (pkg / "server.js").chmod(0o755)
    os.chmod(pkg, 0o755)
    subprocess.run(["npm", "pack", "--silent", "--pack-destination", str(pkg)], cwd=pkg, check=True, timeout=60)
    yield pkg
    shutil.rmtree(pkg, ignore_errors=True)


@pytest.fixture
def tiny_server(tiny_package: Path) -> Path:
    """`server.js` to start with node."""
    return tiny_package / "server.js"


@pytest.fixture
def tiny_tarball(tiny_package: Path) -> Path:
    return tiny_package / "orrery-tiny-mcp-1.0.0.tgz"


class AgentInWorkspace(Agent):
    """An agent started from inside its own workspace (`cd ~/project && orrery agent ...`)."""

    def start(self) -> Agent:
        self.workspace.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "device_agent", "--server", self.server_url, "--token", self.token]
        args += ["--data-dir", str(self.data_dir), "--workspace", str(self.workspace), *self.extra_args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workspace, start_new_session=True
            )
        return self


def agent_with(fleet: Fleet, name: str, toml: str) -> Agent:
    enrolled = fleet.enroll(name, {"kind": name})
    data = fleet.tmp / "agents" / name
    data.mkdir(parents=True, exist_ok=True)
    config = fleet.tmp / f"{name}.toml"
    config.write_text(toml)
    agent = AgentInWorkspace(
        name, enrolled["id"], enrolled["token"], data, fleet.server.url, {}, child_env(), ["--config", str(config)]
    )
    fleet.agents.append(agent)
    agent.start()
    fleet.wait_device(agent.device_id, "idle")
    return agent


def run(fleet: Fleet, kind: str, *commands: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
    dag = {"nodes": [{"id": "n", "placement": {"labels": {"kind": kind}}, "commands": list(commands)}]}
    task = fleet.wait_task(fleet.submit(dag)["id"], timeout=timeout)
    node = fleet.node(task, "n")
    assert node["state"] == "succeeded", json.dumps(node)[:3000]
    return node


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": name, "arguments": arguments, "timeout_s": 60}


def output(node: dict[str, Any]) -> dict[str, Any]:
    """The JSON the tiny server answered with (a tool node's output is its last result's text)."""
    text = node["output"] if isinstance(node["output"], str) else json.dumps(node["output"])
    start, end = text.index("{"), text.rindex("}") + 1
    found: dict[str, Any] = json.loads(text[start:end].replace('\\"', '"'))
    return found


# ---------------------------------------------------------------- planted npm configuration


@pytest.mark.parametrize("how", ["browser", "third_party"])
def test_a_planted_npmrc_never_runs_workspace_code_in_an_npx_server(
    tmp_path: Path, tiny_tarball: Path, how: str
) -> None:
    """A sandboxed shell plants `.npmrc` (node-options = --require x.js), `x.js` and a
    `package.json` in the workspace; after a restart the npx server starts and serves a call,
    and x.js never ran."""
    if how == "browser":  # the profile's own launch, with the tiny server in Playwright's place
        namespace = "browser"
        servers = f'[agent.browser]\ncommand = ["npx", "--yes", "file:{tiny_tarball}"]\n'
        toolsets = '["shell", "browser"]'
    else:
        namespace = "tiny"
        servers = (
            f'[[agent.mcp_servers]]\nnamespace = "tiny"\ncommand = "npx"\nargs = ["--yes", "file:{tiny_tarball}"]\n'
        )
        toolsets = '["shell"]'
    toml = f'[agent]\ntoolsets = {toolsets}\nsandbox = "bwrap"\n\n{servers}'
    with Fleet(tmp_path) as f:
        agent = agent_with(f, "npx-box", toml)
        ws = agent.workspace
        marker = ws / "planted-code-ran"
        package = json.dumps({"name": "w", "version": "1.0.0", "scripts": {"preinstall": "node x.js"}})
        run(
            f,
            "npx-box",
            shell(["sh", "-c", "cat > .npmrc"], stdin=f"node-options=--require {ws}/x.js\n"),
            shell(
                ["sh", "-c", "cat > x.js"], stdin=f"require('fs').appendFileSync('{marker}', process.argv + '\\n')\n"
            ),
            # as an argument: the MCP SDK would parse JSON-looking text given as `stdin`
            shell(["sh", "-c", 'printf "%s" "$1" > package.json', "sh", package]),
        )
        assert (ws / ".npmrc").read_text().startswith("node-options=")
        assert "appendFileSync" in (ws / "x.js").read_text()

        agent.stop()
        agent.start()
        f.wait_device(agent.device_id, "idle")
        where = output(run(f, "npx-box", tool(f"{namespace}.where")))
        assert not marker.exists(), f"workspace code ran in the server: {marker.read_text()}"
        assert where["node_options"] is None
        assert not Path(where["cwd"]).is_relative_to(ws), where
        assert Path(where["cwd"]) == agent.data_dir / "mcp" / namespace


def test_a_server_cwd_in_the_workspace_is_refused_at_start(tmp_path: Path, tiny_tarball: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    toml = tmp_path / "agent.toml"
    toml.write_text(
        f'[agent]\ntoolsets = ["system"]\nworkspace = "{workspace}"\n\n'
        f'[[agent.mcp_servers]]\nnamespace = "tiny"\ncommand = "npx"\nargs = ["--yes", "file:{tiny_tarball}"]\n'
        f'cwd = "{workspace}"\n'
    )
    argv = [sys.executable, "-m", "device_agent", "--server", "http://127.0.0.1:9", "--config", str(toml)]
    argv += ["--token", "orrd_dev_launch.secret", "--data-dir", str(tmp_path / "agent")]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the agent started a server whose working directory is its workspace")
    assert done.returncode == 2, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "MCP server 'tiny': cwd" in lines[0] and "in the workspace" in lines[0], lines


# ---------------------------------------------------------------- third-party servers in the sandbox


def test_a_third_party_server_in_the_sandbox_cannot_read_the_data_dir_but_writes_the_workspace(
    tmp_path: Path, tiny_server: Path
) -> None:
    outside = Path(tempfile.mkdtemp(prefix="orrery-launch-outside-", dir="/var/tmp"))
    try:
        toml = (
            '[agent]\ntoolsets = ["system"]\nsandbox = "bwrap"\n\n'
            f'[[agent.mcp_servers]]\nnamespace = "tiny"\ncommand = "node"\nargs = ["{tiny_server}"]\n'
        )
        with Fleet(tmp_path) as f:
            agent = agent_with(f, "server-box", toml)
            data, ws = agent.data_dir, agent.workspace
            assert (data / LEDGER_NAME).exists() and (data / AUDIT_NAME).exists()
            for secret in (data / LEDGER_NAME, data / AUDIT_NAME):
                probe = output(run(f, "server-box", tool("tiny.probe", read=str(secret))))
                assert probe["read"] == "ENOENT", (secret, probe)  # hidden: not even there
            wrote = output(run(f, "server-box", tool("tiny.probe", write=str(ws / "from-server.txt"))))
            assert wrote["write"] == "ok"
            assert (ws / "from-server.txt").read_text() == "from the server\n"
            elsewhere = output(run(f, "server-box", tool("tiny.probe", write=str(outside / "escaped.txt"))))
            assert elsewhere["write"] == "EROFS" and not (outside / "escaped.txt").exists()
    finally:
        shutil.rmtree(outside, ignore_errors=True)


# ---------------------------------------------------------------- the browser in the sandbox


def processes_with(text: str) -> list[int]:
    """Pids whose command line contains `text`, but for bwrap itself (it starts them from outside)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if text.encode() in b" ".join(argv) and Path(argv[0].decode()).name != "bwrap":
                found.append(int(entry.name))
    return found


def test_chromium_in_the_sandbox_still_drives_a_loopback_page(tmp_path: Path, page: LoopbackPage) -> None:
    """Playwright's MCP server and its Chromium run in bwrap (their own mount namespace, the
    ledger not there) and still load, read and click a page served on the host's loopback."""
    with Fleet(tmp_path) as f:
        agent = browser_agent(f, "browser-box", 'sandbox = "bwrap"', allow=(page.origin,))
        look = f.wait_task(
            f.submit(
                {
                    "nodes": [
                        node(
                            "look",
                            "browser-box",
                            browser("browser_navigate", url=page.url),
                            browser("browser_snapshot"),
                        )
                    ]
                }
            )["id"],
            timeout=120,
        )
        assert look["state"] == "succeeded", json.dumps(look["nodes"][0])[:3000]
        assert "Waiting" in str(look["nodes"][0]["output"])
        page.wait_for(("GET", "/"), "Chromium to load the page")

        profile = str(agent.data_dir / "browser" / "profile")
        chromium = wait_until(lambda: processes_with(profile), 30, "the browser's processes")
        ours = os.readlink("/proc/self/ns/mnt")
        for pid in chromium:
            with contextlib.suppress(FileNotFoundError):  # a helper process that has ended
                assert os.readlink(f"/proc/{pid}/ns/mnt") != ours, f"pid {pid} runs outside the sandbox"
                seen = Path(f"/proc/{pid}/root") / str(agent.data_dir / LEDGER_NAME).lstrip("/")
                assert not seen.exists(), f"pid {pid} sees the ledger"
        assert (agent.data_dir / LEDGER_NAME).exists()

        snapshot = str(look["nodes"][0]["output"])
        change = ref(snapshot, "button", "Change the page")
        clicked = f.wait_task(
            f.submit(
                {
                    "nodes": [
                        node(
                            "click",
                            "browser-box",
                            browser("browser_click", target=change, element="Change the page button"),
                            browser("browser_wait_for", text="Changed by a click"),
                        )
                    ]
                }
            )["id"],
            timeout=120,
        )
        assert clicked["state"] == "succeeded", json.dumps(clicked["nodes"][0])[:3000]
        page.wait_for(("POST", "/clicked"), "the click's request")
