"""Submission as a user meets it (issue 13, items 3 and 5, `dry_run`): retries on tools that are not
retry-safe warn and say why they did not happen, `idempotent: true` makes them happen, wrong tool
arguments are refused at submission against the schemas a real agent reported, and a dry run
checks everything without creating a task."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from websockets.asyncio.client import connect

from tests.rawdevice import RawDevice
from tests.support import Fleet, shell, wait_until

ROLE = {"role": "checks"}
PLACED = {"labels": ROLE}


@pytest.fixture(scope="module")
def fleet(shared_fleet: Fleet) -> Fleet:
    shared_fleet.agent("checks-agent", ROLE)
    return shared_fleet


def post(fleet: Fleet, body: Any, params: dict[str, str] | None = None, **headers: str) -> Any:
    with fleet.server.client() as c:
        return c.post("/v1/tasks", json=body, params=params, headers=headers)


def task_count(fleet: Fleet) -> int:
    with fleet.server.client() as c:
        return len(c.get("/v1/tasks", params={"limit": 500}).json()["items"])


def counter(name: str) -> dict[str, Any]:
    """A command that fails until its third run (it counts its runs in a workspace file)."""
    script = f"n=$(cat {name} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {name}; test $n -ge 3"
    return shell(["sh", "-c", script])


def retried_node(command: dict[str, Any]) -> dict[str, Any]:
    return {"id": "flaky", "placement": PLACED, "commands": [command], "retry": {"max_attempts": 3, "backoff_s": 0.05}}


# ---------------------------------------------------------------- retries


def test_a_command_declared_idempotent_is_retried_until_it_succeeds(fleet: Fleet) -> None:
    task = fleet.submit({"nodes": [retried_node({**counter("count-idem"), "idempotent": True})]})
    assert task["warnings"] == []
    done = fleet.wait_task(task["id"])
    node = fleet.node(done, "flaky")
    assert done["state"] == "succeeded", node
    assert len(node["attempts"]) == 3


def test_a_shell_node_with_retries_warns_runs_once_and_says_why_it_was_not_retried(fleet: Fleet) -> None:
    task = fleet.submit({"nodes": [retried_node(counter("count-plain"))]})
    (warning,) = task["warnings"]
    assert warning["code"] == "retry_not_safe" and warning["node_id"] == "flaky"
    assert "shell.run" in warning["message"] and "idempotent: true" in warning["message"]
    done = fleet.wait_task(task["id"])
    node = fleet.node(done, "flaky")
    assert done["state"] == "failed" and len(node["attempts"]) == 1
    assert "shell.run is neither read-only nor idempotent" in node["error"]["not_retried"]


def test_the_answer_to_a_repeated_idempotent_submission_carries_the_warnings_too(fleet: Fleet) -> None:
    body = {"dag": {"nodes": [retried_node(shell(["true"]))]}}
    first = post(fleet, body, **{"Idempotency-Key": "warn-twice"})
    again = post(fleet, body, **{"Idempotency-Key": "warn-twice"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert (
        [w["code"] for w in again.json()["warnings"]]
        == ["retry_not_safe"]
        == [w["code"] for w in first.json()["warnings"]]
    )
    assert fleet.task(first.json()["id"])["warnings"] == []  # a later read does not repeat them


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("arguments", "field", "words"),
    [
        ({"argv": "uname"}, "argv", "is not of type 'array'"),
        ({"cwd": "."}, "argv", "required"),
        ({"argv": ["ls"], "shell": True}, "shell", "unknown argument 'shell'"),
    ],
)
def test_wrong_arguments_are_refused_at_submission_naming_node_command_and_field(
    fleet: Fleet, arguments: dict[str, Any], field: str, words: str
) -> None:
    before = task_count(fleet)
    dag = {
        "nodes": [
            {"id": "ok", "placement": PLACED, "commands": [shell(["true"])]},
            {
                "id": "bad",
                "placement": PLACED,
                "commands": [shell(["true"]), {"tool": "shell.run", "arguments": arguments}],
            },
        ]
    }
    r = post(fleet, {"dag": dag})
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["code"] == "invalid_arguments"
    (problem,) = body["problems"]
    assert (problem["node_id"], problem["command"], problem["field"]) == ("bad", 1, field)
    assert "node 'bad' command 1 (shell.run)" in problem["message"] and words in problem["message"]
    assert task_count(fleet) == before


def test_a_reference_where_a_list_is_wanted_is_not_judged_at_submission(fleet: Fleet) -> None:
    dag = {
        "nodes": [
            {"id": "up", "placement": PLACED, "commands": [shell(["true"])]},
            {
                "id": "down",
                "placement": PLACED,
                "commands": [{"tool": "shell.run", "arguments": {"argv": "${nodes.up.output.argv}"}}],
            },
        ],
        "edges": [{"from": "up", "to": "down"}],
    }
    assert post(fleet, {"dag": dag}, params={"dry_run": "true"}).json()["valid"] is True


def test_a_reference_whose_value_does_not_fit_fails_the_node_in_plain_words_before_dispatch(fleet: Fleet) -> None:
    """A whole reference keeps its value's type; an object where the tool takes a string is caught
    once the value is known, with the schema's words, and the command never reaches the device."""

    def echo(node_id: str, text: str) -> dict[str, Any]:
        return {"id": node_id, "placement": PLACED, "commands": [{"tool": "system.echo", "arguments": {"text": text}}]}

    dag = {
        "nodes": [
            {"id": "up", "placement": PLACED, "commands": [shell(["echo", "hi"])]},
            echo("whole", "${nodes.up.output}"),
            echo("field", "${nodes.up.output.stdout}"),
        ],
        "edges": [{"from": "up", "to": "whole"}, {"from": "up", "to": "field"}],
    }
    r = post(fleet, {"dag": dag})
    assert r.status_code == 201, r.text
    task = fleet.wait_task(r.json()["id"])
    nodes = {n["id"]: n for n in task["nodes"]}
    assert nodes["field"]["state"] == "succeeded" and nodes["field"]["output"] == {"text": "hi\n"}
    whole = nodes["whole"]
    assert whole["state"] == "failed" and whole["attempts"] == []  # never dispatched
    assert whole["error"]["code"] == "invalid_arguments"
    message = whole["error"]["message"]
    assert "command 0 (system.echo)" in message and "argument 'text'" in message and "'string'" in message
    assert "pydantic" not in message and "validation error" not in message


