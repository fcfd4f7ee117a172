"""A node's `verify` commands decide its outcome unattended (after a restart, on another device),
so none may wait for a person: `approval.request` is refused in `verify` always, and so is a tool
the device's agent lists in its `approval_required` (reported in `hello.info.policy`), at
submission (`POST /v1/tasks`) and at validation (`?dry_run=true`, `orrery validate`), with the
code `verify_needs_approval`. Real orchestrator and agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Fleet, run_cli, shell


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("verify-approval")) as f:
        f.agent("asks", {"pool": "asks"}, ORRERY_AGENT_APPROVAL_REQUIRED='["system.*"]')
        f.agent("plain", {"pool": "plain"})
        f.agent(
            "unattended",
            {"pool": "unattended"},
            ORRERY_AGENT_APPROVAL_REQUIRED='["system.*"]',
            ORRERY_AGENT_UNATTENDED="true",
        )
        yield f


def dag(pool: str, verify: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodes": [{"id": "n", "placement": {"labels": {"pool": pool}}, "commands": [shell(["true"])], "verify": verify}]
    }


def submit(fleet: Fleet, body: dict[str, Any], dry_run: bool = False) -> httpx.Response:
    with fleet.server.client() as c:
        return c.post("/v1/tasks", json={"dag": body}, params={"dry_run": "true"} if dry_run else None)


ASK = {"tool": "approval.request", "arguments": {"reason": "is it done?"}}
INFO = {"tool": "system.info", "arguments": {}}


@pytest.mark.parametrize("pool", ["plain", "unattended"])
def test_approval_request_in_verify_is_refused_at_submission_and_validation(fleet: Fleet, pool: str) -> None:
    refused = submit(fleet, dag(pool, [ASK]))
    assert refused.status_code == 422, refused.text
    (problem,) = refused.json()["problems"]
    assert (problem["code"], problem["tool"], problem["verify"]) == ("verify_needs_approval", "approval.request", 0)
    checked = submit(fleet, dag(pool, [ASK]), dry_run=True).json()
    assert checked["valid"] is False and [p["code"] for p in checked["problems"]] == ["verify_needs_approval"]


def test_a_tool_the_device_asks_approval_for_is_refused_in_verify_naming_the_device(fleet: Fleet) -> None:
    refused = submit(fleet, dag("asks", [INFO]))
    assert refused.status_code == 422, refused.text
    (problem,) = refused.json()["problems"]
    assert (problem["code"], problem["tool"], problem["devices"]) == ("verify_needs_approval", "system.info", ["asks"])
    # The same read-only tool is fine where it does not wait: a device without the rule, or unattended.
    for pool in ("plain", "unattended"):
        assert submit(fleet, dag(pool, [INFO]), dry_run=True).json()["valid"] is True, pool


def test_orrery_validate_says_why(fleet: Fleet, tmp_path: Path) -> None:
    path = tmp_path / "dag.json"
    path.write_text(json.dumps(dag("plain", [ASK])))
    done = run_cli(fleet, "validate", str(path))
    assert done.returncode != 0 and "verify_needs_approval" in done.stdout + done.stderr, done
