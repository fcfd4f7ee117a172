"""Rough edges a new user hit in the CLI and at `orrery serve`: approval ids by prefix (CLI and
REST) with device names in the listing, a second server on the same data dir or port refused at
once, and small messages. Every command runs as a real subprocess against a real server (and,
for approvals, a real agent)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.test_approvals import APPROVE_WRITES, one_node, pending, write
from tests.support import ROOT, TLS, Fleet, Server, child_env, free_port, run_cli, shell, wait_until


def short_error(result: subprocess.CompletedProcess[str], *needles: str, most: int = 2) -> str:
    """Non-zero exit, at most `most` lines on stderr and no traceback; each needle in them."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert 1 <= len(result.stderr.strip().splitlines()) <= most, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr
    return result.stderr


# ---------------------------------------------------------------- approvals by id prefix


@pytest.fixture(scope="module")
def approvals_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("rough-approvals")) as f:
        f.agent("desk", **APPROVE_WRITES)
        f.agent("shelf", **APPROVE_WRITES)  # a second device: two approvals wait at once
        yield f


def test_an_approval_is_found_by_a_unique_prefix_in_rest_and_cli(approvals_fleet: Fleet) -> None:
    fleet = approvals_fleet
    first = fleet.submit(one_node("desk", write("prefix-a.txt")))
    a = pending(fleet, first["id"])
    second = fleet.submit(one_node("shelf", write("prefix-b.txt")))
    b = pending(fleet, second["id"])
    same = next(i for i, (x, y) in enumerate(zip(a["id"], b["id"], strict=True)) if x != y)
    prefix_a = a["id"][: max(same + 1, 8)]  # unique, and shorter than the id
    assert prefix_a != a["id"] and not b["id"].startswith(prefix_a)
    with fleet.server.client() as c:
        got = c.get(f"/v1/approvals/{prefix_a}")
        assert got.status_code == 200, got.text
        assert got.json()["id"] == a["id"]
        bare = c.get(f"/v1/approvals/{prefix_a.removeprefix('apr_')}")  # users leave `apr_` out
        assert bare.status_code == 200 and bare.json()["id"] == a["id"], bare.text
        both = c.get("/v1/approvals/apr_")  # 4 characters: matches every approval
        assert both.status_code == 409 and both.json()["code"] == "ambiguous_id", both.text
        assert {a["id"], b["id"]} <= {x["id"] for x in both.json()["candidates"]}
        unknown = c.post("/v1/approvals/apr_zzzzzz/approve")  # never hex
        assert unknown.status_code == 404 and unknown.json()["code"] == "not_found", unknown.text
        assert "orrery approvals list" in unknown.json()["detail"], unknown.text

    ok = run_cli(fleet, "approvals", "approve", prefix_a, "--reason", "by prefix")
    assert ok.returncode == 0, ok.stderr
    assert a["id"] in ok.stdout and "approved" in ok.stdout
    assert fleet.wait_task(first["id"])["state"] == "succeeded"

    many = run_cli(fleet, "approvals", "deny", "apr_")
    short_error(many, "ambiguous_id", b["id"], most=12)  # the problem, then one line per candidate
    none = run_cli(fleet, "approvals", "deny", "apr_zzzzzz")
    short_error(none, "not_found", "orrery approvals list")
    assert "/v1/approvals" not in none.stderr

    with fleet.server.client() as c:
        c.post(f"/v1/approvals/{b['id']}/deny")
    assert fleet.wait_task(second["id"])["state"] == "failed"


def test_the_approvals_listing_names_the_device(approvals_fleet: Fleet) -> None:
    fleet = approvals_fleet
    device_id = fleet.agents[0].device_id
    task = fleet.submit(one_node("desk", write("named.txt")))
    approval = pending(fleet, task["id"])
    shown = run_cli(fleet, "approvals", "list")
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if f"task {task['id']}" in x)
    assert f"device desk ({device_id})" in line, shown.stdout
    with fleet.server.client() as c:
        c.post(f"/v1/approvals/{approval['id']}/deny")
    fleet.wait_task(task["id"])


# ---------------------------------------------------------------- a second `orrery serve`


