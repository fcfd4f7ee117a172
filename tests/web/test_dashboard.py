"""The web dashboard in a real headless browser against a real server and real agents:
sign-in, the devices page, the task list, and a task page that follows a running DAG live."""

from __future__ import annotations

import itertools
import json
import random
import re
from typing import Any

from tests.support import Fleet, TcpProxy, shell, wait_until
from tests.web.conftest import Watched, remember_key, shot, watching


def sign_in(w: Watched, fleet: Fleet, key: str | None = None, hash_: str = "", base: str | None = None) -> Any:
    page = w.page
    page.goto(f"{base or fleet.server.url}/{hash_}")
    page.fill("#api-key", key or fleet.server.api_key)
    page.click("form button[type=submit]")
    page.wait_for_selector("header.topbar")
    return page


def api_key(fleet: Fleet, role: str) -> dict[str, Any]:
    with fleet.server.client() as c:
        r = c.post("/v1/api-keys", json={"role": role, "name": f"web test {role}"})
        assert r.status_code == 201, r.text
        made: dict[str, Any] = r.json()
    remember_key(made["key"])
    return made


def device_row(name: str, state: str) -> str:
    return f"#devices-table tr[data-state={state}]:has(.device-name:text-is('{name}'))"


def test_a_bad_key_stays_on_the_sign_in_screen_with_the_servers_detail(web_fleet: Fleet, watched: Watched) -> None:
    page = watched.page
    page.goto(f"{web_fleet.server.url}/")
    shot(page, "signin")
    page.fill("#api-key", "orr_not_a_real_key")
    page.click("form button[type=submit]")
    error = page.wait_for_selector("#signin-error:not([hidden])")
    assert error.inner_text() == "the API key is unknown or revoked"
    assert page.evaluate("sessionStorage.length") == 0
    assert page.query_selector("header.topbar") is None
    shot(page, "signin-bad-key")


def test_the_devices_page_lists_both_agents_idle_and_live(web_fleet: Fleet, watched: Watched) -> None:
    page = sign_in(watched, web_fleet)
    assert page.url.endswith("/")  # the key went nowhere near the URL
    for name in ("alpha", "beta"):
        row = page.wait_for_selector(device_row(name, "idle"))
        assert row.query_selector(".pill").inner_text() == "idle"
        assert "linux" in row.inner_text()
    alpha = page.inner_text(device_row("alpha", "idle"))
    assert "role=producer" in alpha and "zone=eu-1" in alpha
    # "Last seen" is relative and keeps moving (agents heartbeat every second here).
    page.wait_for_function(
        "() => [...document.querySelectorAll('#devices-table time[data-ago]')]"
        ".every(t => /(just now|\\d+ s ago)/.test(t.textContent))"
    )
    host = page.inner_text("#server-host")
    assert host == web_fleet.server.url.removeprefix("http://")
    page.wait_for_selector(".server-version:text-matches('v\\\\d')")
    shot(page, "devices")


def test_an_operator_cordons_and_uncordons_and_a_viewer_is_refused(web_fleet: Fleet, watched: Watched) -> None:
    page = sign_in(watched, web_fleet)
    page.click(f"{device_row('beta', 'idle')} button[data-action=cordon]")
    page.wait_for_selector(device_row("beta", "cordoned"))
    assert web_fleet.device(web_fleet.agents[1].device_id)["state"] == "cordoned"
    page.click(f"{device_row('beta', 'cordoned')} button[data-action=uncordon]")
    page.wait_for_selector(device_row("beta", "idle"))

    viewer = api_key(web_fleet, "viewer")
    page.click("#sign-out")
    page.wait_for_selector("#api-key")
    assert page.evaluate("sessionStorage.length") == 0
    page.fill("#api-key", viewer["key"])
    page.click("form button[type=submit]")
    page.click(f"{device_row('alpha', 'idle')} button[data-action=drain]")
    flash = page.wait_for_selector(".flash-error")
    assert "needs the 'operator' role" in flash.inner_text()
    assert "Drain alpha refused" in flash.inner_text()
    assert web_fleet.device(web_fleet.agents[0].device_id)["state"] == "idle"


