"""Browser devices: the `browser` profile runs Playwright's MCP server with the system
Chromium, and DAGs drive a page served on loopback by element reference, under the agent's
policy. The page's origin is listed in `allowed_private_origins` (loopback is refused otherwise:
tests/security/test_browser_confinement.py).

The page's own server records what the browser really did (a click's request, a form post)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from device_agent.config import BROWSER_PACKAGE, BrowserProfile
from tests.fakellm import FakeLLM, call
from tests.integration.test_third_party_mcp import npm_server
from tests.support import Agent, Fleet, wait_until

CHROMIUM = BrowserProfile().executable_path
PAGE = """<!doctype html>
<html><head><title>Orrery test page</title></head><body>
<h1 id="status">Waiting</h1>
<form method="post" action="/submit">
  <label>Name <input name="name"></label>
  <button type="submit">Send</button>
</form>
<button id="change" onclick="fetch('/clicked', {method: 'POST'}).then(() => {
  document.getElementById('status').textContent = 'Changed by a click'; })">Change the page</button>
</body></html>"""


@dataclass
class LoopbackPage:
    """A tiny HTTP server on loopback: the page above, and a record of every request it got."""

    server: ThreadingHTTPServer
    hits: list[tuple[str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.origin}/"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def wait_for(self, hit: tuple[str, str], what: str) -> None:
        wait_until(lambda: hit in self.hits, 30, what)


@pytest.fixture
def page() -> Iterator[LoopbackPage]:
    hits: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(("GET", self.path))
            self._reply(200, PAGE if self.path == "/" else "")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            if self.path == "/submit":
                name = parse_qs(body).get("name", [""])[0]
                hits.append(("submit", name))
                self._reply(200, f"<!doctype html><title>Thanks</title><h1>Thanks, {name}</h1>")
            else:
                hits.append(("POST", self.path))
                self._reply(204, "")

        def _reply(self, status: int, text: str) -> None:
            data = text.encode()
            self.send_response(status)
            if status != 204:
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if status != 204:
                self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield LoopbackPage(server, hits)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def playwright_mcp() -> Path:
    """`@playwright/mcp` at the pinned version (.ci/run installs it), and the system Chromium."""
    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("CI"):
            raise AssertionError(f"the browser tests need Chromium at {CHROMIUM} (.ci/run installs it)")
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return npm_server(BROWSER_PACKAGE, "playwright-mcp")


def browser_agent(fleet: Fleet, name: str, extra: str = "", allow: tuple[str, ...] = (), **env: str) -> Agent:
    """An agent with `toolsets = ["system", "browser"]`, the profile's defaults but the command;
    `allow`: the loopback origins its browser may open (none by default)."""
    config = fleet.tmp / f"{name}.toml"
    config.write_text(
        f"""
[agent]
toolsets = ["system", "browser"]
{extra}