def serve(data_dir: Path, port: int, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(port), "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def test_a_second_server_on_the_same_data_dir_refuses_at_once(tmp_path: Path) -> None:
    first = Server(tmp_path / "data", free_port(), child_env()).start()
    try:
        assert first.proc is not None
        other_port = free_port()
        second = serve(first.data_dir, other_port, timeout=30)
        err = short_error(second, f"another orrery serve is using {first.data_dir}", f"(pid {first.proc.pid})")
        assert len(err.strip().splitlines()) == 1, err
        with pytest.raises(httpx.HTTPError):  # it never listened
            httpx.get(f"http://127.0.0.1:{other_port}/readyz", timeout=1, verify=TLS)
        assert httpx.get(f"{first.url}/readyz", timeout=5).status_code == 200  # the first is untouched
    finally:
        first.kill()
    # the lock dies with its process, however it ends: a new server starts on the same store
    again = Server(first.data_dir, free_port(), child_env()).start()
    again.stop()


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    first = Server(tmp_path / "one", free_port(), child_env()).start()
    try:
        second = serve(tmp_path / "two", first.port, timeout=30)
        err = short_error(second, f"port {first.port} is in use", "pass --port")
        assert len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "two" / "orrery.db").exists()  # no store made, no engine run
    finally:
        first.stop()


# ---------------------------------------------------------------- small ones


def test_schedules_create_names_every_missing_option(tmp_path: Path) -> None:
    dag = tmp_path / "dag.yaml"
    dag.write_text("nodes:\n  - id: a\n    commands: []\nedges: []\n")
    result = run_cli(None, "schedules", "create", str(dag))
    short_error(result, "--name and --cron")
    only_cron = run_cli(None, "schedules", "create", str(dag), "--name", "nightly")
    err = short_error(only_cron, "--cron")
    assert "--name" not in err


def test_submitting_a_schedule_file_points_at_schedules_create(tmp_path: Path) -> None:
    sched = tmp_path / "nightly.yaml"
    sched.write_text("name: nightly\ncron: '0 2 * * *'\ntask:\n  request: tidy up\n")
    result = run_cli(None, "submit", str(sched), ORRERY_URL=f"http://127.0.0.1:{free_port()}", ORRERY_API_KEY="x")
    short_error(result, f"orrery schedules create {sched}")
    assert result.returncode == 2


def test_a_bad_device_name_says_which_characters_are_allowed(shared_fleet: Fleet) -> None:
    result = run_cli(shared_fleet, "devices", "enroll", "bad name!")
    err = short_error(result, "letters, digits", "'bad name!'")
    assert "^[" not in err and "pattern" not in err
    with shared_fleet.server.client() as c:
        assert all(d["name"] != "bad name!" for d in c.get("/v1/devices").json()["items"])


def test_server_takes_a_bare_host_and_port_as_the_agent_does(shared_fleet: Fleet) -> None:
    bare = f"127.0.0.1:{shared_fleet.server.port}"
    result = run_cli(None, "tasks", "list", "--json", "--server", bare, ORRERY_API_KEY=shared_fleet.server.api_key)
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)
    env_form = run_cli(None, "devices", "list", "--json", ORRERY_URL=bare, ORRERY_API_KEY=shared_fleet.server.api_key)
    assert env_form.returncode == 0, env_form.stderr


def test_api_keys_list_shows_keys_without_their_secret(shared_fleet: Fleet) -> None:
    made = run_cli(shared_fleet, "api-keys", "create", "--role", "viewer", "--name", "wall display", "--json")
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)
    listed = run_cli(shared_fleet, "api-keys", "list")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if key["id"] in x)
    assert "viewer" in line and "wall display" in line
    assert key["key"] not in listed.stdout
    as_json = json.loads(run_cli(shared_fleet, "api-keys", "list", "--json").stdout)
    assert any(k["id"] == key["id"] and k["role"] == "viewer" for k in as_json)
    assert all("key" not in k and "key_hash" not in k for k in as_json)

    with httpx.Client(base_url=shared_fleet.server.url, headers={"Authorization": f"Bearer {key['key']}"}) as v:
        refused = v.get("/v1/api-keys")
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden", refused.text

    assert run_cli(shared_fleet, "api-keys", "revoke", key["id"]).returncode == 0
    after = run_cli(shared_fleet, "api-keys", "list").stdout
    assert key["id"] not in after
    with_revoked = run_cli(shared_fleet, "api-keys", "list", "--revoked").stdout
    assert re.search(rf"{key['id']}.*revoked", with_revoked), with_revoked


