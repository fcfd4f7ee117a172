"""The approvals view (#/approvals), the top bar's pending count and a node waiting for approval
on the task page (issue 18), in a real browser against a real server and real agents: `desk`
asks before every `files.write`; `owner`'s owner decides its approvals on the device only. The
screenshot test runs its own GUI agent under Xvfb (tests/gui/conftest.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gui.conftest import xvfb  # noqa: F401  (the X display fixture)
from tests.support import Fleet, run_cli, wait_until
from tests.web.conftest import Watched, shot, watching
from tests.web.test_dashboard import api_key, node_sel, sign_in

APPROVE_WRITES = {"ORRERY_AGENT_APPROVAL_REQUIRED": '["files.write"]'}


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """This module's own fleet (it overrides the shared one): two agents that ask first."""
    with Fleet(tmp_path_factory.mktemp("web-approvals"), heartbeat_interval_s="1") as f:
        f.agent("desk", **APPROVE_WRITES)
        f.agent("owner", ORRERY_AGENT_APPROVALS_LOCAL_ONLY="true", **APPROVE_WRITES)
        yield f


def write_task(fleet: Fleet, device: str, path: str, content: str = "ran\n", name: str = "") -> dict[str, Any]:
    command = {"tool": "files.write", "arguments": {"path": path, "content": content}}
    dag = {"nodes": [{"id": "n1", "placement": {"device": device}, "commands": [command]}], "edges": []}
    return fleet.submit(dag, name=name or f"write {path}")


