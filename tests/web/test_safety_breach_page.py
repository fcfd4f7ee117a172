"""Issue 18: a device cordoned by a breached safety budget says why on its page, in a real browser
against a real server and a real agent that breached its budget."""

from __future__ import annotations

from tests.support import Fleet
from tests.web.conftest import Watched
from tests.web.test_dashboard import sign_in


def test_the_device_page_shows_why_a_breach_cordoned_the_device(web_fleet: Fleet, watched: Watched) -> None:
    gamma = web_fleet.agent("gamma", ORRERY_AGENT_MAX_DESTRUCTIVE_PER_MINUTE="1")
    writes = [{"tool": "files.write", "arguments": {"path": f"g{i}.txt", "content": "x"}} for i in range(2)]
    task = web_fleet.submit({"nodes": [{"id": "n", "placement": {"device": "gamma"}, "commands": writes}]})
    assert web_fleet.wait_task(task["id"])["state"] == "failed"
    web_fleet.wait_device(gamma.device_id, "cordoned")

    page = sign_in(watched, web_fleet, hash_=f"#/devices/{gamma.device_id}")
    reason = page.wait_for_selector("#device-cordon-reason").inner_text()
    assert "safety budget destructive_per_minute (limit 1) exceeded" in reason, reason
    budgets = page.wait_for_selector("#device-policy").inner_text()
    assert "at most 1 destructive actions a minute" in budgets, budgets

    with web_fleet.server.client() as c:
        assert c.post(f"/v1/devices/{gamma.device_id}/uncordon").status_code == 200
    page.reload()
    page.wait_for_selector("#device-overview")
    page.wait_for_selector("#device-policy")
    assert page.query_selector("#device-cordon-reason") is None