[agent.browser]
command = ["{playwright_mcp()}"]
allowed_private_origins = {json.dumps(list(allow))}
"""
    )
    return fleet.agent(name, {"kind": name}, extra_args=["--config", str(config)], **env)


def node(node_id: str, kind: str, *commands: dict[str, Any]) -> dict[str, Any]:
    return {"id": node_id, "placement": {"labels": {"kind": kind}}, "commands": list(commands)}


def browser(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool": f"browser.{tool}", "arguments": arguments, "timeout_s": 60}


def ref(snapshot: str, role: str, name: str) -> str:
    """The element reference a snapshot gives the element with this role and accessible name."""
    found = re.search(rf'{role} "{re.escape(name)}"[^\n]*\[ref=([^\]]+)\]', snapshot)
    assert found, f"no {role} '{name}' in the snapshot:\n{snapshot}"
    return found.group(1)


def test_tool_nodes_navigate_read_the_snapshot_and_click_and_fill_by_reference(
    tmp_path: Path, page: LoopbackPage
) -> None:
    with Fleet(tmp_path) as f:
        agent = browser_agent(f, "browser-box", allow=(page.origin,))
        tools = {t["name"]: t for t in f.device(agent.device_id)["tools"]}
        assert {"browser.browser_navigate", "browser.browser_snapshot", "browser.browser_click"} <= set(tools)
        assert tools["browser.browser_snapshot"]["annotations"]["read_only"] is True
        assert tools["browser.browser_click"]["annotations"]["read_only"] is False

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
        snapshot = str(look["nodes"][0]["output"])
        assert "Waiting" in snapshot
        page.wait_for(("GET", "/"), "Chromium to load the page")
        name_box, send, change = (
            ref(snapshot, "textbox", "Name"),
            ref(snapshot, "button", "Send"),
            ref(snapshot, "button", "Change the page"),
        )

        # A later task acts on the same page by the references the snapshot gave.
        dag = {
            "nodes": [
                node(
                    "change",
                    "browser-box",
                    browser("browser_click", target=change, element="Change the page button"),
                    browser("browser_wait_for", text="Changed by a click"),
                    browser("browser_snapshot"),
                ),
                node(
                    "send",
                    "browser-box",
                    browser(
                        "browser_fill_form",
                        fields=[{"target": name_box, "name": "Name", "type": "textbox", "value": "Ada Lovelace"}],
                    ),
                    browser("browser_click", target=send, element="Send button"),
                    browser("browser_snapshot"),
                ),
            ],
            "edges": [{"from": "change", "to": "send"}],
        }
        done = f.wait_task(f.submit(dag)["id"], timeout=120)
        assert done["state"] == "succeeded", json.dumps(done["nodes"])[:3000]
        assert "Changed by a click" in str(f.node(done, "change")["output"])
        assert "Thanks, Ada Lovelace" in str(f.node(done, "send")["output"])
        page.wait_for(("submit", "Ada Lovelace"), "the form post")
        assert page.hits.count(("POST", "/clicked")) == 1
        assert page.hits.index(("POST", "/clicked")) < page.hits.index(("submit", "Ada Lovelace"))
        # The profile keeps its browser profile under the agent's data dir.
        assert (agent.data_dir / "browser" / "profile").is_dir()


def test_the_policy_applies_to_browser_tools(tmp_path: Path, page: LoopbackPage) -> None:
    """Attended: a profile default on approval_required (browser_evaluate) waits for a person and,
    denied, never runs; the kill switch refuses actions but not the read-only snapshot; the audit
    log records the browser calls."""
    with Fleet(tmp_path) as f:
        agent = browser_agent(f, "guarded-browser", allow=(page.origin,))
        done = f.wait_task(
            f.submit({"nodes": [node("open", "guarded-browser", browser("browser_navigate", url=page.url))]})["id"], 120
        )
        assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:3000]

        script = "() => fetch('/evaluated', {method: 'POST'}).then(() => 'sent')"
        task_id = f.submit({"nodes": [node("js", "guarded-browser", browser("browser_evaluate", function=script))]})[
            "id"
        ]
        with f.server.client() as c:
            approval = wait_until(
                lambda: c.get("/v1/approvals", params={"task_id": task_id, "state": "pending"}).json()["items"],
                60,
                "browser_evaluate to wait for approval",
            )[0]
            assert approval["tool"] == "browser.browser_evaluate"
            assert c.post(f"/v1/approvals/{approval['id']}/deny").status_code == 200
        denied = f.wait_task(task_id)["nodes"][0]
        assert denied["error"]["code"] == "approval_denied", denied
        assert ("POST", "/evaluated") not in page.hits

        agent.signal(signal.SIGUSR1)  # the kill switch, at run time
        wait_until((agent.data_dir / "kill-switch").exists, 30, "the kill switch to be on")
        switched = f.wait_task(
            f.submit(
                {
                    "nodes": [
                        node("read", "guarded-browser", browser("browser_snapshot")),
                        node("act", "guarded-browser", browser("browser_navigate", url=page.url + "again")),
                    ]
                }
            )["id"],
            120,
        )
        assert f.node(switched, "read")["state"] == "succeeded"
        assert "Waiting" in str(f.node(switched, "read")["output"])
        act = f.node(switched, "act")
        assert act["error"]["code"] == "policy_denied" and "kill switch" in act["error"]["message"], act
        assert ("GET", "/again") not in page.hits

        entries = [json.loads(line) for line in (agent.data_dir / "audit.jsonl").read_text().splitlines()]
        by_tool = {(e["tool"], e["decision"]) for e in entries}
        assert ("browser.browser_navigate", "denied") in by_tool
        assert ("browser.browser_evaluate", "denied") in by_tool
        assert any(e["tool"] == "browser.browser_snapshot" and e["phase"] == "outcome" for e in entries)
        assert script not in json.dumps(entries)  # arguments stay out of the audit log


def _snapshot_shown(body: dict[str, Any]) -> str:
    """The newest tool result the model was shown that holds a page snapshot."""
    for message in reversed(body["messages"]):
        if message.get("role") == "tool" and "[ref=" in str(message.get("content")):
            shown = json.loads(message["content"])  # {"status", "result", "error"}
            return str(shown["result"])
    raise AssertionError("the model was not shown a snapshot")


def test_an_agent_node_fills_and_sends_the_form_by_reference(tmp_path: Path, page: LoopbackPage) -> None:
    llm = FakeLLM()
    try:
        with Fleet(tmp_path, **llm.env()) as f:
            browser_agent(f, "web", allow=(page.origin,))
            llm.add(
                call("browser__browser_navigate", url=page.url),
                call("browser__browser_snapshot"),
                lambda body: call(
                    "browser__browser_type",
                    target=ref(_snapshot_shown(body), "textbox", "Name"),
                    element="Name field",
                    text="Grace Hopper",
                ),
                lambda body: call(
                    "browser__browser_click", target=ref(_snapshot_shown(body), "button", "Send"), element="Send"
                ),
                call("finish", answer="sent"),
            )
            dag = {
                "nodes": [
                    {
                        "id": "fill",
                        "kind": "agent",
                        "placement": {"labels": {"kind": "web"}},
                        "instruction": f"Open {page.url}, type 'Grace Hopper' as the name and send the form.",
                        "max_steps": 6,
                    }
                ]
            }
            done = f.wait_task(f.submit(dag)["id"], timeout=180)
            assert done["state"] == "succeeded", json.dumps(done["nodes"][0])[:3000]
            page.wait_for(("submit", "Grace Hopper"), "the agent node's form post")
            tools = [t["function"]["name"] for t in llm.requests[0]["tools"]]
            assert {"browser__browser_navigate", "browser__browser_snapshot", "browser__browser_click"} <= set(tools)
    finally:
        llm.close()