def test_the_sign_in_placeholder_shows_the_key_prefix(shared_fleet: Fleet) -> None:
    from tests.web.conftest import CHROMIUM_ARGS, _chromium

    pytest.importorskip("playwright")
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    assert executable, "a Chromium is needed (ORRERY_CHROMIUM)"
    prefix = shared_fleet.server.api_key.split("_", 1)[0] + "_"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{shared_fleet.server.url}/")
            placeholder = page.wait_for_selector("#api-key").get_attribute("placeholder")
        finally:
            browser.close()
    assert placeholder is not None and placeholder.startswith(prefix), (placeholder, prefix)


def test_the_lock_is_for_a_sqlite_store_only(tmp_path: Path) -> None:
    from orchestrator.config import Settings
    from orchestrator.server import store_lock_path

    assert store_lock_path(Settings(data_dir=tmp_path)) == tmp_path / "serve.lock"
    pg = Settings(data_dir=tmp_path, database_url="postgresql+asyncpg://u:p@127.0.0.1:5432/orrery")
    assert store_lock_path(pg) is None  # replicas share a Postgres store by design
    own = Settings(data_dir=tmp_path, database_url=f"sqlite+aiosqlite:///{tmp_path / 'x' / 'fleet.db'}")
    assert store_lock_path(own) == tmp_path / "x" / "fleet.db.lock"


# ---------------------------------------------------------------- what a new user met next


def test_the_enroll_hint_and_the_token_stay_whole_at_80_columns(shared_fleet: Fleet) -> None:
    made = run_cli(shared_fleet, "devices", "enroll", "edge-eighty", columns=80)
    assert made.returncode == 0, made.stderr
    shown = made.stdout.splitlines()
    command = f"orrery agent --server {shared_fleet.server.url} --token <token>"
    assert any(line.strip() == command for line in shown), made.stdout  # on a line of its own, to copy
    device_id = re.search(r"device id: (dev_\w+)", made.stdout)
    assert device_id, made.stdout
    assert any(re.fullmatch(rf"token: +orrd_{device_id[1]}\.\S{{20,}}", line) for line in shown), made.stdout
    rotated = run_cli(shared_fleet, "devices", "rotate-token", device_id[1], columns=80)
    assert rotated.returncode == 0, rotated.stderr
    assert re.search(rf"^token: +orrd_{device_id[1]}\.\S{{20,}}$", rotated.stdout, re.M), rotated.stdout


def test_submit_watch_never_says_running_on_nobody(shared_fleet: Fleet, tmp_path: Path) -> None:
    """A fan-out node runs on its children, not on one device: its line names none."""
    agent = shared_fleet.agent("edge-watch", {"edge": "watch"})
    gate = agent.workspace / "go"
    dag = tmp_path / "fan.yaml"
    dag.write_text(
        "nodes:\n"
        "  - id: spread\n"
        "    for_each: {labels: {edge: watch}}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [sh, -c, 'while [ ! -f go ]; do sleep 0.05; done']}}]\n"
        "  - id: after\n"
        "    placement: {device: edge-watch}\n"
        "    commands: [{tool: shell.run, arguments: {argv: [echo, done]}}]\n"
        "edges: [{from: spread, to: after}]\n"
    )
    out = tmp_path / "watch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orrery", "submit", str(dag), "--watch"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=child_env(
                COLUMNS="160", ORRERY_URL=shared_fleet.server.url, ORRERY_API_KEY=shared_fleet.server.api_key
            ),
        )
    try:
        wait_until(lambda: "spread on edge-watch running" in out.read_text(), 60, "the child to run")
        gate.write_text("")
        assert proc.wait(60) == 0, out.read_text()
    finally:
        gate.write_text("")
        if proc.poll() is None:
            proc.kill()
            proc.wait(15)
    text = out.read_text()
    assert re.search(r"◐ spread running$", text, re.M), text
    assert re.search(r"◐ after running on edge-watch$", text, re.M), text
    assert not re.search(r" on\s*$", text, re.M), text  # no line ends in an empty "on"


