"""Security headers: every page (the dashboard, /docs), JSON answer, image and download carries
them, the pages under a strict Content-Security-Policy (no inline script, no eval, never framed),
and the dashboard's views and /docs work under it in a real Chromium, which the page check
(tests/web/conftest.py) fails on any violation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import Fleet, wait_until
from tests.web.conftest import Watched, watching
from tests.web.test_dashboard import sign_in

SECURED = ("x-content-type-options", "x-frame-options", "referrer-policy", "content-security-policy")


def directives(policy: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in policy.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def assert_page_policy(r: httpx.Response) -> None:
    assert r.headers["x-content-type-options"] == "nosniff", r.headers
    assert r.headers["x-frame-options"] == "DENY"
    csp = directives(r.headers["content-security-policy"])
    assert csp["script-src"] == ["'self'"]  # no 'unsafe-inline', no 'unsafe-eval'
    assert csp["default-src"] == ["'self'"] and csp["object-src"] == ["'none'"]
    assert csp["frame-ancestors"] == ["'none'"] and csp["connect-src"] == ["'self'"]
    assert "'unsafe-inline'" not in r.headers["content-security-policy"]
    assert "'unsafe-eval'" not in r.headers["content-security-policy"]


def test_the_pages_are_served_under_a_strict_content_security_policy(web_fleet: Fleet) -> None:
    base = web_fleet.server.url
    for path in ("/", "/docs", "/docs/oauth2-redirect"):
        r = httpx.get(f"{base}{path}", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), path
        assert_page_policy(r)
        assert "<script>" not in r.text, f"{path} has an inline script"


def test_json_answers_problems_and_assets_are_not_sniffed_or_framed(web_fleet: Fleet) -> None:
    base = web_fleet.server.url
    with web_fleet.server.client() as c:
        answers = {
            "devices": c.get("/v1/devices"),
            "openapi": c.get("/openapi.json"),
            "health": c.get("/healthz"),
            "problem": c.get("/v1/tasks/task_nothing"),
            "unauthorized": httpx.get(f"{base}/v1/devices", timeout=10),
        }
    for name, r in answers.items():
        for header in SECURED:
            assert header in r.headers, (name, header, r.headers)
        assert r.headers["x-content-type-options"] == "nosniff"
        csp = directives(r.headers["content-security-policy"])
        assert csp["default-src"] == ["'none'"] and "sandbox" in csp and csp["frame-ancestors"] == ["'none'"]
    script = httpx.get(f"{base}/ui/js/main.js", timeout=10)
    assert script.headers["x-content-type-options"] == "nosniff"
    assert script.headers["content-type"].startswith("text/javascript")


def test_the_dashboards_views_work_under_the_policy(web_fleet: Fleet, watched: Watched) -> None:
    """Each view renders with the policy on (the page check fails the test on any violation)."""
    page = sign_in(watched, web_fleet)
    page.wait_for_selector("#devices-table tr[data-state]")
    task = web_fleet.submit(
        {"nodes": [{"id": "hello", "commands": [{"tool": "shell.run", "arguments": {"argv": ["true"]}}]}]}
    )
    web_fleet.wait_task(task["id"])
    alpha = web_fleet.agents[0].device_id
    for hash_, ready in [
        ("#/tasks", "#tasks-table"),
        (f"#/tasks/{task['id']}", "svg"),
        (f"#/devices/{alpha}", "header.topbar"),
        ("#/approvals", "header.topbar"),
        ("#/schedules", "header.topbar"),
    ]:
        page.goto(f"{web_fleet.server.url}/{hash_}")
        page.wait_for_selector(ready)
        page.wait_for_load_state("networkidle")
    assert watched.violations == []


def test_a_page_that_breaks_the_policy_is_caught(web_fleet: Fleet, browser: Any) -> None:
    """The check is live: a page with an inline script, served with the headers `/` has, fails it."""
    origin = web_fleet.server.url
    served = httpx.get(f"{origin}/", timeout=10).headers
    headers = {h: served[h] for h in SECURED}

    def probe(route: Any) -> None:
        body = "<!doctype html><title>probe</title><script>document.title = 'ran'</script>"
        route.fulfill(status=200, headers={**headers, "content-type": "text/html"}, body=body)

    with (
        pytest.raises(AssertionError, match="Content-Security-Policy violations") as caught,
        watching(browser, web_fleet) as w,
    ):
        w.page.route(f"{origin}/csp-probe", probe)
        w.page.goto(f"{origin}/csp-probe")
        wait_until(lambda: w.violations, 10, "the browser to report the inline script")
        assert w.page.title() == "probe"  # the inline script did not run
    assert "script-src" in str(caught.value)