# ---------------------------------------------------------------- dry run


def test_a_dry_run_reports_placement_and_warnings_and_creates_nothing(fleet: Fleet) -> None:
    before = task_count(fleet)
    dag = {"nodes": [retried_node(shell(["true"])), {"id": "any", "commands": [shell(["true"])]}]}
    r = post(fleet, {"dag": dag}, params={"dry_run": "true"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["valid"] is True and body["problems"] == []
    assert [w["code"] for w in body["warnings"]] == ["retry_not_safe"]
    nodes = {n["id"]: n for n in body["nodes"]}
    assert nodes["flaky"]["devices"] == ["checks-agent"] and nodes["flaky"]["would_run_on"] == "checks-agent"
    assert "checks-agent" in nodes["any"]["devices"] and nodes["flaky"]["refusals"] == []
    assert task_count(fleet) == before


def test_a_dry_run_of_an_invalid_dag_lists_its_problems_with_200(fleet: Fleet) -> None:
    cycle = {
        "nodes": [{"id": "a", "commands": [shell(["ls"])]}, {"id": "b", "commands": [shell(["ls"])]}],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}],
    }
    r = post(fleet, {"dag": cycle}, params={"dry_run": "true"})
    assert r.status_code == 200 and r.json()["valid"] is False
    assert [p["code"] for p in r.json()["problems"]] == ["dag_cycle"]
    bad_args = {
        "nodes": [{"id": "a", "placement": PLACED, "commands": [{"tool": "shell.run", "arguments": {"argv": "ls"}}]}]
    }
    (problem,) = post(fleet, {"dag": bad_args}, params={"dry_run": "true"}).json()["problems"]
    assert (problem["code"], problem["node_id"], problem["command"], problem["field"]) == (
        "invalid_arguments",
        "a",
        0,
        "argv",
    )
    nowhere = {"nodes": [{"id": "gpu", "placement": {"labels": {"role": "gpu"}}, "commands": [shell(["ls"])]}]}
    body = post(fleet, {"dag": nowhere}, params={"dry_run": "true"}).json()
    assert body["problems"][0]["code"] == "no_capable_device" and body["problems"][0]["node_id"] == "gpu"
    assert body["nodes"] == [
        {"id": "gpu", "devices": [], "would_run_on": None, "refusals": [], "fans_out_to": None, "left_out": None}
    ]


