"""Schedules end to end (issue 20): a real server and a real agent run a schedule's tasks, one per
tick; bad schedules are refused with stable codes (never a 500); the CLI drives it all."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from orchestrator.app import create_app
from orchestrator.config import Settings
from orchestrator.domain.cron import Cron
from orchestrator.engine import schedules as engine_schedules
from tests.support import Fleet, free_port, run_cli, shell, wait_until

EVERY_2S = "*/2 * * * * *"  # a sixth field in front: seconds (every 2 s keeps the test short)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("schedules"), heartbeat_interval_s="1") as f:
        f.agent("cron-box", {"role": "cron"})
        yield f


def echo_task(line: str = "tick") -> dict[str, Any]:
    node = {
        "id": "stamp",
        "placement": {"labels": {"role": "cron"}},
        "commands": [shell(["sh", "-c", f"echo {line} >> ticks.txt"])],
    }
    return {"dag": {"nodes": [node], "edges": []}}


def post(fleet: Fleet, body: Any, key: str | None = None) -> Any:
    with fleet.server.client(key) as c:
        return c.post("/v1/schedules", json=body)


def get(fleet: Fleet, path: str, **params: Any) -> Any:
    with fleet.server.client() as c:
        r = c.get(path, params=params)
        assert r.status_code == 200, r.text
        return r.json()


def ticks(fleet: Fleet, schedule: str) -> list[dict[str, Any]]:
    """Every tick of the schedule, oldest first."""
    return list(reversed(get(fleet, f"/v1/schedules/{schedule}/ticks", limit=500)["items"]))


def made_by(fleet: Fleet, schedule_id: str) -> list[dict[str, Any]]:
    tasks = get(fleet, "/v1/tasks", limit=500)["items"]
    return [t for t in tasks if t["labels"].get("orrery.schedule") == schedule_id]


def test_a_schedule_runs_one_task_per_tick_on_a_real_agent(fleet: Fleet) -> None:
    r = post(fleet, {"name": "stamps", "cron": EVERY_2S, "task": echo_task()})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["warnings"] == [] and made["paused"] is False and len(made["next_runs"]) == 5
    assert made["description"] == "Every second second of every minute"  # cronsim's words for */2 seconds
    sid = made["id"]

    def three_done() -> list[dict[str, Any]]:
        done = [t for t in ticks(fleet, sid) if t["outcome"] == "created" and t["task_state"] == "succeeded"]
        return done if len(done) >= 3 else []

    wait_until(three_done, 60, "three ticks whose tasks succeeded")
    paused = fleet_post(fleet, f"/v1/schedules/{sid}/pause")
    assert paused["paused"] is True and paused["next_runs"] == []
    paused_at = time.time()
    recorded = ticks(fleet, sid)
    # Exactly one task per tick: every created tick names its own task, made for that tick.
    created = [t for t in recorded if t["outcome"] == "created"]
    tasks = {t["id"]: t for t in made_by(fleet, sid)}
    assert sorted(t["task_id"] for t in created) == sorted(tasks)
    tick_of_task = sorted(_epoch(tasks[t["task_id"]]["labels"]["orrery.tick"]) for t in created)
    assert tick_of_task == sorted(_epoch(t["at"]) for t in created)
    assert all(t["outcome"] in ("created", "skipped") for t in recorded), recorded
    # The agent ran each task once: one line per finished task.
    agent = fleet.agents[0]
    wait_until(lambda: all(t["state"] in ("succeeded", "failed") for t in made_by(fleet, sid)), 30, "every task ends")
    lines = (agent.workspace / "ticks.txt").read_text().split()
    assert len(lines) == len([t for t in made_by(fleet, sid) if t["state"] == "succeeded"])

    shown = get(fleet, f"/v1/schedules/{sid}")
    assert shown["last_run"]["task_id"] == created[-1]["task_id"]
    assert shown["last_run"]["local"].endswith("+00:00")
    # Paused across at least two ticks' time; resumed, it ticks again from the next future tick.
    wait_until(lambda: time.time() > paused_at + 4.5, 10, "two ticks' time to pass while paused")
    resumed = fleet_post(fleet, f"/v1/schedules/{sid}/resume")
    assert resumed["paused"] is False and resumed["next_runs"]
    resumed_at = time.time()
    wait_until(lambda: len(ticks(fleet, sid)) > len(recorded), 30, "a tick after the resume")
    later = ticks(fleet, sid)[len(recorded) :]
    assert all(_epoch(t["at"]) > resumed_at - 1 for t in later), (paused_at, resumed_at, later)

    with fleet.server.client() as c:
        gone = c.delete(f"/v1/schedules/{sid}")
        assert gone.status_code == 200 and gone.json() == {"id": sid, "name": "stamps", "deleted": True}
        assert c.get(f"/v1/schedules/{sid}").status_code == 404
        for task_id in tasks:  # the tasks it made stay
            assert c.get(f"/v1/tasks/{task_id}").status_code == 200


def fleet_post(fleet: Fleet, path: str) -> Any:
    with fleet.server.client() as c:
        r = c.post(path)
        assert r.status_code == 200, r.text
        return r.json()


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


# ---------------------------------------------------------------- refusals


def body(**fields: Any) -> dict[str, Any]:
    return {"name": "bad", "cron": "0 2 * * *", "task": echo_task(), **fields}


BAD = [
    (body(cron="61 * * * *"), "invalid_cron", "cron"),
    (body(cron="* * *"), "invalid_cron", "cron"),
    (body(cron="@reboot"), "invalid_cron", "cron"),
    (body(timezone="Europe/Pari"), "unknown_timezone", "timezone"),
    (body(timezone="../../../etc/passwd"), "unknown_timezone", "timezone"),
    (body(timezone="localtime"), "unknown_timezone", "timezone"),  # this machine's zone: replicas may differ
    (body(timezone="Factory"), "unknown_timezone", "timezone"),
    (body(cron="0 0 30 2 SUN#5"), "cron_too_rare", "cron"),  # a 5th Sunday of February: every 28 years
    (body(cron="0 0 */31 2 MON#5"), "invalid_cron", "cron"),  # a February 1st that is its 5th Monday: never
    (
        body(task={"dag": {"nodes": [{"id": "a", "commands": [shell(["ls"])]}], "edges": [{"from": "a", "to": "a"}]}}),
        "dag_cycle",
        None,
    ),
    (
        body(task={"dag": {"nodes": [{"id": "a", "commands": [shell(["ls"])]}], "edges": [{"from": "a", "to": "b"}]}}),
        "unknown_node",
        None,
    ),
    (body(task={"request": "count the 500s"}), "planner_unavailable", None),
    (body(task={"dag": {"nodes": [{"id": "a", "kind": "agent", "instruction": "tidy"}]}}), "planner_unavailable", None),
    (body(task={}), "validation_error", None),
    ({"cron": "0 2 * * *", "task": echo_task()}, "validation_error", None),
    (body(name="has space"), "validation_error", None),
    (body(cron="0 2 * * *\u0000"), "validation_error", None),
    (body(overlap="sometimes"), "validation_error", None),
    (body(max_queued=0), "validation_error", None),
    (body(starting_deadline_s=0), "validation_error", None),
    (body(surprise=True), "validation_error", None),
]


@pytest.mark.parametrize(("bad", "code", "field"), BAD)
def test_a_bad_schedule_is_refused_with_a_stable_code_and_nothing_is_made(
    fleet: Fleet, bad: dict[str, Any], code: str, field: str | None
) -> None:
    r = post(fleet, bad)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem = r.json()
    assert problem["code"] == code
    if field is not None:
        assert problem["problems"][0]["field"] == field
    assert "bad" not in [s["name"] for s in get(fleet, "/v1/schedules")["items"]]


def test_a_bad_cron_and_a_bad_zone_are_both_named(fleet: Fleet) -> None:
    problem = post(fleet, body(cron="99 * * * *", timezone="Mars/Olympus")).json()
    assert [(p["code"], p["field"]) for p in problem["problems"]] == [
        ("unknown_timezone", "timezone"),
        ("invalid_cron", "cron"),
    ]
    assert "give five fields" in problem["problems"][1]["message"]


def test_what_depends_on_todays_devices_is_a_warning_and_the_schedule_is_made(fleet: Fleet) -> None:
    unknown = {"dag": {"nodes": [{"id": "a", "commands": [{"tool": "backup.run"}]}]}}
    r = post(fleet, body(name="later-fleet", task=unknown, paused=True))
    assert r.status_code == 201, r.text
    assert [w["code"] for w in r.json()["warnings"]] == ["unknown_tool"]
    assert "checked against the devices enrolled now" in r.json()["warnings"][0]["message"]
    elsewhere = {"dag": {"nodes": [{"id": "a", "placement": {"labels": {"role": "gpu"}}, "commands": [shell(["ls"])]}]}}
    r = post(fleet, body(name="gpu-later", task=elsewhere, paused=True))
    assert r.status_code == 201 and [w["code"] for w in r.json()["warnings"]] == ["no_capable_device"]


def test_a_fan_out_task_with_verify_commands_is_a_valid_schedule(fleet: Fleet) -> None:
    """Found in the new-user pass: the structural check knew only the commands' tools, so a verify
    tool (files.read here) was refused as `unknown_tool` although every device has it."""
    task = {
        "dag": {
            "nodes": [
                {
                    "id": "deploy",
                    "for_each": {"labels": {"role": "cron"}},
                    "commands": [{"tool": "files.write", "arguments": {"path": "v.txt", "content": "v2"}}],
                    "verify": [{"tool": "files.read", "arguments": {"path": "v.txt"}}],
                }
            ]
        }
    }
    r = post(fleet, body(name="verified-rollout", task=task, paused=True))
    assert r.status_code == 201, r.text
    assert r.json()["warnings"] == []


def test_names_are_unique_and_lookups_answer_404_409_and_400(fleet: Fleet) -> None:
    first = post(fleet, body(name="twice", paused=True))
    assert first.status_code == 201
    assert post(fleet, body(name="twice-other", paused=True)).status_code == 201  # two ids start with sch_
    again = post(fleet, body(name="twice"))
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    assert again.json()["schedule_id"] == first.json()["id"]
    with fleet.server.client() as c:
        assert c.get("/v1/schedules/nothing-like-it").json()["code"] == "not_found"
        assert c.post("/v1/schedules/nothing-like-it/pause").status_code == 404
        assert c.delete("/v1/schedules/nothing-like-it").status_code == 404
        ambiguous = c.get("/v1/schedules/sch_")
        assert ambiguous.status_code == 409 and ambiguous.json()["code"] == "ambiguous_id"
        assert c.get("/v1/schedules/twice").json()["id"] == first.json()["id"]  # by name
        assert c.get(f"/v1/schedules/{first.json()['id'][:10]}").json()["name"] == "twice"  # by prefix
        bad_cursor = c.get("/v1/schedules/twice/ticks", params={"cursor": "!!"})
        assert bad_cursor.status_code == 400 and bad_cursor.json()["code"] == "bad_request"
        assert c.get("/v1/schedules", params={"cursor": "bm90LWEtbmFtZQ"}).status_code == 200
        bad_outcome = c.get("/v1/schedules/twice/ticks", params={"outcome": "exploded"})
        assert bad_outcome.status_code == 422 and bad_outcome.json()["code"] == "validation_error"
        assert c.get("/v1/schedules/%00").status_code == 404


def test_listings_page_with_their_cursors(fleet: Fleet) -> None:
    for name in ("page-a", "page-b", "page-c"):
        assert post(fleet, body(name=name, paused=True)).status_code == 201
    names: list[str] = []
    cursor = None
    while True:
        page = get(fleet, "/v1/schedules", limit=1, **({"cursor": cursor} if cursor else {}))
        names += [s["name"] for s in page["items"]]
        if not (cursor := page["next_cursor"]):
            break
    assert names == sorted(names) and {"page-a", "page-b", "page-c"} <= set(names)
    busy = post(fleet, {"name": "page-ticks", "cron": EVERY_2S, "task": echo_task("paged")}).json()
    wait_until(lambda: len(ticks(fleet, busy["id"])) >= 3, 60, "three ticks")
    fleet_post(fleet, f"/v1/schedules/{busy['id']}/pause")
    every = ticks(fleet, busy["id"])
    paged: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = get(fleet, f"/v1/schedules/{busy['id']}/ticks", limit=2, **({"cursor": cursor} if cursor else {}))
        paged += page["items"]
        if not (cursor := page["next_cursor"]):
            break
    assert list(reversed(paged)) == every
    created = get(fleet, f"/v1/schedules/{busy['id']}/ticks", outcome="created")["items"]
    assert created and all(t["outcome"] == "created" for t in created)


def test_a_viewer_may_look_but_not_change_schedules(fleet: Fleet) -> None:
    with fleet.server.client() as c:
        viewer = c.post("/v1/api-keys", json={"role": "viewer"}).json()["key"]
    assert post(fleet, body(name="by-viewer"), key=viewer).status_code == 403
    with fleet.server.client(viewer) as c:
        assert c.get("/v1/schedules").status_code == 200
        assert c.post("/v1/schedules/twice/pause").json()["code"] == "forbidden"


# ---------------------------------------------------------------- the CLI


def test_the_cli_creates_lists_shows_pauses_resumes_and_deletes_a_schedule(fleet: Fleet, tmp_path: Path) -> None:
    spec = tmp_path / "nightly.yaml"
    spec.write_text(
        "name: cli-nightly\n"
        "cron: '30 2 * * *'\n"
        "timezone: Europe/Paris\n"
        "overlap: queue\n"
        "task:\n"
        "  dag:\n"
        "    nodes:\n"
        "      - id: stamp\n"
        "        placement: {labels: {role: cron}}\n"
        "        commands: [{tool: shell.run, arguments: {argv: [echo, nightly]}}]\n"
    )
    made = run_cli(fleet, "schedules", "create", str(spec))
    assert made.returncode == 0, made.stdout + made.stderr
    assert made.stdout.startswith("schedule cli-nightly sch_") and "02:30:00+0" in made.stdout

    listed = json.loads(run_cli(fleet, "schedules", "list", "--json").stdout)
    mine = next(s for s in listed if s["name"] == "cli-nightly")
    assert mine["timezone"] == "Europe/Paris" and mine["overlap"] == "queue"
    table = run_cli(fleet, "schedules", "list").stdout
    assert "cli-nightly" in table and "30 2 * * * (Europe/Paris)" in table

    shown = run_cli(fleet, "schedules", "show", "cli-nightly")
    assert shown.returncode == 0, shown.stderr
    assert "At 02:30 every day" in shown.stdout and "next runs" in shown.stdout

    paused = run_cli(fleet, "schedules", "pause", "cli-nightly")
    assert paused.returncode == 0 and "paused" in paused.stdout
    assert json.loads(run_cli(fleet, "schedules", "show", "cli-nightly", "--json").stdout)["paused"] is True
    resumed = run_cli(fleet, "schedules", "resume", mine["id"][:10])
    assert resumed.returncode == 0 and "active, next run" in resumed.stdout
    assert json.loads(run_cli(fleet, "schedules", "ticks", "cli-nightly", "--json").stdout) == []

    dag = tmp_path / "dag.yaml"
    dag.write_text("nodes:\n  - id: a\n    commands: [{tool: shell.run, arguments: {argv: [true]}}]\n")
    flags = run_cli(fleet, "schedules", "create", str(dag), "--name", "cli-hourly", "--cron", "@hourly", "--json")
    assert flags.returncode == 0, flags.stderr
    assert json.loads(flags.stdout)["cron"] == "@hourly"

    deleted = run_cli(fleet, "schedules", "delete", "cli-nightly")
    assert deleted.returncode == 0 and "deleted (its tasks stay)" in deleted.stdout
    assert run_cli(fleet, "schedules", "delete", "cli-hourly").returncode == 0


def test_the_cli_says_what_is_wrong_in_one_line_and_exits_non_zero(fleet: Fleet, tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text("nodes:\n  - id: a\n    commands: [{tool: shell.run, arguments: {argv: [true]}}]\n")
    bad = run_cli(fleet, "schedules", "create", str(dag), "--name", "cli-bad", "--cron", "0 25 * * *")
    assert bad.returncode == 1 and "invalid_cron" in bad.stderr and "hour field is not valid" in bad.stderr
    assert "Traceback" not in bad.stderr
    missing = run_cli(fleet, "schedules", "create", str(dag))
    assert missing.returncode == 2 and "needs name and cron" in missing.stderr
    unknown = run_cli(fleet, "schedules", "show", "no-such-schedule")
    assert unknown.returncode == 1 and "not_found" in unknown.stderr


# ---------------------------------------------------------------- cron arithmetic off the event loop


@contextlib.contextmanager
def in_process(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real server (uvicorn on loopback) in a thread of this process, so a test can hold its cron
    arithmetic on an event; yields its URL and admin key."""
    settings = Settings(data_dir=tmp_path / "data", heartbeat_interval_s=30)
    settings.data_dir.mkdir()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, name="in-process-server")
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 60, "the server to start")
        assert server.started, "the server stopped while starting"
        yield f"http://127.0.0.1:{port}", (settings.data_dir / "admin.key").read_text().strip()
    finally:
        server.should_exit = True
        thread.join(30)


