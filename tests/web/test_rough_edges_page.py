"""Small things a new user met on the dashboard, in a real Chromium against a real server and
agents: the stop banner reads as sentences, and a toast never sits over the task page's
Re-run button (a click after an action must hit the button, not the toast)."""

from __future__ import annotations

import re
from typing import Any

from tests.support import Fleet
from tests.web.conftest import Watched
from tests.web.test_dashboard import api_key, node_sel, sign_in
from tests.web.test_device_page import shows_state, two_step

RUN_TOGETHER = re.compile(r"[.!?:][A-Za-z]|[a-z0-9)] [A-Z]")  # "stop.Stopped", "window It takes"


def banner_text(page: Any) -> str:
    return " ".join(str(page.wait_for_selector("#device-stopped").inner_text()).split())


def test_the_stop_banner_reads_as_sentences_with_and_without_a_reason(web_fleet: Fleet, watched: Watched) -> None:
    beta = web_fleet.agents[1]
    page = sign_in(watched, web_fleet, hash_=f"#/devices/{beta.device_id}")
    shows_state(page, "idle")
    try:
        with web_fleet.server.client() as c:
            r = c.post(f"/v1/devices/{beta.device_id}/stop", json={"reason": "maintenance window"})
            assert r.status_code == 200, r.text
        shows_state(page, "stopped")
        text = banner_text(page)
        assert text.startswith("Emergency stop. Stopped by an operator (key "), text
        assert "maintenance window. It takes no work" in text, text
        assert not RUN_TOGETHER.search(text.replace("(key ", "(key_")), text

        with web_fleet.server.client() as c:
            assert c.post(f"/v1/devices/{beta.device_id}/resume").status_code == 200
            shows_state(page, "idle")
            assert c.post(f"/v1/devices/{beta.device_id}/stop").status_code == 200  # no reason given
        shows_state(page, "stopped")
        text = banner_text(page)
        assert re.match(r"Emergency stop\. Stopped by an operator \(key key_\w+\)\. It takes no work", text), text
    finally:
        with web_fleet.server.client() as c:
            c.post(f"/v1/devices/{beta.device_id}/resume")
        web_fleet.wait_device(beta.device_id, "idle")


def hit(page: Any, selector: str) -> str:
    """What a click at the centre of `selector` lands on: `button` if on it (or inside it), else
    the element that took it, described."""
    return str(
        page.evaluate(
            """sel => {
                 const el = document.querySelector(sel);
                 const r = el.getBoundingClientRect();
                 const top = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);
                 return el.contains(top) ? "button" : `${top?.tagName}.${top?.className}`;
               }""",
            selector,
        )
    )


def test_a_toast_never_covers_the_rerun_button(web_fleet: Fleet, watched: Watched) -> None:
    """A refused re-run shows an error toast (it stays 12 s); the button is clickable meanwhile."""
    done = two_step(web_fleet, "toast-under")
    viewer = api_key(web_fleet, "viewer")
    page = watched.page
    # The role cannot be learnt, so the viewer is offered the button and the server refuses it.
    page.route("**/v1/api-keys/me", lambda route: route.fulfill(status=404, json={"code": "not_found"}))
    page = sign_in(watched, web_fleet, viewer["key"], hash_=f"#/tasks/{done['id']}")
    page.wait_for_selector(node_sel("use", "succeeded"))
    for shown in (1, 2, 3):  # a few toasts stacked: none of them over the button either
        page.click("#rerun-task")
        page.click("#rerun-task.confirm")
        page.wait_for_function("n => document.querySelectorAll('#flash .flash-error').length === n", arg=shown)
        assert "Re-run refused" in page.inner_text("#flash")
        assert hit(page, "#rerun-task") == "button"
    page.click(node_sel("use"))
    page.wait_for_selector("#rerun-node:visible")
    assert hit(page, "#rerun-node") == "button"
    assert page.query_selector_all("#flash .flash-error"), "the toasts went before the check"
    page.click("#rerun-task", trial=True, timeout=2_000)  # Playwright's own check: nothing intercepts
