"""The schedules pages (#/schedules, #/schedules/<id>; issue 20) in a real browser against a real
server and agents: the list with next runs and the last run's task linked, Pause and Resume for an
operator and none for a viewer, and a schedule's ticks with what happened at each."""

from __future__ import annotations

from typing import Any

from tests.support import Fleet, shell, wait_until
from tests.web.conftest import Watched, shot
from tests.web.test_dashboard import api_key, sign_in


def create(fleet: Fleet, name: str, cron: str, **fields: Any) -> dict[str, Any]:
    node = {"id": "stamp", "placement": {"labels": {"role": "producer"}}, "commands": [shell(["echo", name])]}
    body = {"name": name, "cron": cron, "task": {"dag": {"nodes": [node]}}, **fields}
    with fleet.server.client() as c:
        r = c.post("/v1/schedules", json=body)
        assert r.status_code == 201, r.text
        made: dict[str, Any] = r.json()
        return made


def ticks(fleet: Fleet, schedule_id: str) -> list[dict[str, Any]]:
    with fleet.server.client() as c:
        items: list[dict[str, Any]] = c.get(f"/v1/schedules/{schedule_id}/ticks").json()["items"]
        return items


def row(schedule_id: str, paused: bool | None = None) -> str:
    state = "" if paused is None else f"[data-paused={str(paused).lower()}]"
    return f"#schedules-table tr[data-schedule-id='{schedule_id}']{state}"


def test_the_list_shows_next_runs_and_the_last_runs_task_and_an_operator_pauses_and_resumes(
    web_fleet: Fleet, watched: Watched
) -> None:
    busy = create(web_fleet, "web-every-3s", "*/3 * * * * *")
    nightly = create(web_fleet, "web-nightly", "30 1 * * *", timezone="America/New_York", overlap="queue")
    done = wait_until(lambda: [t for t in ticks(web_fleet, busy["id"]) if t["task_state"] == "succeeded"], 60, "a run")
    page = sign_in(watched, web_fleet, hash_="#/schedules")
    assert page.get_attribute("a.nav-link[data-nav=schedules]", "aria-current") == "page"

    line = page.wait_for_selector(row(nightly["id"], paused=False))
    text = line.inner_text()
    assert "At 01:30 every day" in text and "30 1 * * * · America/New_York" in text and "queue (≤ 5)" in text
    first_next = line.query_selector(".next-runs time")
    assert first_next.get_attribute("datetime") == nightly["next_runs"][0]  # in its own zone, with its offset
    assert "never" in line.query_selector(".last-run").inner_text()

    busy_row = page.wait_for_selector(f"{row(busy['id'])} .last-run a.tick-task")
    assert busy_row.get_attribute("href").startswith("#/tasks/task_")
    assert len(page.query_selector_all(f"{row(busy['id'])} .next-runs li")) == 3
    shot(page, "schedules", "dashboard-schedules.png")

    page.click(f"{row(nightly['id'])} button[data-action=pause]")
    page.wait_for_selector(f"{row(nightly['id'], paused=True)} .pill:text-is('paused')")
    with web_fleet.server.client() as c:
        assert c.get(f"/v1/schedules/{nightly['id']}").json()["paused"] is True
    assert "None while paused" in page.inner_text(f"{row(nightly['id'])} .next-runs")
    page.click(f"{row(nightly['id'])} button[data-action=resume]")
    page.wait_for_selector(f"{row(nightly['id'], paused=False)} .pill:text-is('active')")

    # The last run's task link opens the task page.
    page.click(f"{row(busy['id'])} .last-run a.tick-task")
    page.wait_for_selector("#view[data-view=task]")
    assert done  # at least one of its tasks succeeded before the page was opened


def test_a_schedule_page_lists_its_ticks_with_their_tasks_and_deletes_it(web_fleet: Fleet, watched: Watched) -> None:
    made = create(web_fleet, "web-page", "*/2 * * * * *", overlap="skip")
    wait_until(lambda: len([t for t in ticks(web_fleet, made["id"]) if t["task_id"]]) >= 2, 60, "two ticks with tasks")
    page = sign_in(watched, web_fleet, hash_=f"#/schedules/{made['name']}")  # by name, as the API takes it
    page.wait_for_selector("#schedule-state .pill:text-is('active')")
    assert "Every second second of every minute" in page.inner_text("#schedule-description")
    assert len(page.query_selector_all("#schedule-next-runs li")) == 10
    created = page.wait_for_selector("#ticks-table tr[data-outcome=created] a.tick-task")
    assert created.get_attribute("href").startswith("#/tasks/task_")
    page.wait_for_selector("#schedule-last-run a.tick-task")
    shot(page, "schedule")

    page.click("#delete-schedule")
    page.click("#delete-schedule")  # the second click confirms
    page.wait_for_selector("#view[data-view=schedules]")
    with web_fleet.server.client() as c:
        assert c.get(f"/v1/schedules/{made['id']}").status_code == 404
        assert c.get(f"/v1/tasks/{ticks_task(created)}").status_code == 200  # its tasks stay


def ticks_task(link: Any) -> str:
    return str(link.get_attribute("data-task-id"))


def test_a_viewer_sees_schedules_without_buttons(web_fleet: Fleet, watched: Watched) -> None:
    made = create(web_fleet, "web-viewer", "0 3 * * *", paused=True)
    viewer = api_key(web_fleet, "viewer")
    page = sign_in(watched, web_fleet, key=viewer["key"], hash_="#/schedules")
    page.wait_for_selector("#schedules-table[data-role=viewer]")  # drawn knowing the role
    assert page.query_selector(f"{row(made['id'], paused=True)} button") is None
    page.click(f"{row(made['id'])} a.schedule-link")
    page.wait_for_selector("#schedule-state[data-role=viewer] .pill:text-is('paused')")
    assert page.query_selector("#delete-schedule") is None
    assert page.query_selector("button[data-action]") is None
