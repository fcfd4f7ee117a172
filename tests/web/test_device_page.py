"""The device page (#/devices/<id>), the devices list's link from a busy device to its task, and
re-running a finished task from its page, in a real browser against a real server and agents.

Most of these use the lifecycle endpoints of issue 13 (GET /v1/devices/{id}/attempts and
/history, DeviceOut.current_task_id, POST /v1/tasks/{id}/rerun, TaskOut.rerun_of)."""

from __future__ import annotations

from typing import Any

from tests.support import Fleet, shell
from tests.web.conftest import Watched, shot
from tests.web.test_dashboard import api_key, device_row, node_sel, sign_in

POLICY = {
    "shell_allow": ["echo", "ls"],
    "shell_deny": ["rm"],
    "approval_required": ["shell.run"],
    "unattended": False,
    "kill_switch": True,
}


def run_on_alpha(fleet: Fleet, name: str) -> dict[str, Any]:
    """A finished task with two nodes on alpha: one ok, one read that fails twice (retried)."""
    task = fleet.submit(
        {
            "nodes": [
                {"id": "greet", "placement": {"device": "alpha"}, "commands": [shell(["echo", "hi"])]},
                {
                    "id": "read-missing",
                    "placement": {"device": "alpha"},
                    "retry": {"max_attempts": 2, "backoff_s": 0},
                    "commands": [{"tool": "files.read", "arguments": {"path": "missing.txt"}}],
                },
            ],
            "edges": [{"from": "greet", "to": "read-missing"}],
        },
        name=name,
    )
    return fleet.wait_task(task["id"])


def test_a_device_page_shows_labels_tools_attempts_and_history(web_fleet: Fleet, watched: Watched) -> None:
    """Needs the lifecycle endpoints (attempts, history)."""
    alpha = web_fleet.agents[0]
    done = run_on_alpha(web_fleet, "device-page-work")
    page = sign_in(watched, web_fleet)
    page.click(f"{device_row('alpha', 'idle')} a.device-name")
    page.wait_for_selector("#device-overview")
    assert page.url.endswith(f"#/devices/{alpha.device_id}")
    assert page.inner_text("h1.device-title") == "alpha"
    assert page.inner_text("#device-state") == "idle"
    labels = page.inner_text("#device-labels")
    assert "role=producer" in labels and "zone=eu-1" in labels
    assert '"platform": "linux"' in page.inner_text("#device-info")

    # Tools: each with its description and whether a retry is safe; the schema opens on demand.
    shell_run = page.wait_for_selector("details.tool[data-tool='shell.run']")
    assert shell_run.query_selector("[data-retry-safe=false]").inner_text() == "not retry-safe"
    read = page.wait_for_selector("details.tool[data-tool='files.read']")
    assert read.query_selector("[data-retry-safe=true]").inner_text() == "retry-safe"
    assert "read-only" in read.inner_text() and "Read a file" in read.inner_text()
    assert not page.is_visible("details.tool[data-tool='files.read'] .tool-schema")
    page.click("details.tool[data-tool='files.read'] summary")
    schema = page.wait_for_selector("details.tool[data-tool='files.read'] .tool-schema")
    assert '"path"' in schema.inner_text() and '"required"' in schema.inner_text()

    # Recent attempts, newest first, each linking to its task; the state history.
    rows = page.wait_for_selector("#attempts-table")
    got = page.eval_on_selector_all(
        "#attempts-table tbody tr", "rs => rs.map(r => [r.dataset.taskId, r.dataset.nodeId, r.dataset.status])"
    )
    ours = [g for g in got if g[0] == done["id"]]
    assert [g[1] for g in ours] == ["read-missing", "read-missing", "greet"], got
    assert "device-page-work" in rows.inner_text()
    assert "missing.txt" in rows.inner_text()  # the error of a failed attempt
    history = page.wait_for_selector("#history-list")
    states = page.eval_on_selector_all("#history-list li", "ls => ls.map(l => l.dataset.state)")
    assert "idle" in states, states  # it came online
    assert history.is_visible()
    page.wait_for_timeout(250)
    shot(page, "device", "dashboard-device.png")

    page.click(f"#attempts-table tr[data-node-id=greet][data-task-id='{done['id']}'] a.attempt-task")
    page.wait_for_selector(node_sel("greet", "succeeded"))
    assert page.url.endswith(f"#/tasks/{done['id']}")