def test_the_agent_logs_an_operators_stop_once(shared_fleet: Fleet) -> None:
    agent = shared_fleet.agent("edge-stop")
    gate = agent.workspace / "go"
    hold = shell(["sh", "-c", "while [ ! -f go ]; do sleep 0.05; done"])
    task = shared_fleet.submit({"nodes": [{"id": "held", "placement": {"device": "edge-stop"}, "commands": [hold]}]})
    try:
        shared_fleet.wait_device(agent.device_id, "busy")
        with shared_fleet.server.client() as c:
            r = c.post(f"/v1/devices/{agent.device_id}/stop", json={"reason": "maintenance window"})
            assert r.status_code == 200, r.text
        ended = shared_fleet.wait_task(task["id"])
        error = shared_fleet.node(ended, "held")["error"]["message"]
        assert error.count("operator") == 1 and "maintenance window" in error, error
        wait_until(lambda: "device stopped by an operator" in agent.log(), 30, "the agent to apply the stop")
        stopped = [line for line in agent.log().splitlines() if "stopped by an operator" in line]
        assert len(stopped) == 1, stopped
        assert stopped[0].count("stopped by an operator") == 1 and "maintenance window" in stopped[0], stopped

        agent.stop()  # a restart while stopped says so once too
        agent.start()
        wait_until(lambda: "this device is stopped" in agent.log(), 30, "the restarted agent to say it is stopped")
        again = [line for line in agent.log().splitlines() if "this device is stopped" in line]
        assert len(again) == 1 and again[0].count("stopped by an operator") == 1, again
    finally:
        gate.write_text("")
        with shared_fleet.server.client() as c:
            c.post(f"/v1/devices/{agent.device_id}/resume")


def empty_columns(table: str) -> list[str]:
    """The headers of a rich box table in `table` that have nothing under them in any row."""
    header = next((line for line in table.splitlines() if line.startswith("┃")), None)
    if header is None:
        return []
    names = [cell.strip() for cell in header.strip("┃").split("┃")]
    rows = [line.strip("│").split("│") for line in table.splitlines() if line.startswith("│")]
    return [name for i, name in enumerate(names) if not any(len(r) > i and r[i].strip() for r in rows)]


def test_schedules_show_has_no_empty_column(shared_fleet: Fleet, tmp_path: Path) -> None:
    shared_fleet.agent("edge-cron")
    dag = tmp_path / "dag.yaml"
    dag.write_text("nodes:\n  - id: a\n    placement: {device: edge-cron}\n    commands: [{tool: system.info}]\n")
    made = run_cli(shared_fleet, "schedules", "create", str(dag), "--name", "edge-soon", "--cron", "*/2 * * * * *")
    assert made.returncode == 0, made.stderr
    try:
        with shared_fleet.server.client() as c:

            def a_tick() -> bool:
                items = c.get("/v1/schedules/edge-soon/ticks").json()["items"]
                return any(t["outcome"] == "created" for t in items)

            wait_until(a_tick, 30, "a tick")
        assert run_cli(shared_fleet, "schedules", "pause", "edge-soon").returncode == 0
        shown = run_cli(shared_fleet, "schedules", "show", "edge-soon")
        assert shown.returncode == 0, shown.stderr
        assert "┃ tick" in shown.stdout and "created" in shown.stdout, shown.stdout
        assert empty_columns(shown.stdout) == [], shown.stdout
        ticks = run_cli(shared_fleet, "schedules", "ticks", "edge-soon")
        assert ticks.returncode == 0 and "created" in ticks.stdout, ticks.stdout
        assert empty_columns(ticks.stdout) == [], ticks.stdout
    finally:
        run_cli(shared_fleet, "schedules", "delete", "edge-soon")

    later = run_cli(shared_fleet, "schedules", "create", str(dag), "--name", "edge-later", "--cron", "0 2 * * *")
    assert later.returncode == 0, later.stderr
    try:
        none = run_cli(shared_fleet, "schedules", "show", "edge-later")
        assert none.returncode == 0, none.stderr
        assert "┃" not in none.stdout and re.search(r"^ticks +none yet$", none.stdout, re.M), none.stdout
        empty = run_cli(shared_fleet, "schedules", "ticks", "edge-later")
        assert empty.returncode == 0 and empty.stdout.strip() == "no ticks yet", empty.stdout
    finally:
        run_cli(shared_fleet, "schedules", "delete", "edge-later")


