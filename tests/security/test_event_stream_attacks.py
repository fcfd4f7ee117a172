"""Attacks on the task event stream (issue 14, items 3 and 7), against real servers and agents.

- A cursor (`?after=` or `Last-Event-ID`) at or above 2^63 cut the body mid-stream and logged an
  `OverflowError`; a cursor that is not an event id was silently read as 0. Both are now a 400
  problem before any streaming starts.
- A cursor at or past the last event of a finished task streamed keep-alives for ever; now 204
  (nothing can follow), and a running task's stream with such a cursor ends when the task does.
- A revoked API key kept its open streams; now each stream re-checks its key in the store and
  ends with an `error` event (`code: key_revoked`) within seconds, on every replica.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.api.tasks import KEY_CHECK_S, SSE_POLL_S
from tests.cluster.replicaset import ReplicaSet
from tests.support import ROOT, Fleet, Server, child_env, shell, wait_until

# A revoked key's stream must be gone within this long of the revocation (one key check
# interval, one poll, and slack for a loaded 2-core machine).
CLOSE_WITHIN_S = KEY_CHECK_S + SSE_POLL_S + 4.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("streams")) as f:
        f.agent("stream-agent")
        yield f


@pytest.fixture(scope="module")
def finished(fleet: Fleet) -> tuple[str, int]:
    """A task that has ended, and the id of its last event."""
    task = fleet.submit({"nodes": [{"id": "a", "commands": [shell(["true"])]}]})
    assert fleet.wait_task(task["id"])["state"] == "succeeded"
    with fleet.server.client() as c:
        r = c.get(f"/v1/tasks/{task['id']}/events", timeout=30)
    assert r.status_code == 200
    ids = [int(line[3:]) for line in r.text.splitlines() if line.startswith("id:")]
    return task["id"], ids[-1]


def new_key(server: Server, role: str = "viewer") -> tuple[str, str]:
    with server.client() as c:
        r = c.post("/v1/api-keys", json={"role": role, "name": f"stream {role}"})
        assert r.status_code == 201, r.text
        return r.json()["id"], r.json()["key"]


def chain(n: int, seconds: float) -> dict[str, Any]:
    """`n` nodes one after the other, each sleeping `seconds`: events keep coming for a while."""
    nodes = [{"id": f"n{i}", "commands": [shell(["sleep", str(seconds)])]} for i in range(n)]
    edges = [{"from": f"n{i}", "to": f"n{i + 1}"} for i in range(n - 1)]
    return {"nodes": nodes, "edges": edges}


@dataclass
class Reader:
    """Follows one event stream in a thread, recording each frame with the time it arrived."""

    url: str
    key: str
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    frames: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    ended_at: float | None = None
    error: BaseException | None = None
    opened: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Reader:
        threading.Thread(target=self._run, daemon=True).start()
        assert self.opened.wait(30), "the stream did not answer"
        return self

    def _run(self) -> None:
        try:
            headers = {"Authorization": f"Bearer {self.key}", **self.headers}
            with httpx.stream("GET", self.url, headers=headers, timeout=httpx.Timeout(120, connect=10)) as resp:
                self.status = resp.status_code
                self.opened.set()
                kind, data = "", ""
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        kind = line[6:].strip()
                    elif line.startswith("data:"):
                        data = line[5:].strip()
                    elif line == "" and kind:
                        self.frames.append((time.monotonic(), kind, json.loads(data)))
                        kind, data = "", ""
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.opened.set()
            self.done.set()


def problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["code"] == code


TOO_BIG = [2**63, 2**63 + 1, 2**64, 10**30, int("9" * 40)]


@pytest.mark.parametrize("value", TOO_BIG, ids=["2^63", "2^63+1", "2^64", "10^30", "40-nines"])
@pytest.mark.parametrize("how", ["after", "last-event-id"])
def test_a_cursor_past_the_largest_event_id_is_a_400_problem_not_a_cut_stream(
    fleet: Fleet, finished: tuple[str, int], how: str, value: int
) -> None:
    task_id, _ = finished
    with fleet.server.client() as c:
        if how == "after":
            r = c.get(f"/v1/tasks/{task_id}/events", params={"after": value}, timeout=10)
        else:
            r = c.get(f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": str(value)}, timeout=10)
    problem(r, 400, "bad_request")
    assert str(2**63 - 1) in r.json()["detail"]
    log = fleet.server.log()
    assert "OverflowError" not in log and "Traceback" not in log


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "1_000", "0x10", "12 13", "9" * 60])
def test_a_last_event_id_that_is_not_an_event_id_is_a_400_problem(
    fleet: Fleet, finished: tuple[str, int], value: str
) -> None:
    """It used to be read as 0, replaying the whole task to a client that asked to resume."""
    task_id, _ = finished
    with fleet.server.client() as c:
        r = c.get(f"/v1/tasks/{task_id}/events", headers={"Last-Event-ID": value}, timeout=10)
    problem(r, 400, "bad_request")
    assert "Last-Event-ID" in r.json()["detail"]


def test_the_largest_event_id_is_still_a_cursor(fleet: Fleet, finished: tuple[str, int]) -> None:
    task_id, _ = finished
    with fleet.server.client() as c:
        for kw in ({"params": {"after": 2**63 - 1}}, {"headers": {"Last-Event-ID": str(2**63 - 1)}}):
            r = c.get(f"/v1/tasks/{task_id}/events", timeout=10, **kw)  # type: ignore[arg-type]
            assert r.status_code == 204, r.text


@pytest.mark.parametrize("past", [0, 1, 10**12])
@pytest.mark.parametrize("how", ["after", "last-event-id"])
def test_a_cursor_at_or_past_the_end_of_a_finished_task_ends_at_once(
    fleet: Fleet, finished: tuple[str, int], how: str, past: int
) -> None:
    """It used to send keep-alives for ever; the client waits at most its read timeout here."""
    task_id, last = finished
    cursor = str(last + past)
    kw: dict[str, Any] = {"params": {"after": cursor}} if how == "after" else {"headers": {"Last-Event-ID": cursor}}
    with fleet.server.client() as c:
        r = c.get(f"/v1/tasks/{task_id}/events", timeout=httpx.Timeout(5 * SSE_POLL_S, connect=5), **kw)
    assert r.status_code == 204 and r.content == b""
    # one event before the end still comes, and the stream ends after it
    with fleet.server.client() as c:
        r = c.get(f"/v1/tasks/{task_id}/events", params={"after": last - 1}, timeout=httpx.Timeout(5 * SSE_POLL_S))
    assert r.status_code == 200
    assert [line for line in r.text.splitlines() if line.startswith("id:")] == [f"id: {last}"]


def test_a_cursor_past_the_end_of_a_running_task_waits_and_ends_when_the_task_ends(fleet: Fleet) -> None:
    task = fleet.submit({"nodes": [{"id": "slow", "commands": [shell(["sleep", "60"])]}]})
    fleet.wait_task(task["id"], states=("running",))
    url = f"{fleet.server.url}/v1/tasks/{task['id']}/events"
    reader = Reader(url, fleet.server.api_key, headers={"Last-Event-ID": str(10**12)}).start()
    assert reader.status == 200
    assert not reader.done.is_set(), "a running task's stream must wait for more events"
    with fleet.server.client() as c:
        assert c.post(f"/v1/tasks/{task['id']}/cancel").status_code == 202
    fleet.wait_task(task["id"])
    ended = time.monotonic()
    assert reader.done.wait(3 * SSE_POLL_S + 5), "the stream kept going after its task ended"
    assert reader.error is None, reader.error
    assert reader.frames == []  # every event of the task is before the cursor
    assert reader.ended_at is not None and reader.ended_at - ended < 3 * SSE_POLL_S + 5


def test_a_revoked_key_loses_its_open_stream_within_seconds_while_events_keep_coming(fleet: Fleet) -> None:
    key_id, key = new_key(fleet.server)
    task = fleet.submit(chain(60, 0.3))
    url = f"{fleet.server.url}/v1/tasks/{task['id']}/events"
    reader = Reader(url, key).start()
    wait_until(lambda: len(reader.frames) >= 3, 30, "the stream's first events")
    with fleet.server.client() as c:
        assert c.delete(f"/v1/api-keys/{key_id}").status_code == 200
    revoked = time.monotonic()
    try:
        assert reader.done.wait(CLOSE_WITHIN_S + 5), "the revoked key's stream is still open"
        assert reader.error is None, reader.error
        assert reader.ended_at is not None and reader.ended_at - revoked < CLOSE_WITHIN_S
        _at, kind, data = reader.frames[-1]
        assert kind == "error" and data["code"] == "key_revoked", reader.frames[-3:]
        assert all(k != "error" for _, k, _ in reader.frames[:-1])
        assert fleet.task(task["id"])["state"] == "running"  # the task (and its events) went on
        r = httpx.get(url, headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert r.status_code == 401
    finally:
        with fleet.server.client() as c:
            c.post(f"/v1/tasks/{task['id']}/cancel")
        fleet.wait_task(task["id"])


def test_other_keys_keep_their_streams_when_one_key_is_revoked(fleet: Fleet) -> None:
    doomed_id, doomed = new_key(fleet.server)
    _, kept = new_key(fleet.server)
    task = fleet.submit(chain(60, 0.3))
    url = f"{fleet.server.url}/v1/tasks/{task['id']}/events"
    gone, stays = Reader(url, doomed).start(), Reader(url, kept).start()
    try:
        wait_until(lambda: gone.frames and stays.frames, 30, "both streams' first events")
        with fleet.server.client() as c:
            assert c.delete(f"/v1/api-keys/{doomed_id}").status_code == 200
        assert gone.done.wait(CLOSE_WITHIN_S + 5)
        seen = len(stays.frames)
        wait_until(lambda: len(stays.frames) > seen + 3, 30, "more events on the other key's stream")
        assert not stays.done.is_set()
    finally:
        with fleet.server.client() as c:
            c.post(f"/v1/tasks/{task['id']}/cancel")
    assert stays.done.wait(30)
    assert stays.frames[-1][1] == "task.state" and stays.frames[-1][2]["state"] == "cancelled"


def test_a_key_revoked_on_one_replica_loses_its_streams_on_another(
    tmp_path: Path, postgres_db: str, redis_db: str
) -> None:
    with ReplicaSet(tmp_path, postgres_db, redis_db) as rs:
        a, b = rs.replicas
        rs.agent_on(b, "replica-agent")
        key_id, key = new_key(a)
        with a.client() as c:
            task = c.post("/v1/tasks", json={"dag": chain(60, 0.3)}).json()
        reader = Reader(f"{b.url}/v1/tasks/{task['id']}/events", key).start()
        try:
            wait_until(lambda: len(reader.frames) >= 2, 30, "the stream's first events on replica b")
            with a.client() as c:
                assert c.delete(f"/v1/api-keys/{key_id}").status_code == 200
            revoked = time.monotonic()
            assert reader.done.wait(CLOSE_WITHIN_S + 5), "replica b kept the revoked key's stream open"
            assert reader.ended_at is not None and reader.ended_at - revoked < CLOSE_WITHIN_S
            assert reader.frames[-1][1] == "error" and reader.frames[-1][2]["code"] == "key_revoked"
        finally:
            with a.client() as c:
                c.post(f"/v1/tasks/{task['id']}/cancel")


def test_orrery_tasks_watch_with_a_key_revoked_mid_stream_stops_and_says_why(fleet: Fleet) -> None:
    """The CLI does not reconnect with a dead key nor print a traceback: it names the reason."""
    key_id, key = new_key(fleet.server)
    task = fleet.submit(chain(60, 0.3))
    watcher = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "tasks", "watch", task["id"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(ORRERY_URL=fleet.server.url, ORRERY_API_KEY=key),
        cwd=ROOT,
    )
    try:
        assert watcher.stdout is not None
        first = watcher.stdout.readline()  # `task <id> <name>: running`: the watch is following
        assert task["id"] in first, first
        with fleet.server.client() as c:
            assert c.delete(f"/v1/api-keys/{key_id}").status_code == 200
        _out, err = watcher.communicate(timeout=CLOSE_WITHIN_S + 20)
        assert watcher.returncode not in (0, None)
        assert "revoked" in err and "Traceback" not in err, err  # key_revoked, or 401 on its next call
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
        with fleet.server.client() as c:
            c.post(f"/v1/tasks/{task['id']}/cancel")
        fleet.wait_task(task["id"])