def test_the_device_page_shows_the_policy_the_agent_reports(web_fleet: Fleet, watched: Watched) -> None:
    """The policy is drawn from `info.policy` as the server passes it on (the agent's report is
    stood in for here, so this also runs against agents that do not send one)."""
    beta = web_fleet.agents[1]
    page = sign_in(watched, web_fleet)
    page.wait_for_selector("#devices-table")

    def with_policy(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        body["info"] = {**body["info"], "policy": POLICY}
        route.fulfill(response=response, json=body)

    page.route(f"**/v1/devices/{beta.device_id}", with_policy)
    page.goto(f"{web_fleet.server.url}/#/devices/{beta.device_id}")
    policy = page.wait_for_selector("#device-policy").inner_text()
    assert "echo, ls" in policy and "rm" in policy and "shell.run" in policy
    assert "ON: the agent refuses all work" in policy
    assert '"policy"' not in page.inner_text("#device-info")  # shown once, as the policy
    assert page.inner_text("h1.device-title") == "beta"


def test_an_unknown_device_says_so(web_fleet: Fleet, watched: Watched) -> None:
    page = sign_in(watched, web_fleet, hash_="#/devices/dev_nope")
    assert "No such device" in page.wait_for_selector(".empty").inner_text()


def test_a_busy_devices_batch_links_to_its_task(web_fleet: Fleet, watched: Watched) -> None:
    """Needs DeviceOut.current_task_id / current_node_id."""
    beta = web_fleet.agents[1]
    gate = beta.workspace / "release"
    gate.unlink(missing_ok=True)
    hold = {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "while [ ! -f release ]; do sleep 0.05; done"]}}
    task = web_fleet.submit(
        {"nodes": [{"id": "held", "placement": {"device": "beta"}, "commands": [hold]}]}, name="held-on-beta"
    )
    try:
        page = sign_in(watched, web_fleet)
        # A locator, not an element handle: the device list is drawn again on each poll, and a
        # handle taken before a redraw is detached from the page by the time it is clicked.
        link = page.locator(f"{device_row('beta', 'busy')} a.current-task[data-task-id='{task['id']}']")
        link.wait_for()
        assert "held" in link.inner_text()
        link.click()
        page.wait_for_selector(node_sel("held", "running"))
        assert page.url.endswith(f"#/tasks/{task['id']}")
        page.goto(f"{web_fleet.server.url}/#/devices/{beta.device_id}")
        assert (
            "held"
            in page.wait_for_selector(f"#device-current a.current-task[data-task-id='{task['id']}']").inner_text()
        )
    finally:
        gate.write_text("")
    assert web_fleet.wait_task(task["id"])["state"] == "succeeded"


def two_step(fleet: Fleet, name: str) -> dict[str, Any]:
    task = fleet.submit(
        {
            "nodes": [
                {"id": "make", "placement": {"device": "alpha"}, "commands": [shell(["echo", "made"])]},
                {
                    "id": "use",
                    "placement": {"device": "beta"},
                    "commands": [shell(["echo", "${nodes.make.output.stdout}"])],
                },
            ],
            "edges": [{"from": "make", "to": "use"}],
        },
        name=name,
    )
    return fleet.wait_task(task["id"])


def test_the_task_page_offers_rerun_only_once_the_task_has_finished(web_fleet: Fleet, watched: Watched) -> None:
    beta = web_fleet.agents[1]
    gate = beta.workspace / "finish"
    gate.unlink(missing_ok=True)
    hold = {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "while [ ! -f finish ]; do sleep 0.05; done"]}}
    task = web_fleet.submit({"nodes": [{"id": "wait", "placement": {"device": "beta"}, "commands": [hold]}]})
    try:
        page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")
        page.wait_for_selector(node_sel("wait", "running"))
        assert page.is_visible("#cancel-task") and not page.is_visible("#rerun-task")
        page.click(node_sel("wait"))
        page.wait_for_selector("#node-panel[data-node-id=wait]")
        assert not page.is_visible("#rerun-node")
    finally:
        gate.write_text("")
    page.wait_for_selector("#task-state [data-state=succeeded]")
    page.wait_for_selector("#rerun-task:visible")
    page.wait_for_selector("#rerun-node:visible")
    assert not page.is_visible("#cancel-task")