def agent_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`orrery agent ARGS` typed in `cwd`, to its end (a refused one ends within seconds)."""
    return subprocess.run(
        [sys.executable, "-m", "orrery", "agent", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=child_env(PYTHONPATH=str(ROOT)),
        timeout=90,
        check=False,
    )


def test_a_refused_agent_leaves_no_data_dir_but_keeps_one_that_held_a_ledger(
    shared_fleet: Fleet, tmp_path: Path
) -> None:
    url = shared_fleet.server.url
    real = shared_fleet.enroll("edge-refused")
    wrong = agent_cli(tmp_path, "--server", url, "--token", real["token"][:-4] + "oops")
    assert wrong.returncode == 3, wrong.stderr
    assert "refused this device's token" in wrong.stdout + wrong.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))  # no ./.orrery-agent/<id>/ left

    given = tmp_path / "given" / "data"  # --data-dir: created for this run, taken back as well
    bogus = agent_cli(tmp_path, "--server", url, "--token", "orrd_dev_0000000000000000000a.x", "--data-dir", str(given))
    assert bogus.returncode == 3, bogus.stderr
    assert not (tmp_path / "given").exists(), list(tmp_path.rglob("*"))

    # A data dir that held a ledger (this device ran) is kept when its token is refused later.
    agent = shared_fleet.agent("edge-revoked")
    agent.stop()
    ledger = agent.data_dir / "ledger.sqlite3"
    assert ledger.exists()
    with shared_fleet.server.client() as c:
        assert c.delete(f"/v1/devices/{agent.device_id}").status_code == 200
    revoked = agent_cli(tmp_path, "--server", url, "--token", agent.token, "--data-dir", str(agent.data_dir))
    assert revoked.returncode == 3, revoked.stderr
    assert ledger.exists() and (agent.data_dir / "workspace").is_dir()


def test_submit_places_a_misspelt_key_at_its_line_and_column_as_validate_does(
    shared_fleet: Fleet, tmp_path: Path
) -> None:
    dag = tmp_path / "typo.yaml"
    dag.write_text(
        "nodes:\n"
        "  - id: a\n"
        "    placment: {device: nowhere}\n"
        "    comands: [{tool: system.echo, arguments: {text: hi}}]\n"
    )
    refused = run_cli(shared_fleet, "submit", str(dag))
    err = short_error(refused, f"{dag}:3:5: ", "'placment'; did you mean 'placement'?", most=2)
    assert f"{dag}:4:5: " in err and "did you mean 'commands'?" in err, err
    checked = run_cli(shared_fleet, "validate", str(dag))
    assert f"{dag}:3:5: " in checked.stdout + checked.stderr  # the same places as validate's


def test_rest_answers_a_bad_name_with_the_characters_it_may_hold(shared_fleet: Fleet) -> None:
    with shared_fleet.server.client() as c:
        bad = c.post("/v1/devices", json={"name": "bad name!"})
        assert bad.status_code == 422 and bad.json()["code"] == "validation_error", bad.text
        detail = bad.json()["detail"]
        assert detail.startswith("body.name: may hold only letters, digits, '_', '.' and '-'"), detail
        assert "'bad name!'" in detail and "^[" not in bad.text and "pattern" not in bad.text, bad.text
        key = c.post("/v1/devices", json={"name": "edge-labelled", "labels": {"bad key!": "x"}})
        assert key.status_code == 422, key.text
        assert "'/'" in key.json()["detail"] and "^[" not in key.text, key.text