class Held:
    """A computation held on an event: `entered` once it runs, `ended` once it returned. The hold
    is bounded (a loop it blocks must not stay blocked if the test fails)."""

    def __init__(self) -> None:
        self.entered, self.release, self.ended = threading.Event(), threading.Event(), threading.Event()

    def hold(self) -> None:
        self.entered.set()
        self.release.wait(8)
        self.ended.set()


def test_next_runs_are_computed_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one request's next runs are being computed (held here), the same server answers others."""
    held = Held()
    upcoming = Cron.upcoming

    def slow_upcoming(self: Cron, instant: float, count: int) -> list[float]:
        if self.expression == "0 3 * * *":
            held.hold()
        return upcoming(self, instant, count)

    with in_process(tmp_path) as (url, key):
        auth = {"Authorization": f"Bearer {key}"}
        made = httpx.post(f"{url}/v1/schedules", json=body(name="held", cron="0 3 * * *"), headers=auth, timeout=30)
        assert made.status_code == 201, made.text
        monkeypatch.setattr(Cron, "upcoming", slow_upcoming)
        shown: list[httpx.Response] = []
        viewer = threading.Thread(
            target=lambda: shown.append(httpx.get(f"{url}/v1/schedules/held?next=50", headers=auth, timeout=30))
        )
        viewer.start()
        try:
            assert held.entered.wait(30), "the next runs were never computed"
            devices = httpx.get(f"{url}/v1/devices", headers=auth, timeout=30)
            answered_while_held = not held.ended.is_set()
            assert devices.status_code == 200, devices.text
            assert answered_while_held, "GET /v1/devices waited for another request's cron arithmetic"
        finally:
            held.release.set()
            viewer.join(30)
        assert shown[0].status_code == 200 and len(shown[0].json()["next_runs"]) == 50