def test_a_revoked_key_returns_to_sign_in_with_the_detail(web_fleet: Fleet, watched: Watched) -> None:
    made = api_key(web_fleet, "admin")
    page = sign_in(watched, web_fleet, made["key"])
    page.wait_for_selector("#devices-table")
    with web_fleet.server.client() as c:
        assert c.delete(f"/v1/api-keys/{made['id']}").status_code == 200
    error = page.wait_for_selector("#signin-error:not([hidden])")  # the next 2 s poll gets a 401
    assert error.inner_text() == "the API key is unknown or revoked"
    assert page.evaluate("sessionStorage.length") == 0


def five_node_dag(gate: list[str]) -> dict[str, Any]:
    """produce -> boom (fails) -failure-> recover (uses produce's output) -> report, and a
    gated node on beta that runs until the test lets it go; report waits for it (always)."""
    return {
        "nodes": [
            {"id": "produce", "placement": {"device": "alpha"}, "commands": [shell(["echo", "hello from alpha"])]},
            {
                "id": "boom",
                "placement": {"device": "alpha"},
                "commands": [shell(["sh", "-c", "echo 'disk check failed: /var is 97% full' >&2; exit 3"])],
            },
            {
                "id": "recover",
                "placement": {"labels": {"role": "consumer"}},
                "commands": [
                    {
                        "tool": "files.write",
                        "arguments": {"path": "note.txt", "content": "${nodes.produce.output.stdout}"},
                    }
                ],
            },
            {
                "id": "slow",
                "placement": {"device": "beta"},
                "commands": [{"tool": "shell.run", "arguments": {"argv": gate}, "timeout_s": 60}],
            },
            {"id": "report", "placement": {"device": "beta"}, "commands": [shell(["cat", "note.txt"])]},
        ],
        "edges": [
            {"from": "produce", "to": "boom"},
            {"from": "boom", "to": "recover", "on": "failure"},
            {"from": "produce", "to": "slow"},
            {"from": "recover", "to": "report"},
            {"from": "slow", "to": "report", "on": "always"},
        ],
    }


def node_sel(node_id: str, state: str | None = None) -> str:
    return f"svg.dag g.node[data-node-id='{node_id}']" + (f"[data-state='{state}']" if state else "")


