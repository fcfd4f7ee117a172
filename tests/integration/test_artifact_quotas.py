"""Artifact quotas end to end: a real orchestrator (SQLite, or Postgres with
ORRERY_TEST_BACKEND=postgres) and real agents. A command publishing in a loop is stopped by its
task's quota, a device by its own across tasks; the tool's result says which quota was hit, and
a device talking to the routes itself gets 413 `quota_exceeded` before it sends a byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.test_artifacts import DEVICE, dag, failure_of, node, open_batch, publish, run
from tests.support import Fleet

TASK_QUOTA = 1000
DEVICE_QUOTA = 1500


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(
        tmp_path_factory.mktemp("quotas"),
        artifact_task_quota_bytes=str(TASK_QUOTA),
        artifact_device_quota_bytes=str(DEVICE_QUOTA),
    ) as f:
        yield f


def listed(fleet: Fleet, task_id: str) -> list[str]:
    with fleet.server.client() as c:
        items = c.get(f"/v1/tasks/{task_id}/artifacts", params={"history": "true"}).json()["items"]
    return sorted(a["name"] for a in items)


def test_a_command_publishing_in_a_loop_is_stopped_by_its_tasks_quota_and_told_so(fleet: Fleet) -> None:
    agent = fleet.agent("looper")
    names = [f"part{i}.bin" for i in range(5)]
    for i, name in enumerate(names):
        (agent.workspace / name).write_bytes(bytes([i]) * 400)
    task = run(fleet, dag(node("loop", agent.device_id, *(publish(n) for n in names))))
    assert task["state"] == "failed"
    results = fleet.node(task, "loop")["attempts"][-1]["results"]
    assert [r["status"] for r in results] == ["success", "success", "failure", "skipped", "skipped"]
    error = results[2]["error"]
    assert error["code"] == "quota_exceeded", error
    assert "artifact quota exceeded" in error["message"] and "ORRERY_ARTIFACT_TASK_QUOTA_BYTES" in error["message"]
    assert "800 of its 1000 bytes" in error["message"]
    assert listed(fleet, task["id"]) == names[:2]  # 2 x 400 fit in 1000; the third did not move


def test_a_devices_quota_holds_across_its_tasks(fleet: Fleet) -> None:
    agent = fleet.agent("steady")
    for day in range(2):  # two tasks of 600 bytes each: 1200 of the device's 1500
        (agent.workspace / "day.log").write_bytes(bytes([day]) * 600)
        assert run(fleet, dag(node("pub", agent.device_id, publish("day.log"))))["state"] == "succeeded"
    (agent.workspace / "day.log").write_bytes(b"\x02" * 600)
    third = run(fleet, dag(node("pub", agent.device_id, publish("day.log"))))
    error = failure_of(third, "pub")
    assert error["code"] == "quota_exceeded" and "ORRERY_ARTIFACT_DEVICE_QUOTA_BYTES" in error["message"], error
    assert listed(fleet, third["id"]) == []


def test_a_device_asking_past_a_quota_gets_413_quota_exceeded_before_sending_a_byte(fleet: Fleet) -> None:
    agent = fleet.agent("raw")
    digest = hashlib.sha256(b"z").hexdigest()
    with (
        open_batch(fleet, agent) as (task_id, batch_id),
        httpx.Client(base_url=fleet.server.url, headers={"Authorization": f"Bearer {agent.token}"}, timeout=30) as c,
    ):
        body = {"batch_id": batch_id, "name": "big.bin", "size": TASK_QUOTA + 1, "sha256": digest}
        refused = c.post(f"{DEVICE}/uploads", json=body)
        assert refused.status_code == 413, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        problem = refused.json()
        assert problem["code"] == "quota_exceeded" and problem["type"].endswith("/quota_exceeded")
        assert (problem["scope"], problem["quota"], problem["limit"]) == ("task", "bytes", TASK_QUOTA)
        fits = c.post(f"{DEVICE}/uploads", json={**body, "size": TASK_QUOTA})
        assert fits.status_code == 201, fits.text  # the whole quota, declared, is reserved...
        second = c.post(f"{DEVICE}/uploads", json={**body, "name": "more.bin", "size": 1})
        assert second.status_code == 413 and second.json()["used"] == TASK_QUOTA  # ...so nothing more fits
    assert listed(fleet, task_id) == []
