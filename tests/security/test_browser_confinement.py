"""The `browser` profile's Chromium stays on the web, and browser tools that write files are writes.

Real agents run Playwright's MCP server with the system Chromium. One agent lists one loopback
origin (the page server) in `allowed_private_origins`; a second loopback server (the secret)
is not listed and records every request that reaches it, so a test sees whether the browser
really got there. The attacks: URLs of other schemes (view-source:file, file, javascript, data),
loopback origins that are not listed (directly, by a redirect, by the page's own requests), and
read-only tools given an output file with the kill switch on, as verify commands and against
the destructive-actions budget.
"""

from __future__ import annotations

import base64
import json
import secrets
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_browser_device import browser, browser_agent, node
from tests.support import Agent, Fleet, wait_until

MARKER = f"orrery-secret-{secrets.token_hex(8)}"


@dataclass
class Site:
    """A loopback HTTP server answering `pages[path]` (a string, or a callable giving the
    location of a redirect), recording each request as (method, path)."""

    pages: dict[str, str | Callable[[], str]]
    hits: list[tuple[str, str]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def origin(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Site:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer("POST")

            def _answer(self, method: str) -> None:
                site.hits.append((method, self.path))
                page = site.pages.get(self.path, "")
                if callable(page):
                    self.send_response(302)
                    self.send_header("Location", page())
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Access-Control-Allow-Origin", "*")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class World:
    fleet: Fleet
    agent: Agent
    page: Site  # listed in allowed_private_origins
    secret: Site  # loopback too, not listed

    def run(self, *commands: dict[str, Any]) -> dict[str, Any]:
        """One node with these commands on the browser agent; the node when the task ended."""
        task = self.fleet.submit({"nodes": [node("n", "confined", *commands)]})
        return self.fleet.wait_task(task["id"], timeout=120)["nodes"][0]


def refused(done: dict[str, Any], words: str) -> None:
    error = done.get("error") or {}
    assert error.get("code") == "policy_denied" and words in error.get("message", ""), json.dumps(done)[:3000]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    secret = Site({"/": f"<!doctype html><title>Secret</title><h1>{MARKER}</h1>"}).start()
    page = Site({}).start()
    page.pages.update(
        {
            "/": "<!doctype html><title>Page</title><h1>Public page</h1>",
            "/redirect": lambda: f"{secret.origin}/redirected",
            # The page's own requests, then a request back home once they are settled.
            "/embed": f"""<!doctype html><title>Embed</title><img src="{secret.origin}/img">
<script>fetch("{secret.origin}/fetched", {{mode: "no-cors"}}).catch(() => null)
  .finally(() => fetch("/embed-done"));</script>""",
        }
    )
    try:
        with Fleet(tmp_path_factory.mktemp("confinement")) as fleet:
            agent = browser_agent(fleet, "confined", allow=(page.origin,))
            yield World(fleet, agent, page, secret)
    finally:
        page.stop()
        secret.stop()


def test_view_source_of_a_device_file_is_refused(world: World, tmp_path: Path) -> None:
    secret_file = tmp_path / "enrollment.json"
    secret_file.write_text(json.dumps({"token": MARKER}))
    done = world.run(browser("browser_navigate", url=f"view-source:file://{secret_file}"))
    shown = world.run(browser("browser_snapshot"))  # what the current page shows
    assert MARKER not in json.dumps(done) + json.dumps(shown)
    refused(done, "only open http and https")


def test_file_urls_are_refused_by_the_guard(world: World) -> None:
    done = world.run(browser("browser_navigate", url="file:///etc/hostname"))
    refused(done, "file: URLs")


def test_a_javascript_url_never_runs_in_the_page(world: World) -> None:
    script = "javascript:fetch('/js-ran', {method: 'POST'})"
    done = world.run(browser("browser_navigate", url=world.page.origin + "/"), browser("browser_navigate", url=script))
    # A later navigation: a script the refused URL had started would have reached the page by then.
    assert world.run(browser("browser_navigate", url=world.page.origin + "/after"))["state"] == "succeeded"
    assert ("GET", "/after") in world.page.hits
    assert ("POST", "/js-ran") not in world.page.hits
    refused(done, "javascript: URLs")


def test_a_data_url_is_refused(world: World) -> None:
    encoded = base64.b64encode(f"<h1>{MARKER}</h1>".encode()).decode()  # the refusal echoes the URL
    done = world.run(browser("browser_navigate", url=f"data:text/html;base64,{encoded}"))
    shown = world.run(browser("browser_snapshot"))
    assert MARKER not in json.dumps(done) + json.dumps(shown)
    refused(done, "data: URLs")


def test_a_new_tab_gets_the_same_rules(world: World) -> None:
    done = world.run(browser("browser_tabs", action="new", url=f"view-source:{world.secret.origin}/"))
    assert world.secret.hits == [], world.secret.hits
    refused(done, "view-source: URLs")


def test_a_loopback_origin_that_is_not_listed_is_refused(world: World) -> None:
    done = world.run(browser("browser_navigate", url=world.secret.origin + "/"))
    assert MARKER not in json.dumps(done)
    assert world.secret.hits == [], world.secret.hits
    refused(done, "allowed_private_origins")


def test_a_redirect_from_an_allowed_page_to_a_loopback_origin_is_stopped(world: World) -> None:
    done = world.run(browser("browser_navigate", url=world.page.origin + "/redirect"))
    assert ("GET", "/redirect") in world.page.hits
    assert MARKER not in json.dumps(done)
    assert ("GET", "/redirected") not in world.secret.hits
    assert world.secret.hits == [], world.secret.hits


def test_the_pages_own_requests_to_a_loopback_origin_are_stopped(world: World) -> None:
    world.run(browser("browser_navigate", url=world.page.origin + "/embed"))
    wait_until(lambda: ("GET", "/embed-done") in world.page.hits, 30, "the page's requests to settle")
    assert not {("GET", "/img"), ("GET", "/fetched")} & set(world.secret.hits), world.secret.hits
    assert world.secret.hits == [], world.secret.hits


def test_an_output_file_is_a_write_the_kill_switch_refuses(world: World) -> None:
    agent = world.agent
    agent.signal(signal.SIGUSR1)  # the kill switch, at run time
    try:
        wait_until((agent.data_dir / "kill-switch").exists, 30, "the kill switch to be on")
        for tool, arguments in (
            ("browser_snapshot", {"filename": "leak-snapshot.md"}),
            ("browser_network_requests", {"filename": "leak-requests.md", "static": False}),
            ("browser_console_messages", {"filename": "leak-console.md", "level": "info"}),
        ):
            done = world.run(browser(tool, **arguments))
            assert not (agent.workspace / arguments["filename"]).exists()
            refused(done, "kill switch")
        # The same tool without an output file is read-only and still runs.
        assert world.run(browser("browser_snapshot"))["state"] == "succeeded"
    finally:
        agent.signal(signal.SIGUSR2)
        wait_until(lambda: not (agent.data_dir / "kill-switch").exists(), 30, "the kill switch to be off")


def test_a_verify_command_that_writes_an_output_file_is_refused_at_submission(world: World) -> None:
    dag = {
        "nodes": [
            {
                **node("n", "confined", browser("browser_navigate", url=world.page.origin + "/")),
                "verify": [browser("browser_snapshot", filename="verify.md")],
            }
        ]
    }
    with world.fleet.server.client() as c:
        r = c.post("/v1/tasks", json={"dag": dag})
    assert r.status_code == 422, r.text
    problem = next(p for p in r.json()["problems"] if p["code"] == "verify_not_read_only")
    assert "filename" in problem["message"], problem
    dag["nodes"][0]["verify"] = [browser("browser_snapshot")]  # without an output file it is read-only
    assert world.fleet.wait_task(world.fleet.submit(dag)["id"], timeout=120)["state"] == "succeeded"


def test_output_files_count_against_the_destructive_actions_budget(world: World) -> None:
    agent = browser_agent(world.fleet, "budgeted", extra="max_destructive_per_minute = 1")

    def snapshot(name: str) -> dict[str, Any]:
        task = world.fleet.submit({"nodes": [node("n", "budgeted", browser("browser_snapshot", filename=name))]})
        return world.fleet.wait_task(task["id"], timeout=120)["nodes"][0]

    first = snapshot("one.md")
    assert first["state"] == "succeeded", json.dumps(first)[:3000]
    assert (agent.workspace / "one.md").is_file()  # an explicit file name lands in the workspace
    second = snapshot("two.md")
    assert not (agent.workspace / "two.md").exists()
    assert (second.get("error") or {}).get("code") == "budget_exceeded", json.dumps(second)[:3000]