def test_the_task_page_draws_the_dag_and_follows_it_live(web_fleet: Fleet, watched: Watched, browser: Any) -> None:
    beta = web_fleet.agents[1]
    gate = beta.workspace / "go"
    gate.unlink(missing_ok=True)
    task = web_fleet.submit(
        five_node_dag(["sh", "-c", "while [ ! -f go ]; do sleep 0.05; done; echo released"]),
        name="nightly-disk-check",
    )
    page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")

    # While the gate holds, the page shows `slow` running; nothing can finish `report` yet.
    page.wait_for_selector(node_sel("slow", "running"))
    page.wait_for_selector(node_sel("boom", "failed"))
    page.wait_for_selector("#stream-status[data-status=live]")
    assert page.get_attribute(node_sel("report"), "data-state") == "pending"
    assert page.inner_text("#task-state") == "running"
    page.evaluate("window.__sameDocument = true")
    shot(page, "task-live")

    # A second viewer, through a proxy the test can cut: a dropped stream comes back where it
    # left off (?after=<last id>), not from the start.
    proxy = TcpProxy(web_fleet.server.port)
    try:
        with watching(browser, web_fleet) as other:
            second = sign_in(other, web_fleet, hash_=f"#/tasks/{task['id']}", base=proxy.url)
            second.wait_for_selector(node_sel("slow", "running"))
            second.wait_for_selector("#stream-status[data-status=live]")
            proxy.pause()
            second.wait_for_selector("#stream-status[data-status=reconnecting]")
            proxy.resume()
            second.wait_for_selector("#stream-status[data-status=live]")
            assert any(re.search(r"/events\?after=[1-9][0-9]*$", u) for u in other.urls), other.urls

            gate.write_text("")  # let `slow` finish: the rest must arrive over the event streams
            for p in (page, second):
                p.wait_for_selector(node_sel("slow", "succeeded"))
                p.wait_for_selector(node_sel("report", "succeeded"))
                p.wait_for_selector("#task-state [data-state=succeeded]")
    finally:
        proxy.close()
    assert page.evaluate("window.__sameDocument") is True, "the page reloaded"

    done = web_fleet.wait_task(task["id"])
    assert done["state"] == "succeeded"
    drawn = page.eval_on_selector_all(
        "svg.dag g.node", "gs => Object.fromEntries(gs.map(g => [g.dataset.nodeId, g.dataset.state]))"
    )
    assert drawn == {n["id"]: n["state"] for n in done["nodes"]}
    assert drawn["boom"] == "failed"
    edges = page.eval_on_selector_all(
        "svg.dag path.edge", "ps => ps.map(p => [p.dataset.from, p.dataset.to, p.dataset.on])"
    )
    assert sorted(map(tuple, edges)) == sorted((e["from"], e["to"], e["on"]) for e in done["edges"])
    assert page.is_visible(".legend :text('on failure')")
    # The stream was read with fetch() and the Authorization header, from event 0.
    assert watched.event_auth and all(a == f"Bearer {web_fleet.server.api_key}" for a in watched.event_auth)
    assert any(re.search(r"/events\?after=0$", u) for u in watched.urls)

    # The side panel: commands, attempts with the device's name, results and output.
    page.click(node_sel("produce"))
    panel = page.wait_for_selector("#node-panel[data-node-id=produce]")
    text = panel.inner_text()
    assert "shell.run" in text and '"hello from alpha"' in text
    assert "alpha" in page.inner_text("#node-panel .attempt-device")
    assert '"stdout": "hello from alpha\\n"' in text
    page.click("#node-panel .tab:text('LLM transcript')")
    assert "No LLM calls" in page.wait_for_selector("#llm-empty").inner_text()
    page.click("#node-panel .tab:text('Details')")

    page.click(node_sel("recover"))
    page.wait_for_selector("#node-panel[data-node-id=recover]")
    # The resolved arguments come with the attempt's results, drawn once they are fetched.
    page.wait_for_selector("#node-panel .resolved")
    assert '"content": "hello from alpha\\n"' in page.inner_text("#node-panel")  # the resolved reference

    page.click(node_sel("boom"))
    page.wait_for_selector("#node-panel[data-node-id=boom]")
    error = page.inner_text("#node-panel .callout.error")
    assert "tool_error" in error and "disk check failed" in error
    page.wait_for_function("() => document.querySelector('#node-panel .attempt') !== null")
    page.wait_for_timeout(250)  # let the panel's open transition settle before the picture
    shot(page, "task-done", "dashboard-task.png")
    assert not page.is_visible("#cancel-task")


def test_the_task_list_filters_pages_and_links_to_the_task(web_fleet: Fleet, watched: Watched) -> None:
    ids = []
    for name, argv in (("list-ok-1", ["true"]), ("list-fail", ["false"]), ("list-ok-2", ["true"])):
        ids.append(web_fleet.submit({"nodes": [{"id": "only", "commands": [shell(argv)]}]}, name=name)["id"])
    for task_id in ids:
        web_fleet.wait_task(task_id)

    page = sign_in(watched, web_fleet, hash_="#/tasks?limit=2")
    page.wait_for_selector("#tasks-table")
    first = page.eval_on_selector_all("#tasks-table tbody tr", "rs => rs.map(r => r.dataset.taskId)")
    assert first == [ids[2], ids[1]]  # newest first
    assert page.is_disabled("#page-newer") and page.is_enabled("#page-older")
    page.click("#page-older")
    page.wait_for_selector(f"#tasks-table tr[data-task-id='{ids[0]}']")
    second = page.eval_on_selector_all("#tasks-table tbody tr", "rs => rs.map(r => r.dataset.taskId)")
    assert second[0] == ids[0] and not set(first) & set(second)
    page.click("#page-newer")
    page.wait_for_selector(f"#tasks-table tr[data-task-id='{ids[2]}']")

    page.click("button[data-state=failed]")
    page.wait_for_selector(f"#tasks-table tr[data-task-id='{ids[1]}']")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#tasks-table tbody tr')].every(r => r.dataset.state === 'failed')"
    )
    row = page.inner_text(f"#tasks-table tr[data-task-id='{ids[1]}']")
    assert "list-fail" in row and "0/1" not in row and "1/1" in row
    shot(page, "tasks-failed")

    page.click("button[data-state=all]")
    page.wait_for_selector(f"#tasks-table tr[data-task-id='{ids[2]}']")
    shot(page, "tasks")
    page.click(f"#tasks-table tr[data-task-id='{ids[2]}'] td:nth-child(3)")
    page.wait_for_selector(node_sel("only", "succeeded"))
    assert page.url.endswith(f"#/tasks/{ids[2]}")