def pending(fleet: Fleet, task_id: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        with fleet.server.client() as c:
            items = c.get("/v1/approvals", params={"state": "pending", "task_id": task_id}).json()["items"]
        return items[0] if items else None

    return wait_until(found, 30, f"a pending approval of task {task_id}")


def decide(fleet: Fleet, approval_id: str, verb: str = "deny") -> None:
    with fleet.server.client() as c:
        r = c.post(f"/v1/approvals/{approval_id}/{verb}", json={"reason": "test cleanup"})
        assert r.status_code in (200, 409), r.text


def card(approval_id: str, state: str | None = None) -> str:
    return f"article.approval[data-approval-id='{approval_id}']" + (f"[data-state='{state}']" if state else "")


def test_an_operator_approves_from_the_dashboard_and_the_command_runs(web_fleet: Fleet, watched: Watched) -> None:
    desk = web_fleet.agents[0]
    task = write_task(web_fleet, "desk", "web-approved.txt", "<b>not markup</b>\n", name="write the report")
    approval = pending(web_fleet, task["id"])
    page = sign_in(watched, web_fleet, hash_="#/approvals")

    item = page.wait_for_selector(card(approval["id"], "pending"))
    assert item.query_selector(".approval-tool").inner_text() == "files.write"
    args = item.query_selector("pre.approval-args").inner_text()
    assert '"path": "web-approved.txt"' in args and "<b>not markup</b>" in args  # text, not markup
    assert item.query_selector("pre.approval-args b") is None
    assert "files.write" in item.query_selector(".approval-reason").inner_text()
    link = item.query_selector("a.approval-task")
    assert link.get_attribute("href") == f"#/tasks/{task['id']}?node=n1"
    assert "node n1" in link.inner_text()
    page.wait_for_selector(f"{card(approval['id'])} a.approval-task:has-text('write the report')")
    page.wait_for_selector(f"{card(approval['id'])} a.approval-device:has-text('desk')")  # the name, once known
    assert item.query_selector(".approval-expires time") is not None
    assert page.inner_text("#approvals-count") == "1"
    assert not (desk.workspace / "web-approved.txt").exists()  # nothing runs while it waits
    page.wait_for_timeout(250)
    shot(page, "approvals", "dashboard-approvals.png")

    page.fill(f"{card(approval['id'])} .approval-reason-input", "report looks right")
    page.click(f"{card(approval['id'])} button[data-decide=approve]")
    decided = page.wait_for_selector(card(approval["id"], "approved"))  # stays on the list, decided
    assert "report looks right" in decided.inner_text()
    assert decided.query_selector("button[data-decide]") is None
    page.wait_for_selector("#approvals-count[hidden]", state="attached")

    done = web_fleet.wait_task(task["id"])
    assert done["state"] == "succeeded", done
    assert (desk.workspace / "web-approved.txt").read_text() == "<b>not markup</b>\n"
    with web_fleet.server.client() as c:
        seen = c.get(f"/v1/approvals/{approval['id']}").json()
    assert seen["state"] == "approved" and seen["decision_reason"] == "report looks right"

    # The decided ones are a filter away; the task link opens the task with the node's panel.
    page.click("#approvals-filter button[data-state=approved]")
    page.wait_for_selector(card(approval["id"], "approved"))
    assert page.url.endswith("#/approvals?state=approved")
    page.click(f"{card(approval['id'])} a.approval-task")
    page.wait_for_selector("#node-panel[data-node-id=n1]")
    page.wait_for_selector(f"#node-approvals {card(approval['id'], 'approved')}")


def test_a_node_waiting_for_approval_is_denied_from_the_task_page(web_fleet: Fleet, watched: Watched) -> None:
    desk = web_fleet.agents[0]
    task = write_task(web_fleet, "desk", "web-denied.txt")
    page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")
    page.wait_for_selector(node_sel("n1", "waiting_approval"))
    assert page.is_visible(".legend .st-waiting_approval")
    approval = pending(web_fleet, task["id"])
    page.wait_for_selector("#approval-banner:not([hidden])")
    shot(page, "task-waiting-approval")

    page.click("#approval-banner:not([hidden]) button[data-node=n1]")
    panel = page.wait_for_selector(f"#node-panel[data-node-id=n1] #node-approvals {card(approval['id'], 'pending')}")
    assert '"path": "web-denied.txt"' in panel.query_selector("pre.approval-args").inner_text()
    assert page.inner_text("#node-panel .panel-head .pill") == "waiting_approval"
    page.wait_for_timeout(250)  # the panel's open transition
    shot(page, "task-approval-panel")
    page.fill("#node-approvals .approval-reason-input", "not today")
    page.click("#node-approvals button[data-decide=deny]")
    page.wait_for_selector(f"#node-approvals {card(approval['id'], 'denied')}")
    page.wait_for_selector(node_sel("n1", "failed"))
    page.wait_for_selector("#approval-banner[hidden]", state="attached")
    assert "approval_denied" in page.wait_for_selector("#node-panel .callout.error .error-code").inner_text()

    done = web_fleet.wait_task(task["id"])
    node = web_fleet.node(done, "n1")
    assert node["error"]["code"] == "approval_denied" and "not today" in node["error"]["message"], node
    assert not (desk.workspace / "web-denied.txt").exists()  # the command never ran


def test_a_decision_made_elsewhere_shows_the_servers_conflict(web_fleet: Fleet, watched: Watched) -> None:
    task = write_task(web_fleet, "desk", "web-conflict.txt")
    approval = pending(web_fleet, task["id"])
    page = sign_in(watched, web_fleet, hash_="#/approvals")
    page.wait_for_selector(card(approval["id"], "pending"))
    # The list on screen is held as it is, so the page still offers a decision taken meanwhile.
    held = page.evaluate(
        "async () => (await fetch('/v1/approvals?state=pending', {headers: {Authorization: "
        "`Bearer ${sessionStorage.getItem('orrery.apiKey')}`}})).text()"
    )
    page.route(re.compile(r"/v1/approvals\?"), lambda route: route.fulfill(body=held, content_type="application/json"))
    decide(web_fleet, approval["id"], "approve")

    page.click(f"{card(approval['id'])} button[data-decide=deny]")
    error = page.wait_for_selector(f"{card(approval['id'])} .approval-error")
    assert "already approved" in error.inner_text(), error.inner_text()
    assert "Deny refused" in page.inner_text(".flash-error")
    page.wait_for_selector(card(approval["id"], "approved"))  # the card then says what happened
    assert web_fleet.wait_task(task["id"])["state"] == "succeeded"


def test_a_viewer_sees_the_approvals_but_no_buttons(web_fleet: Fleet, watched: Watched) -> None:
    task = write_task(web_fleet, "desk", "web-viewer.txt")
    approval = pending(web_fleet, task["id"])
    viewer = api_key(web_fleet, "viewer")
    try:
        page = sign_in(watched, web_fleet, viewer["key"], hash_="#/approvals")
        item = page.wait_for_selector(card(approval["id"], "pending"))
        assert '"path": "web-viewer.txt"' in item.query_selector("pre.approval-args").inner_text()
        assert item.query_selector(".approval-viewer") is not None
        assert item.query_selector("button[data-decide]") is None
        assert item.query_selector(".approval-reason-input") is None
        page.wait_for_selector("#approvals-count:not([hidden])")
        # The task page does not offer them either.
        page.click(f"{card(approval['id'])} a.approval-task")
        page.wait_for_selector(f"#node-approvals {card(approval['id'], 'pending')} .approval-viewer")
        assert page.query_selector("#node-approvals button[data-decide]") is None
    finally:
        decide(web_fleet, approval["id"])
    web_fleet.wait_task(task["id"])


def test_a_local_only_approval_points_to_the_device_and_the_top_bar_counts(web_fleet: Fleet, watched: Watched) -> None:
    owner = web_fleet.agents[1]
    at_desk = write_task(web_fleet, "desk", "web-count.txt")
    at_owner = write_task(web_fleet, "owner", "web-local.txt")
    desk_approval = pending(web_fleet, at_desk["id"])
    local = pending(web_fleet, at_owner["id"])
    assert local["local_only"] is True
    try:
        page = sign_in(watched, web_fleet)  # the devices page: the count is in the top bar
        page.wait_for_selector("#approvals-count:text-is('2')")
        assert "2 approvals pending" in page.get_attribute("a.nav-link[data-nav=approvals]", "title")

        page.click("a.nav-link[data-nav=approvals]")
        item = page.wait_for_selector(card(local["id"], "pending"))
        assert item.get_attribute("data-local-only") == "true"
        hint = item.query_selector(".approval-local").inner_text()
        assert f"orrery agent approve {local['id']}" in hint and "on the device" in hint
        assert item.query_selector("button[data-decide]") is None
        assert page.query_selector(f"{card(desk_approval['id'])} button[data-decide=approve]") is not None

        decide(web_fleet, desk_approval["id"])  # decided by someone else: the count follows
        page.wait_for_selector("#approvals-count:text-is('1')")
        denied = run_cli(None, "agent", "deny", local["id"], "--data-dir", str(owner.data_dir))
        assert denied.returncode == 0, denied.stderr
        page.wait_for_selector("#approvals-count[hidden]", state="attached")
        page.wait_for_selector(card(local["id"]), state="detached")  # no longer pending
    finally:
        decide(web_fleet, desk_approval["id"])
        run_cli(None, "agent", "deny", local["id"], "--data-dir", str(owner.data_dir))
    assert web_fleet.wait_task(at_owner["id"])["state"] == "failed"


def test_a_gui_actions_screenshot_is_fetched_with_the_key_and_shown(tmp_path: Path, xvfb: str, browser: Any) -> None:  # noqa: F811
    """A real GUI agent under Xvfb: `gui.observe`, then a `gui.click` on that observation waits
    for approval with the screenshot it was planned on; the page shows it from an object URL."""
    with Fleet(tmp_path, heartbeat_interval_s="1") as fleet, watching(browser, fleet) as w:
        fleet.agent(
            "screen",
            extra_args=["--toolset", "gui", "--toolset", "system"],
            DISPLAY=xvfb,
            ORRERY_AGENT_APPROVAL_REQUIRED='["gui.click"]',
        )
        click = {"observation_id": "${nodes.look.output.observation_id}", "action_id": "web-click-1", "x": 5, "y": 5}
        dag = {
            "nodes": [
                {
                    "id": "look",
                    "placement": {"device": "screen"},
                    "commands": [{"tool": "gui.observe", "arguments": {}}],
                },
                {
                    "id": "n1",
                    "placement": {"device": "screen"},
                    "commands": [{"tool": "gui.click", "arguments": click}],
                },
            ],
            "edges": [{"from": "look", "to": "n1"}],
        }
        task = fleet.submit(dag)
        approval = pending(fleet, task["id"])
        assert approval["tool"] == "gui.click"
        assert approval["screenshot_url"] == f"/v1/approvals/{approval['id']}/screenshot"
        page = sign_in(w, fleet, hash_="#/approvals")
        selector = f"{card(approval['id'])} img.approval-shot"
        img = page.wait_for_selector(f"{selector}:not([hidden])")
        assert img.get_attribute("src").startswith("blob:")  # an <img src> could not send the key
        width = page.wait_for_function("sel => document.querySelector(sel)?.naturalWidth", arg=selector).json_value()
        assert width > 100, width
        with fleet.server.client() as c:
            image = c.get(approval["screenshot_url"])
        assert image.headers["content-type"] == "image/png" and image.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in image.headers["content-security-policy"].split("; "), image.headers
        assert image.headers["x-frame-options"] == "DENY"
        page.wait_for_timeout(3500)  # a poll or two later, the screenshot was still fetched once
        assert sum(u.endswith(approval["screenshot_url"]) for u in w.urls) == 1
        page.click(f"{card(approval['id'])} button[data-decide=deny]")
        page.wait_for_selector(card(approval["id"], "denied"))
        assert fleet.wait_task(task["id"])["state"] == "failed"
