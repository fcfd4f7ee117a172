"""Issue 18: the router's guards with a real files toolset, a real audit log and a real
kill-switch file: the intent line before the call, `audit_unavailable` when it cannot be written,
the kill switch flipped between two calls, and budget refusals in the audit."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from device_agent.audit import AuditLog
from device_agent.budgets import SafetyBudgets
from device_agent.guards import Guards
from device_agent.killswitch import KillSwitch
from device_agent.policy import Policy
from device_agent.router import Router
from device_agent.runner import BUILTIN
from device_agent.toolset_host import ToolsetHost
from protocol.messages import Command, Result
from tests.unit.device_agent.toolkit import make_ctx

CANARY = "typed-text-canary-0815"


@asynccontextmanager
async def guarded(tmp_path: Path, budgets: SafetyBudgets | None = None, fsync: bool = False) -> AsyncIterator[Router]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    audit = AuditLog(tmp_path / "audit.jsonl", fsync=fsync)
    guards = Guards(audit, KillSwitch(tmp_path / "kill-switch"), budgets)
    router = Router(Policy(), audit, [], 256 * 1024, guards=guards)
    router.add(ToolsetHost("files", BUILTIN["files"](make_ctx(workspace)), strict_arguments=True, in_process=True))
    await router.start()
    try:
        yield router
    finally:
        await router.stop()
        audit.close()


async def call(router: Router, tool: str, n: int, **arguments: Any) -> Result:
    return await router.call(Command(call_id=f"c{n}", tool=tool, arguments=arguments), "b1", 30)


def lines(tmp_path: Path) -> list[dict[str, Any]]:
    text = (tmp_path / "audit.jsonl").read_text()
    assert CANARY not in text
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("fsync", [False, True])
async def test_a_call_that_runs_is_audited_before_and_after_without_its_arguments(tmp_path: Path, fsync: bool) -> None:
    async with guarded(tmp_path, fsync=fsync) as r:
        assert (await call(r, "files.write", 1, path="a.txt", content=CANARY)).status == "success"
    got = [(e["call_id"], e["phase"], e["decision"], e.get("status")) for e in lines(tmp_path)]
    assert got == [("c1", "intent", "allowed", None), ("c1", "outcome", "allowed", "success")]


def _chattr(path: Path, flag: str) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


async def test_no_call_runs_when_its_intent_line_cannot_be_written(tmp_path: Path) -> None:
    async with guarded(tmp_path) as r:
        audit = tmp_path / "audit.jsonl"
        try:
            _chattr(audit, "+i")
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"chattr +i is not available here: {exc}")
        try:
            write = await call(r, "files.write", 1, path="b.txt", content=CANARY)
            read = await call(r, "files.list", 2, path=".")
        finally:
            _chattr(audit, "-i")
        assert write.error is not None and write.error.code == "audit_unavailable"
        assert "did not run" in write.error.message and str(audit) in write.error.message
        assert read.error is not None and read.error.code == "audit_unavailable"  # nothing runs unaudited
        assert not (tmp_path / "ws" / "b.txt").exists()
        assert (await call(r, "files.write", 3, path="b.txt", content="x")).status == "success"
    assert [e["call_id"] for e in lines(tmp_path)] == ["c3", "c3"]


async def test_the_kill_switch_file_applies_from_the_next_call(tmp_path: Path) -> None:
    async with guarded(tmp_path) as r:
        (tmp_path / "kill-switch").touch()
        refused = await call(r, "files.write", 1, path="c.txt", content="x")
        assert refused.error is not None and refused.error.code == "policy_denied"
        assert "kill switch" in refused.error.message
        assert (await call(r, "files.list", 2, path=".")).status == "success"
        (tmp_path / "kill-switch").unlink()
        assert (await call(r, "files.write", 3, path="c.txt", content="x")).status == "success"


async def test_a_budget_refusal_runs_nothing_and_is_one_denied_line(tmp_path: Path) -> None:
    async with guarded(tmp_path, SafetyBudgets(destructive_per_minute=1)) as r:
        assert (await call(r, "files.write", 1, path="d.txt", content="x")).status == "success"
        refused = await call(r, "files.delete", 2, path="d.txt")
        assert refused.error is not None and refused.error.code == "budget_exceeded"
        assert (tmp_path / "ws" / "d.txt").exists()
        assert (await call(r, "files.read", 3, path="d.txt")).status == "success"  # reads still run
    mine = [(e["call_id"], e["phase"], e["decision"], e.get("error_code")) for e in lines(tmp_path)]
    assert ("c2", "outcome", "denied", "budget_exceeded") in mine
    assert ("c2", "intent", "allowed", None) not in mine
