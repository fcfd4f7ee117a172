"""Submission checks against device catalogues: argument schemas, retry warnings, policy refusals."""

from __future__ import annotations

from typing import Any

from orchestrator.domain import checks, fanout, verification
from orchestrator.domain.model import AdminState, DagSpec, Liveness
from orchestrator.domain.placement import DeviceView

RUN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "cwd": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "timeout_s": {"anyOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "null"}]},
    },
    "required": ["argv"],
    "additionalProperties": False,
}
SHELL = {"name": "shell.run", "input_schema": RUN_SCHEMA, "annotations": {"read_only": False, "idempotent": False}}
READ = {
    "name": "files.read",
    "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "annotations": {"read_only": True, "idempotent": True},
}


def device(
    name: str,
    tools: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    policy: dict[str, Any] | None = None,
) -> checks.CatalogDevice:
    catalogue = tools if tools is not None else {"shell.run": SHELL, "files.read": READ}
    view = DeviceView(
        id=f"dev_{name}",
        name=name,
        labels=labels or {},
        platform="linux",
        tools=frozenset(catalogue),
        liveness=Liveness.ONLINE,
    )
    return checks.CatalogDevice(view, catalogue, policy)


def dag(*commands: dict[str, Any], retry: int = 1, placement: dict[str, Any] | None = None) -> DagSpec:
    node = {"id": "n", "commands": list(commands), "retry": {"max_attempts": retry}, "placement": placement or {}}
    return DagSpec.model_validate({"nodes": [node]})


def shell(arguments: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"tool": "shell.run", "arguments": arguments, **kw}


def fields(spec: DagSpec, devices: list[checks.CatalogDevice]) -> list[tuple[int, str]]:
    problems = checks.argument_problems(spec, devices)
    assert all(p.code == "invalid_arguments" and p.extra["node_id"] == "n" for p in problems)
    return [(p.extra["command"], p.extra["field"]) for p in problems]


def test_arguments_that_fit_the_schema_pass() -> None:
    assert fields(dag(shell({"argv": ["uname", "-a"], "cwd": None})), [device("a")]) == []


def test_a_string_where_a_list_is_wanted_names_the_command_and_field() -> None:
    (p,) = checks.argument_problems(dag(shell({"argv": ["ls"]}), shell({"argv": "uname"})), [device("a")])
    assert (p.extra["command"], p.extra["field"]) == (1, "argv")
    assert "node 'n' command 1 (shell.run)" in p.message and "argv" in p.message


def test_a_missing_required_and_an_unknown_argument_are_each_named() -> None:
    problems = checks.argument_problems(dag(shell({"args": ["ls"]})), [device("a")])
    assert sorted(p.extra["field"] for p in problems) == ["args", "argv"]
    unknown = next(p for p in problems if p.extra["field"] == "args")
    assert "unknown argument 'args'" in unknown.message and "argv, cwd, timeout_s" in unknown.message


def test_a_nested_field_is_a_dotted_path() -> None:
    assert fields(dag(shell({"argv": ["ls", 3]})), [device("a")]) == [(0, "argv.1")]


def test_references_are_not_judged_by_type_but_keys_still_are() -> None:
    ok = dag(shell({"argv": "${nodes.up.output.argv}", "timeout_s": "${nodes.up.output}"}))
    assert fields(ok, [device("a")]) == []
    inside = dag(shell({"argv": ["echo", "n=${nodes.up.output.n}", "${nodes.up.output}"]}))
    assert fields(inside, [device("a")]) == []
    sibling = dag(shell({"argv": ["echo", 5, "${nodes.up.output}"]}))
    assert fields(sibling, [device("a")]) == [(0, "argv.1")]  # a plain value next to one still is
    missing = dag(shell({"cwd": "${nodes.up.output}"}))
    assert fields(missing, [device("a")]) == [(0, "argv")]


def test_arguments_fitting_one_candidate_device_are_accepted() -> None:
    loose = {**SHELL, "input_schema": {"type": "object", "properties": {"argv": {"type": "string"}}}}
    spec = dag(shell({"argv": "uname"}))
    assert fields(spec, [device("strict"), device("loose", {"shell.run": loose})]) == []
    assert fields(spec, [device("strict")]) == [(0, "argv")]


def test_only_devices_the_placement_allows_count() -> None:
    loose = {**SHELL, "input_schema": {"type": "object", "properties": {"argv": {"type": "string"}}}}
    spec = dag(shell({"argv": "uname"}), placement={"labels": {"role": "web"}})
    devices = [device("strict", labels={"role": "web"}), device("loose", {"shell.run": loose})]
    assert fields(spec, devices) == [(0, "argv")]
    revoked = device("gone", {"shell.run": loose}, labels={"role": "web"})
    revoked = checks.CatalogDevice(
        DeviceView(**{**revoked.view.__dict__, "admin": AdminState.REVOKED}), revoked.tools, None
    )
    assert fields(spec, [*devices, revoked]) == [(0, "argv")]