def test_rerun_the_whole_task_then_from_a_node(web_fleet: Fleet, watched: Watched) -> None:
    """Needs POST /v1/tasks/{id}/rerun and TaskOut.rerun_of."""
    first = two_step(web_fleet, "rerun-me")
    assert first["state"] == "succeeded"
    page = sign_in(watched, web_fleet, hash_=f"#/tasks/{first['id']}")
    page.wait_for_selector(node_sel("use", "succeeded"))
    assert page.query_selector("#rerun-of") is None

    page.click("#rerun-task")
    page.click("#rerun-task.confirm")  # a second click confirms
    page.wait_for_url(lambda url: "#/tasks/" in url and not url.endswith(first["id"]))
    second_id = page.url.rsplit("#/tasks/", 1)[1]
    page.wait_for_selector(f"#rerun-of[href='#/tasks/{first['id']}']")
    page.wait_for_selector("#task-state [data-state=succeeded]")
    second = web_fleet.task(second_id)
    assert second["rerun_of"] == first["id"] and second["state"] == "succeeded"
    assert {n["id"] for n in second["nodes"]} == {"make", "use"}
    assert all(len(n["attempts"]) == 1 for n in second["nodes"])  # both ran again
    # The link shows the id at once and the first task's name once it is fetched.
    assert "rerun-me" in page.wait_for_selector("#rerun-of .strong").inner_text()

    # From a node: `use` runs again on the output `make` kept.
    page.click(node_sel("use"))
    page.wait_for_selector("#node-panel[data-node-id=use]")
    page.click("#rerun-node")
    page.click("#rerun-node.confirm")
    page.wait_for_url(lambda url: "#/tasks/" in url and not url.endswith(second_id))
    third_id = page.url.rsplit("#/tasks/", 1)[1]
    page.wait_for_selector(f"#rerun-of[href='#/tasks/{second_id}']")
    page.wait_for_selector("#task-state [data-state=succeeded]")
    third = web_fleet.wait_task(third_id)
    assert third["rerun_of"] == second_id
    use = web_fleet.node(third, "use")
    assert use["state"] == "succeeded" and use["output"]["stdout"] == "made\n\n"
    assert web_fleet.node(third, "make")["state"] == "succeeded"
    shot(page, "task-rerun")


def test_a_viewer_gets_no_rerun_button(web_fleet: Fleet, watched: Watched) -> None:
    done = two_step(web_fleet, "viewer-looks")
    viewer = api_key(web_fleet, "viewer")
    page = sign_in(watched, web_fleet, viewer["key"], hash_=f"#/tasks/{done['id']}")
    page.wait_for_selector(node_sel("use", "succeeded"))
    page.wait_for_function("() => document.querySelector('#rerun-task')?.hidden === true")
    page.click(node_sel("use"))
    page.wait_for_selector("#node-panel[data-node-id=use]")
    assert not page.is_visible("#rerun-node")


def test_a_rerun_refused_for_the_role_shows_the_servers_reason(web_fleet: Fleet, watched: Watched) -> None:
    """When the UI cannot learn the role it offers the button; the server's 403 is shown.
    Needs POST /v1/tasks/{id}/rerun."""
    done = two_step(web_fleet, "viewer-tries")
    viewer = api_key(web_fleet, "viewer")
    page = watched.page
    page.route("**/v1/api-keys/me", lambda route: route.fulfill(status=404, json={"code": "not_found"}))
    page = sign_in(watched, web_fleet, viewer["key"], hash_=f"#/tasks/{done['id']}")
    page.wait_for_selector(node_sel("use", "succeeded"))
    page.click("#rerun-task")
    page.click("#rerun-task.confirm")
    flash = page.wait_for_selector(".flash-error")
    assert "Re-run refused" in flash.inner_text() and "needs the 'operator' role" in flash.inner_text()
    assert page.url.endswith(f"#/tasks/{done['id']}")  # stayed
    assert page.is_visible("#rerun-task")


def shows_state(page: Any, state: str) -> None:
    page.wait_for_function("s => document.querySelector('#device-state')?.innerText.trim() === s", arg=state)


def test_an_operator_stops_a_device_with_a_reason_and_resumes_it_a_viewer_sees_no_stop(
    web_fleet: Fleet, watched: Watched
) -> None:
    """The emergency stop of issue 18 on the device page: two clicks, the reason shown in a banner."""
    beta = web_fleet.agents[1]
    page = sign_in(watched, web_fleet, hash_=f"#/devices/{beta.device_id}")
    shows_state(page, "idle")
    page.fill("#stop-reason", "the model clicks too fast")
    page.click("#stop-device")
    page.wait_for_selector("#stop-device.confirm")
    assert web_fleet.device(beta.device_id)["state"] == "idle"  # one click does nothing yet
    page.click("#stop-device")
    banner = page.wait_for_selector("#device-stopped")
    assert "the model clicks too fast" in banner.inner_text()
    assert page.inner_text("#device-state") == "stopped"
    assert page.is_disabled("button[data-action=uncordon]") and page.is_disabled("button[data-action=drain]")
    assert page.query_selector("#stop-device") is None
    device = web_fleet.device(beta.device_id)
    assert device["state"] == "stopped" and "the model clicks too fast" in device["stop_reason"]
    page.wait_for_selector("#history-list li[data-state=stopped]:has-text('the model clicks too fast')")
    shot(page, "device-stopped")

    page.click("#resume-device")
    shows_state(page, "idle")
    assert page.query_selector("#device-stopped") is None
    assert web_fleet.device(beta.device_id)["state"] == "idle"

    viewer = api_key(web_fleet, "viewer")
    page.click("#sign-out")
    page.wait_for_selector("#api-key")
    sign_in(watched, web_fleet, key=viewer["key"], hash_=f"#/devices/{beta.device_id}")
    shows_state(page, "idle")
    page.wait_for_function("() => !document.querySelector('#stop-device')")