def test_server_text_is_shown_as_text_never_as_markup(web_fleet: Fleet, watched: Watched) -> None:
    name = '<img src=x onerror="window.__pwned=1">'
    task = web_fleet.submit({"nodes": [{"id": "n1", "commands": [shell(["echo", "<b>bold</b>"])]}]}, name=name)
    web_fleet.wait_task(task["id"])
    page = sign_in(watched, web_fleet, hash_="#/tasks")
    page.wait_for_selector(f"#tasks-table tr[data-task-id='{task['id']}']")
    assert page.inner_text(f"#tasks-table tr[data-task-id='{task['id']}'] .task-link") == name
    page.goto(f"{web_fleet.server.url}/#/tasks/{task['id']}")
    page.wait_for_selector(node_sel("n1", "succeeded"))
    assert page.inner_text("h1.task-name") == name
    page.click(node_sel("n1"))
    page.wait_for_selector("#node-panel[data-node-id=n1] .attempt")
    assert "<b>bold</b>" in page.inner_text("#node-panel")
    assert page.query_selector("img, #node-panel b") is None
    assert page.evaluate("window.__pwned") is None


def test_a_200_node_dag_is_laid_out_readably_and_cancel_shows_live(web_fleet: Fleet, watched: Watched) -> None:
    # A cordoned device is the only match, so the nodes wait (ready) until the task is cancelled.
    parked = web_fleet.agent("parked", {"role": "parked"})
    with web_fleet.server.client() as c:
        assert c.post(f"/v1/devices/{parked.device_id}/cordon").status_code == 200
    rnd = random.Random(7)
    nodes = [
        {"id": f"step-{i:03d}", "placement": {"labels": {"role": "parked"}}, "commands": [shell(["true"])]}
        for i in range(200)
    ]
    edges = []
    for i in range(1, 200):
        for j in rnd.sample(range(max(0, i - 25), i), k=min(i, rnd.choice([1, 1, 2]))):
            edges.append(
                {"from": f"step-{j:03d}", "to": f"step-{i:03d}", "on": rnd.choice(["success"] * 8 + ["always"])}
            )
    task = web_fleet.submit({"nodes": nodes, "edges": edges}, name="fan-out-200")

    page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")
    page.wait_for_selector(node_sel("step-199"))
    page.wait_for_selector(node_sel("step-000", "ready"))
    boxes = page.eval_on_selector_all(
        "svg.dag g.node",
        "gs => gs.map(g => { const b = g.getBBox(); const m = g.transform.baseVal[0].matrix;"
        " return [m.e, m.f, b.width, b.height]; })",
    )
    assert len(boxes) == 200
    by_column: dict[float, list[tuple[float, float]]] = {}
    for x, y, _w, h in boxes:
        by_column.setdefault(x, []).append((y, y + h))
    for column in by_column.values():  # no two nodes of a layer overlap
        column.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(column))
    positions = page.eval_on_selector_all(
        "svg.dag g.node", "gs => Object.fromEntries(gs.map(g => [g.dataset.nodeId, g.transform.baseVal[0].matrix.e]))"
    )
    assert all(positions[e["from"]] < positions[e["to"]] for e in edges)  # every edge points right
    zoom = int(page.inner_text(".zoom-label").rstrip("%"))
    assert zoom >= 55  # text stays readable; the view scrolls instead
    shot(page, "task-200-nodes")

    page.click("#cancel-task")
    page.click("#cancel-task.confirm")
    page.wait_for_selector("#task-state [data-state=cancelled]")
    page.wait_for_function(
        "() => [...document.querySelectorAll('svg.dag g.node')].every(g => g.dataset.state === 'cancelled')"
    )
    wait_until(lambda: web_fleet.task(task["id"])["state"] == "cancelled", 10, "task cancelled")
    with web_fleet.server.client() as c:
        c.post(f"/v1/devices/{parked.device_id}/uncordon")