def test_a_broken_or_missing_schema_refuses_nothing() -> None:
    broken = {**SHELL, "input_schema": {"type": "object", "properties": {"argv": {"type": 12}}}}
    remote = {**SHELL, "input_schema": {"$ref": "https://example.invalid/schema.json"}}
    empty = {**SHELL, "input_schema": {}}
    for tool in (broken, remote, empty):
        assert fields(dag(shell({"argv": "uname"})), [device("a", {"shell.run": tool})]) == []


def test_retries_on_a_tool_that_is_not_retry_safe_warn() -> None:
    (w,) = checks.retry_warnings(dag(shell({"argv": ["ls"]}), retry=3), [device("a")])
    assert (w.code, w.node_id) == ("retry_not_safe", "n")
    assert "shell.run" in w.message and "idempotent: true" in w.message


def test_no_retry_warning_when_declared_idempotent_read_only_or_single_try() -> None:
    devices = [device("a")]
    assert checks.retry_warnings(dag(shell({"argv": ["ls"]}, idempotent=True), retry=3), devices) == []
    assert checks.retry_warnings(dag({"tool": "files.read", "arguments": {"path": "x"}}, retry=3), devices) == []
    assert checks.retry_warnings(dag(shell({"argv": ["ls"]})), devices) == []


def refused(spec: DagSpec, policy: dict[str, Any] | None) -> list[str]:
    return [r["message"] for r in checks.refusals(spec.nodes[0], device("a", policy=policy))]


def test_policy_refusals_follow_the_reported_policy() -> None:
    ls = dag(shell({"argv": ["ls"]}))
    base = {"shell_allow": None, "shell_deny": [], "approval_required": [], "unattended": False, "kill_switch": False}
    assert refused(ls, None) == []  # an older agent reports no policy: nothing predicted
    assert refused(ls, base) == []
    assert "deny list" in refused(dag(shell({"argv": ["/usr/bin/ls"]})), {**base, "shell_deny": ["ls"]})[0]
    assert "allow list" in refused(ls, {**base, "shell_allow": ["echo"]})[0]
    assert refused(ls, {**base, "shell_allow": ["/bin/ls"]}) == []
    # A tool that needs approval waits for one (issue 18): it is not a refusal.
    assert refused(ls, {**base, "approval_required": ["shell.*"]}) == []
    assert "kill switch" in refused(ls, {**base, "kill_switch": True})[0]
    read = dag({"tool": "files.read", "arguments": {"path": "x"}})
    assert refused(read, {**base, "kill_switch": True}) == []


def test_a_refusal_names_command_tool_device_and_code() -> None:
    (r,) = checks.refusals(dag(shell({"argv": ["rm", "x"]})).nodes[0], device("a", policy={"shell_deny": ["rm"]}))
    assert {k: r[k] for k in ("command", "tool", "device", "code")} == {
        "command": 0,
        "tool": "shell.run",
        "device": "a",
        "code": "policy_denied",
    }


# ---------------------------------------------------------------- issue 20: verify and fan-out


def test_a_verify_command_whose_tool_is_not_read_only_everywhere_is_refused_naming_the_devices() -> None:
    node = {"id": "n", "commands": [shell({"argv": ["true"]})], "verify": [shell({"argv": ["test", "-f", "x"]})]}
    (p,) = verification.verify_problems(DagSpec.model_validate({"nodes": [node]}), [device("a"), device("b")])
    assert (p.code, p.extra["tool"], p.extra["devices"]) == ("verify_not_read_only", "shell.run", ["a", "b"])
    read = {**node, "verify": [{"tool": "files.read", "arguments": {"path": "x"}}]}
    assert verification.verify_problems(DagSpec.model_validate({"nodes": [read]}), [device("a")]) == []


def test_a_named_fan_out_device_must_be_enrolled_and_able_to_run_the_node() -> None:
    node = {"id": "n", "for_each": {"devices": ["a", "nope", "bare"]}, "commands": [shell({"argv": ["true"]})]}
    devices = [device("a"), device("bare", tools={})]
    problems = fanout.fan_out_problems(DagSpec.model_validate({"nodes": [node]}), devices)
    assert [(p.code, p.extra["device"]) for p in problems] == [
        ("unknown_device", "nope"),
        ("no_capable_device", "bare"),
    ]


def test_a_fan_out_output_passed_whole_where_a_string_is_wanted_says_it_is_a_map() -> None:
    fan = {"id": "f", "for_each": {}, "commands": [shell({"argv": ["true"]})]}
    use = {"id": "n", "commands": [{"tool": "files.read", "arguments": {"path": "${nodes.f.output}"}}]}
    spec = DagSpec.model_validate({"nodes": [fan, use], "edges": [{"from": "f", "to": "n"}]})
    (p,) = checks.argument_problems(spec, [device("a")])
    assert (p.code, p.extra["field"]) == ("invalid_arguments", "path")
    assert "a map from device name to output" in p.message and "${nodes.f.output.<device>...}" in p.message
