"""Every error code the code can answer with is in the registry the error codes page is generated
from (orrery/error_codes.py): a code added without documentation fails here.

The scan reads the source (AST), not a running system: string literals in the places an error
code is given (`code=`, `code = "..."`, `{"code": ...}`, the code argument of the error types
below), the sets and tables of codes (`*_CODES`, `*_REASONS`), constants such as
`FAN_OUT_FAILED = "fan_out_failed"`, and the protocol's enums.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from orrery import error_codes
from protocol.errors import RESULT_ERROR_CODES, CloseCode, ErrorCode

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "device_agent", "protocol", "orrery")
CODE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)*$")

# Constructors and helpers whose argument at this position is an error code.
CODE_ARGUMENT = {
    "ApiError": 1,
    "problem_response": 1,
    "problem_body": 1,
    "Problem": 0,
    "SubmissionWarning": 0,
    "GuiError": 0,
    "TransferError": 0,
    "failure": 0,
    "error_result": 0,
    "LlmError": 0,
    "PlanFailed": 1,
    "Breach": 0,
    "Refusal": 0,
    # The Python SDK's error tree (orrery/sdk/errors.py): (status, code, detail).
    **dict.fromkeys(("OrreryError", "InvalidRequest", "Unauthorized", "Unavailable", "ServerError", "WaitTimeout"), 1),
    "_answer": 2,
    "_deny": 2,
    "_closing": 1,
    "fail": 1,
}
# Upper-case string constants that look like codes but are not error codes.
NOT_CODES = {
    "waiting_approval": "a node state (NodeState.WAITING_APPROVAL)",
    "owner_takeover": "a frame type and the agent ledger's key for the owner's takeover",
}


def _literal(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.match(node.value):
        return node.value
    return None


def _strings(node: ast.AST) -> list[str]:
    return [s for n in ast.walk(node) if (s := _literal(n)) is not None]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return ""


def scan(source: str, where: str) -> dict[str, set[str]]:
    """Code -> the places (`file:line`) that give it, in one module's source."""
    found: dict[str, set[str]] = defaultdict(set)

    def add(code: str | None, node: ast.AST) -> None:
        if code is not None:
            found[code].add(f"{where}:{getattr(node, 'lineno', '?')}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            position = CODE_ARGUMENT.get(_name(node.func))
            if position is not None and len(node.args) > position:
                add(_literal(node.args[position]), node)
            for keyword in node.keywords:
                if keyword.arg == "code":
                    add(_literal(keyword.value), node)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "code":
                    add(_literal(value), node)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            assigned: ast.expr = node.value
            for target in targets:
                name = _name(target)
                if name == "code":
                    add(_literal(assigned), node)
                elif name.endswith("_CODES"):
                    # a set of codes, or a table whose values are codes (status -> code)
                    parts = assigned.values if isinstance(assigned, ast.Dict) else [assigned]
                    for part in parts:
                        for code in _strings(part):
                            add(code, node)
                elif name.endswith("_REASONS"):  # code -> why it is never retried
                    if isinstance(target, ast.Subscript):
                        add(_literal(target.slice), node)
                    elif isinstance(assigned, ast.Dict):
                        for key in assigned.keys:
                            add(_literal(key), node)
                elif name.isupper() and "_" in (_literal(assigned) or ""):
                    add(_literal(assigned), node)
    return found


def scan_code() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "error_codes.py" and path.parent.name == "orrery":
                continue
            for code, places in scan(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))).items():
                found[code] |= places
    for code in RESULT_ERROR_CODES | {c.value for c in ErrorCode}:
        found[code].add("protocol/errors.py (ErrorCode, TOOLSET_ERROR_CODES)")
    for code in NOT_CODES:
        found.pop(code, None)
    return found


def test_every_code_the_code_gives_is_documented() -> None:
    missing = {code: sorted(places)[:3] for code, places in scan_code().items() if code not in error_codes.known()}
    assert missing == {}, (
        "error codes given in the code but missing from orrery/error_codes.py (add each with its meaning, "
        f"or to NOT_CODES here if it is not an error code): {missing}"
    )


def test_every_close_code_is_documented() -> None:
    assert {int(c) for c in CloseCode} <= set(error_codes.CLOSE_CODES)
    assert {c.name for c in CloseCode} == {name for name, _ in error_codes.CLOSE_CODES.values()}


def test_the_registry_is_well_formed() -> None:
    seen = set()
    for entry in error_codes.CODES:
        assert CODE.match(entry.code), entry
        assert entry.kind in error_codes.KINDS, entry
        assert entry.meaning.strip(), entry
        assert (entry.code, entry.kind) not in seen, f"{entry.code} twice in {entry.kind}"
        seen.add((entry.code, entry.kind))
        if entry.kind == "rest" and entry.status is not None:
            assert 400 <= entry.status < 600, entry


def test_the_scan_sees_each_way_a_code_is_given() -> None:
    """The scanner is not blind: each shape it claims to read yields its code (a scan that found
    nothing would pass the test above while documenting nothing)."""
    source = """
raise ApiError(409, "code_a", "detail")
problems.append(Problem("code_b", "message"))
class E(Exception):
    code = "code_c"
x = {"code": "code_d", "message": "m"}
NEVER_RETRY_CODES = frozenset({"code_e"})
_HTTP_CODES = {400: "code_f"}
_NEVER_RETRY_REASONS["code_g"] = "why"
FAN_OUT_THING = "code_h"
info = ErrorInfo(code="code_i", message="m")
raise ApiError(409, variable, "not a literal")
"""
    assert set(scan(source, "example.py")) == {f"code_{c}" for c in "abcdefghi"}
    found = scan_code()
    for code in ("dag_cycle", "fan_out_failed", "verification_failed", "batch_closed", "stale_fence", "unavailable"):
        assert code in found, code