def test_the_layout_module_orders_layers_without_needless_crossings(web_fleet: Fleet, watched: Watched) -> None:
    page = sign_in(watched, web_fleet)
    result = page.evaluate(
        """async () => {
          const { layout } = await import('/ui/js/layout.js');
          // A binary tree fed in a scrambled order has a layout with no crossings.
          const nodes = [], edges = [];
          for (let i = 0; i < 63; i++) nodes.push({ id: 'n' + ((i * 37) % 63) });
          for (let i = 1; i < 63; i++) edges.push({ from: 'n' + Math.floor((i - 1) / 2), to: 'n' + i });
          const tree = layout(nodes, edges);
          // A long edge goes through dummies: its route has more than two points.
          const skip = layout([{ id: 'a' }, { id: 'b' }, { id: 'c' }, { id: 'd' }],
            [{ from: 'a', to: 'b' }, { from: 'b', to: 'c' }, { from: 'c', to: 'd' }, { from: 'a', to: 'd' }]);
          const long = skip.edges.find(e => e.from === 'a' && e.to === 'd');
          return { crossings: tree.crossings, layers: tree.layers, points: long.points.length,
                   order: ['a', 'b', 'c', 'd'].map(id => skip.nodes.get(id).layer) };
        }"""
    )
    assert result == {"crossings": 0, "layers": 6, "points": 6, "order": [0, 1, 2, 3]}


def test_the_event_stream_parser_handles_any_chunking(web_fleet: Fleet, watched: Watched) -> None:
    page = sign_in(watched, web_fleet)
    frames = (
        'id: 1\r\nevent: node.state\r\ndata: {"a":1}\r\n\r\n: keep-alive\n\n'
        'id: 2\nevent: task.state\ndata: {"b":\ndata: 2}\n\ndata: no id\n\n'
    )
    script = """async (text) => {
      const { SseParser } = await import('/ui/js/sse.js');
      const runs = [];
      for (const size of [1, 2, 3, 7, text.length]) {
        const got = [];
        const parser = new SseParser((e) => got.push(e));
        for (let i = 0; i < text.length; i += size) parser.push(text.slice(i, i + size));
        runs.push(got);
      }
      return runs;
    }"""
    runs = page.evaluate(script, frames)
    expected = [
        {"id": "1", "type": "node.state", "data": '{"a":1}'},
        {"id": "2", "type": "task.state", "data": '{"b":\n2}'},
        {"id": None, "type": "message", "data": "no id"},
    ]
    assert runs == [expected] * 5


def test_the_event_feed_stops_at_a_finished_end_and_on_a_revoked_key(web_fleet: Fleet, watched: Watched) -> None:
    """A 204 (finished task, nothing after the cursor) ends the feed without reconnecting; a stream
    closed with `error: key_revoked` stops with the server's reason instead of retrying."""
    made = api_key(web_fleet, "viewer")
    page = sign_in(watched, web_fleet, key=made["key"])
    done = web_fleet.submit({"nodes": [{"id": "a", "commands": [shell(["true"])]}]}, name="feed-done")
    web_fleet.wait_task(done["id"])
    with web_fleet.server.client() as c:
        last = max(
            int(line[3:])
            for line in c.get(f"/v1/tasks/{done['id']}/events").text.splitlines()
            if line.startswith("id:")
        )
    statuses = page.evaluate(
        """async ([url, after]) => {
          const { EventFeed } = await import('/ui/js/sse.js');
          const seen = [];
          await new Promise((resolve) => {
            const onStatus = (s) => { seen.push(s); if (s !== 'live') resolve(); };
            new EventFeed(url, { after, onEvent: () => {}, onStatus }).start();
            setTimeout(resolve, 20000);
          });
          return seen;
        }""",
        [f"/v1/tasks/{done['id']}/events", last],
    )
    assert statuses == ["ended"]
    nodes = [{"id": f"n{i}", "commands": [shell(["sleep", "0.3"])]} for i in range(60)]
    edges = [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(59)]
    running = web_fleet.submit({"nodes": nodes, "edges": edges}, name="feed-revoked")
    try:
        page.evaluate(
            """async (url) => {
              const { EventFeed } = await import('/ui/js/sse.js');
              window.__feed = [];
              new EventFeed(url, { onEvent: () => {}, onStatus: (s, d) => window.__feed.push([s, d || '']) }).start();
            }""",
            f"/v1/tasks/{running['id']}/events",
        )
        wait_until(lambda: ["live", ""] in page.evaluate("window.__feed"), 30, "the feed going live")
        with web_fleet.server.client() as c:
            assert c.delete(f"/v1/api-keys/{made['id']}").status_code == 200
        wait_until(lambda: any(s == "error" for s, _ in page.evaluate("window.__feed")), 30, "the feed stopping")
        feed = page.evaluate("window.__feed")
        assert feed[-1][0] == "error" and "revoked" in feed[-1][1], feed
        assert ["reconnecting", ""] not in feed, feed
    finally:
        with web_fleet.server.client() as c:
            c.post(f"/v1/tasks/{running['id']}/cancel")