def test_a_dry_run_needs_no_idempotency_key_and_ignores_one(fleet: Fleet) -> None:
    body = {"dag": {"nodes": [{"id": "a", "placement": PLACED, "commands": [shell(["true"])]}]}}
    assert post(fleet, body, params={"dry_run": "true"}, **{"Idempotency-Key": "dry"}).status_code == 200
    created = post(fleet, body, **{"Idempotency-Key": "dry"})
    assert created.status_code == 201  # the dry run did not use up the key


def test_a_dry_run_of_a_malformed_body_is_still_a_validation_error(fleet: Fleet) -> None:
    r = post(fleet, {"dag": {"nodes": []}}, params={"dry_run": "true"})
    assert r.status_code == 422 and r.json()["code"] == "validation_error"


def test_a_dry_run_needs_the_operator_role(fleet: Fleet) -> None:
    with fleet.server.client() as admin:
        viewer = admin.post("/v1/api-keys", json={"role": "viewer"}).json()["key"]
    with fleet.server.client(viewer) as c:
        r = c.post(
            "/v1/tasks", params={"dry_run": "true"}, json={"dag": {"nodes": [{"id": "a", "commands": [shell(["ls"])]}]}}
        )
    assert r.status_code == 403


def test_a_dry_run_lists_what_a_device_policy_would_refuse(fleet: Fleet) -> None:
    with fleet.server.client() as c:
        real = c.get(f"/v1/devices/{fleet.agents[0].device_id}").json()
    shell_tool = next(t for t in real["tools"] if t["name"] == "shell.run")
    policy = {
        "shell_allow": None,
        "shell_deny": ["rm"],
        "approval_required": ["files.*"],
        "unattended": False,
        "kill_switch": False,
    }
    dev = RawDevice(fleet, "guarded")
    asyncio.run(_hello(fleet, dev, [shell_tool], policy))
    wait_until(lambda: fleet.device(dev.enrolled["id"])["info"].get("policy") == policy, 10, "the policy to be stored")
    dag = {
        "nodes": [
            {
                "id": "wipe",
                "placement": {"device": "guarded"},
                "commands": [shell(["ls"]), shell(["/bin/rm", "-rf", "x"])],
            },
            {"id": "look", "placement": {"device": "guarded"}, "commands": [shell(["ls"])]},
        ]
    }
    body = post(fleet, {"dag": dag}, params={"dry_run": "true"}).json()
    nodes = {n["id"]: n for n in body["nodes"]}
    (refusal,) = nodes["wipe"]["refusals"]
    assert {k: refusal[k] for k in ("command", "tool", "device", "code")} == {
        "command": 1,
        "tool": "shell.run",
        "device": "guarded",
        "code": "policy_denied",
    }
    assert "deny list" in refusal["message"]
    assert nodes["look"]["refusals"] == []
    assert nodes["wipe"]["devices"] == ["guarded"]