def test_the_engines_schedule_tick_runs_its_cron_arithmetic_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine leader shares its loop with the API: a tick being reckoned (held here) leaves it free."""
    held = Held()
    reckon = engine_schedules.backlog

    def slow_backlog(cron: Cron, first: float, now: float, deadline_s: float) -> Any:
        if cron.expression == "* * * * * *":
            held.hold()
        return reckon(cron, first, now, deadline_s)

    monkeypatch.setattr(engine_schedules, "backlog", slow_backlog)
    with in_process(tmp_path) as (url, key):
        auth = {"Authorization": f"Bearer {key}"}
        made = httpx.post(f"{url}/v1/schedules", json=body(name="every-second", cron="* * * * * *"), headers=auth)
        assert made.status_code == 201, made.text
        try:
            assert held.entered.wait(30), "the schedule never ticked"
            devices = httpx.get(f"{url}/v1/devices", headers=auth, timeout=30)
            answered_while_held = not held.ended.is_set()
            assert devices.status_code == 200, devices.text
            assert answered_while_held, "GET /v1/devices waited for the engine's cron arithmetic"
        finally:
            held.release.set()
        wait_until(held.ended.is_set, 30, "the held tick to end")
        ticks = httpx.get(f"{url}/v1/schedules/every-second/ticks", headers=auth, timeout=30)
        assert ticks.status_code == 200
        deleted = httpx.delete(f"{url}/v1/schedules/every-second", headers=auth, timeout=30)
        assert deleted.status_code == 200, deleted.text