def agent_named(fleet: Fleet, name: str, labels: dict[str, str]) -> Any:
    found = next((a for a in fleet.agents if a.name == name), None)
    return found or fleet.agent(name, labels)


def test_the_devices_page_colours_each_state_and_shows_the_batch(web_fleet: Fleet, watched: Watched) -> None:
    alpha, beta = web_fleet.agents[0], web_fleet.agents[1]
    parked = agent_named(web_fleet, "parked", {"role": "parked"})
    web_fleet.enroll("lab-phone", {"kind": "phone", "os": "android"})  # never connects: enrolled
    gate = beta.workspace / "hold"
    gate.unlink(missing_ok=True)
    hold = {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "while [ ! -f hold ]; do sleep 0.05; done"]}}
    task = web_fleet.submit(
        {
            "nodes": [
                {"id": "hold", "placement": {"device": "beta"}, "commands": [hold]},
                {"id": "after", "placement": {"device": "beta"}, "commands": [shell(["true"])]},
            ]
        },
        name="hold-beta",
    )
    with web_fleet.server.client() as c:
        assert c.post(f"/v1/devices/{alpha.device_id}/drain").status_code == 200
        assert c.post(f"/v1/devices/{parked.device_id}/cordon").status_code == 200
    try:
        page = sign_in(watched, web_fleet)
        busy = page.wait_for_selector(device_row("beta", "busy"))
        batch = web_fleet.device(beta.device_id)["current_batch"]
        assert batch and busy.query_selector(f"[title='{batch}']") is not None
        for name, state in (("alpha", "drained"), ("parked", "cordoned"), ("lab-phone", "enrolled")):
            page.wait_for_selector(device_row(name, state))
        assert page.inner_text(device_row("lab-phone", "enrolled") + " td:nth-child(7)") == "never"
        colours = page.eval_on_selector_all(
            "#devices-table tbody tr .pill", "ps => ps.map(p => [p.dataset.state, getComputedStyle(p).color])"
        )
        by_state = dict(colours)
        assert {"busy", "drained", "cordoned", "enrolled"} <= set(by_state)
        assert len(set(by_state.values())) == len(by_state)  # each state has its own colour
        page.wait_for_selector(".summary .chip.st-busy")
        shot(page, "devices-states", "dashboard-devices.png")
    finally:
        gate.write_text("")
        with web_fleet.server.client() as c:
            c.post(f"/v1/devices/{alpha.device_id}/uncordon")
            c.post(f"/v1/devices/{parked.device_id}/uncordon")
    assert web_fleet.wait_task(task["id"])["state"] == "succeeded"