async def _hello(fleet: Fleet, dev: RawDevice, tools: list[dict[str, Any]], policy: dict[str, Any]) -> None:
    url = fleet.server.url.replace("http://", "ws://") + "/v1/agent"
    async with connect(url, additional_headers={"Authorization": f"Bearer {dev.enrolled['token']}"}) as ws:
        dev.ws = ws
        await dev.send(
            "hello",
            seq=0,
            device_id=dev.enrolled["id"],
            versions=[1],
            tools=tools,
            resume=None,
            info={"platform": "linux", "policy": policy},
        )
        await dev.recv("welcome")


# ---------------------------------------------------------------- every problem in one round


def _placed(node_id: str, command: dict[str, Any]) -> dict[str, Any]:
    return {"id": node_id, "placement": PLACED, "commands": [command]}


def test_a_refused_submission_names_every_independent_problem_in_one_422(fleet: Fleet) -> None:
    dag = {
        "nodes": [
            _placed("a", shell(["echo", "${node.c.output.stdout}"])),
            _placed("b", {"tool": "shell.rnu", "arguments": {"argv": ["ls"]}}),
            _placed("c", {"tool": "shell.run", "arguments": {"argv": "not-a-list"}}),
            _placed("d", {"tool": "files.read", "arguments": {}}),
        ],
        "edges": [{"from": "a", "to": "c"}, {"from": "c", "to": "a"}, {"from": "d", "to": "ee"}],
    }
    before = task_count(fleet)
    r = post(fleet, {"dag": dag})
    assert r.status_code == 422, r.text
    problems = r.json()["problems"]
    found = sorted((p["code"], p.get("node", "")) for p in problems)
    assert found == [
        ("dag_cycle", ""),
        ("invalid_arguments", "c"),
        ("invalid_arguments", "d"),
        ("invalid_reference", "a"),
        ("unknown_node", "ee"),
        ("unknown_tool", "b"),
    ], problems
    bad_ref = next(p for p in problems if p["code"] == "invalid_reference")
    assert bad_ref["suggestion"] == "${nodes.c.output.stdout}"
    assert "did you mean ${nodes.c.output.stdout}?" in bad_ref["message"]
    dry = post(fleet, {"dag": dag}, params={"dry_run": "true"}).json()
    assert sorted(p["code"] for p in dry["problems"]) == sorted(code for code, _ in found)
    assert task_count(fleet) == before


def test_a_misspelt_key_in_a_body_names_the_field_meant_at_every_level(fleet: Fleet) -> None:
    node = {
        "id": "a",
        "for_each": {"lables": ROLE},
        "retry": {"max_attempts": 2, "backof_s": 1},
        "commands": [{"tool": "shell.run", "argumnets": {"argv": ["ls"]}}],
        "verfy": [],
    }
    r = post(fleet, {"dag": {"nodes": [node], "edges": [{"from": "a", "to": "a", "onn": "success"}]}, "nmae": "x"})
    assert r.status_code == 422 and r.json()["code"] == "validation_error"
    messages = {p["message"] for p in r.json()["problems"]}
    assert {
        "body.nmae: unknown field 'nmae'; did you mean 'name'?",
        "body.dag.nodes.0.for_each.lables: unknown field 'lables'; did you mean 'labels'?",
        "body.dag.nodes.0.retry.backof_s: unknown field 'backof_s'; did you mean 'backoff_s'?",
        "body.dag.nodes.0.commands.0.argumnets: unknown field 'argumnets'; did you mean 'arguments'?",
        "body.dag.nodes.0.verfy: unknown field 'verfy'; did you mean 'verify'?",
        "body.dag.edges.0.onn: unknown field 'onn'; did you mean 'on'?",
    } <= messages, messages
    far = post(fleet, {"dag": {"nodes": [{**node, "zzz": 1}]}}).json()["problems"]
    assert any(p["message"].startswith("body.dag.nodes.0.zzz: unknown field 'zzz' (allowed: id, kind,") for p in far)
