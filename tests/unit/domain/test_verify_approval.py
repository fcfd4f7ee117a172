"""`verify_needs_approval`: a verify command may not use a tool that waits for a person."""

from __future__ import annotations

from typing import Any

from orchestrator.domain import verification
from orchestrator.domain.model import DagSpec
from tests.unit.domain.test_checks import device, shell

ASK = {"tool": "approval.request", "arguments": {"reason": "done?"}}
READ = {"tool": "files.read", "arguments": {"path": "x"}}


def spec(*verify: dict[str, Any]) -> DagSpec:
    node = {"id": "n", "commands": [shell({"argv": ["true"]})], "verify": list(verify)}
    return DagSpec.model_validate({"nodes": [node]})


def codes(s: DagSpec, devices: list[Any]) -> list[tuple[str, str, list[str]]]:
    return [(p.code, p.extra["tool"], p.extra["devices"]) for p in verification.verify_approval_problems(s, devices)]


def test_approval_request_is_refused_in_verify_whatever_the_devices() -> None:
    assert codes(spec(READ, ASK), []) == [("verify_needs_approval", "approval.request", [])]
    (p,) = verification.verify_approval_problems(spec(ASK), [device("a")])
    assert p.extra["verify"] == 0 and "use a read-only tool" in p.message


def test_a_tool_a_device_asks_approval_for_is_refused_naming_that_device() -> None:
    asks = device("a", policy={"approval_required": ["files.*"]})
    quiet = device("b", policy={"approval_required": ["gui.click"]})
    unattended = device("c", policy={"approval_required": ["files.read"], "unattended": True})
    assert codes(spec(READ), [asks, quiet, unattended]) == [("verify_needs_approval", "files.read", ["a"])]


def test_no_reported_policy_or_a_broken_one_refuses_nothing_more() -> None:
    for policy in (None, {}, {"approval_required": "files.read"}, {"approval_required": [3]}):
        assert codes(spec(READ), [device("a", policy=policy)]) == []