def test_dag_edited_redraws_and_a_stream_resumes_after_its_last_id(web_fleet: Fleet, watched: Watched) -> None:
    """Re-planning needs an LLM, so the server is stood in for by canned answers for one task."""
    page = sign_in(watched, web_fleet)
    page.wait_for_selector("#devices-table")
    at = "2030-01-01T00:00:00Z"

    def node(node_id: str, state: str) -> dict[str, Any]:
        return {"id": node_id, "kind": "tool", "state": state, "placement": {}, "retry": {}, "commands": []}

    def task(version: int) -> dict[str, Any]:
        if version == 1:
            nodes = [node("fetch", "running"), node("parse", "pending")]
        else:  # after the edit: the server's view once every event below has happened
            nodes = [node("fetch", "failed"), node("parse", "skipped"), node("notify", "succeeded")]
        edges = [{"from": "fetch", "to": "parse", "on": "success"}]
        if version == 2:
            edges.append({"from": "fetch", "to": "notify", "on": "failure"})
        return {
            "id": "task_fake",
            "name": "replanned",
            "state": "running" if version == 1 else "succeeded",
            "priority": 0,
            "labels": {},
            "created_at": at,
            "dag_version": version,
            "node_counts": {},
            "nodes": nodes,
            "edges": edges,
        }

    def frame(event_id: int, type_: str, data: dict[str, Any]) -> str:
        body = {"task_id": "task_fake", "at": at, **data}
        return f"id: {event_id}\nevent: {type_}\ndata: {json.dumps(body)}\n\n"

    served = {"version": 1}
    streams = {
        "0": frame(1, "node.state", {"node_id": "fetch", "state": "failed"}) + frame(2, "dag.edited", {"version": 2}),
        "2": frame(3, "node.state", {"node_id": "parse", "state": "skipped"})
        + frame(4, "node.state", {"node_id": "notify", "state": "succeeded"})
        + frame(5, "task.state", {"state": "succeeded"}),
    }

    def on_task(route: Any) -> None:
        route.fulfill(json=task(served["version"]))

    def on_events(route: Any) -> None:
        after = route.request.url.rsplit("after=", 1)[1]
        if after == "2":
            served["version"] = 2  # the edit is visible once the first stream has been read
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=streams.get(after, ""))

    page.route("**/v1/tasks/task_fake", on_task)
    page.route("**/v1/tasks/task_fake/events?after=*", on_events)
    page.goto(f"{web_fleet.server.url}/#/tasks/task_fake")
    page.wait_for_selector("#task-state [data-state=succeeded]")
    page.wait_for_selector(node_sel("notify", "succeeded"))
    states = page.eval_on_selector_all(
        "svg.dag g.node", "gs => Object.fromEntries(gs.map(g => [g.dataset.nodeId, g.dataset.state]))"
    )
    assert states == {"fetch": "failed", "parse": "skipped", "notify": "succeeded"}
    assert page.query_selector("svg.dag path.edge[data-from=fetch][data-to=notify][data-on=failure]") is not None
    event_urls = [u for u in watched.urls if "/task_fake/events" in u]
    assert [u.rsplit("after=", 1)[1] for u in event_urls] == ["0", "2"]
    assert page.inner_text("#stream-status") == "Final"


def test_graph_nodes_name_their_device_and_count_attempts(web_fleet: Fleet, watched: Watched) -> None:
    # files.read is read-only, so its failures are retried: two attempts on alpha.
    task = web_fleet.submit(
        {
            "nodes": [
                {"id": "hello", "placement": {"device": "beta"}, "commands": [shell(["echo", "hi"])]},
                {
                    "id": "flaky-read",
                    "placement": {"device": "alpha"},
                    "retry": {"max_attempts": 2, "backoff_s": 0},
                    "commands": [{"tool": "files.read", "arguments": {"path": "no-such-file.txt"}}],
                },
            ]
        },
        name="graph-labels",
    )
    done = web_fleet.wait_task(task["id"])
    assert len(web_fleet.node(done, "flaky-read")["attempts"]) == 2
    page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")
    page.wait_for_selector(node_sel("flaky-read", "failed") + "[data-device=alpha]")
    runs = page.eval_on_selector_all(
        "svg.dag g.node",
        "gs => Object.fromEntries(gs.map(g => [g.dataset.nodeId,"
        " [g.dataset.device, g.dataset.attempts, g.querySelector('.node-run').textContent]]))",
    )
    assert runs == {"hello": ["beta", "1", "beta · 1 attempt"], "flaky-read": ["alpha", "2", "alpha · 2 attempts"]}
    assert "alpha · 2 attempts" in (page.get_attribute(node_sel("flaky-read"), "aria-label") or "")
