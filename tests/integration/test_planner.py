"""The planner against a fake OpenAI-compatible server (real HTTP, the real `openai` SDK) and real agents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakellm import FakeLLM, call, calls, plan, raw, say, status
from tests.support import Agent, Fleet, shell


@pytest.fixture(scope="module")
def module_llm() -> Iterator[FakeLLM]:
    fake = FakeLLM()
    yield fake
    fake.close()


@pytest.fixture
def llm(module_llm: FakeLLM) -> FakeLLM:
    """The module's fake model with nothing scripted and no request seen: each test's own."""
    module_llm.script.clear()
    module_llm.requests.clear()
    return module_llm


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, module_llm: FakeLLM) -> Iterator[Fleet]:
    """One server and its three agents for the module (planner-a, planner-b, agent-box): each test
    has tasks of its own, and the planner's inventory is the same for all of them. The budget test
    keeps a server of its own (its budget is a server setting)."""
    with Fleet(tmp_path_factory.mktemp("planner"), **module_llm.env()) as f:
        f.agent("planner-a", {"role": "a"})
        f.agent("planner-b", {"role": "b"})
        f.agent("agent-box")
        yield f


def agent_named(fleet: Fleet, name: str) -> Agent:
    return next(a for a in fleet.agents if a.name == name)


def request(fleet: Fleet, text: str) -> dict[str, Any]:
    return _post(fleet, {"request": text})


def _post(fleet: Fleet, body: dict[str, Any]) -> dict[str, Any]:
    with fleet.server.client() as c:
        r = c.post("/v1/tasks", json=body)
        assert r.status_code == 201, r.text
        result: dict[str, Any] = r.json()
        return result


def llm_log(fleet: Fleet, task_id: str) -> list[dict[str, Any]]:
    with fleet.server.client() as c:
        items: list[dict[str, Any]] = c.get(f"/v1/tasks/{task_id}/llm").json()["items"]
        return items


GOOD_PLAN = {
    "name": "hello-everywhere",
    "nodes": [
        {"id": "say", "placement": {"device": "planner-a"}, "commands": [shell(["echo", "planned"])]},
        {
            "id": "keep",
            "placement": {"device": "planner-b"},
            "commands": [
                {"tool": "files.write", "arguments": {"path": "kept.txt", "content": "${nodes.say.output.stdout}"}}
            ],
        },
    ],
    "edges": [{"from": "say", "to": "keep"}],
}


def test_a_valid_plan_runs_to_success_and_the_model_was_shown_the_inventory(lab: Fleet, llm: FakeLLM) -> None:
    f = lab
    b = agent_named(f, "planner-b")
    llm.add(plan(GOOD_PLAN))
    task = request(f, "say something on a and keep it on b")
    assert task["state"] == "planning"
    done = f.wait_task(task["id"])
    assert done["state"] == "succeeded", done
    assert done["name"] == "hello-everywhere"
    assert (b.workspace / "kept.txt").read_text() == "planned\n"
    shown = json.dumps(llm.requests[0]["messages"])
    assert "planner-a" in shown and "planner-b" in shown  # the inventory
    assert "shell.run" in shown and "argv" in shown and "files.write" in shown  # tools and their schemas
    assert "say something on a and keep it on b" in shown
    assert llm.requests[0]["response_format"]["type"] == "json_schema"
    log = llm_log(f, task["id"])
    assert log[0]["kind"] == "call" and log[0]["purpose"] == "plan"
    assert log[0]["prompt_tokens"] > 0 and log[0]["latency_ms"] > 0
    assert "sk-test-not-a-real-key" not in json.dumps(log)
    from tests.integration.test_cli import orrery

    shown_cli = orrery(f, "tasks", "show", task["id"], "--llm")
    assert shown_cli.returncode == 0 and "plan" in shown_cli.stdout and "tokens" in shown_cli.stdout


def test_an_invalid_plan_is_repaired_on_the_second_round(lab: Fleet, llm: FakeLLM) -> None:
    cyclic = {
        "nodes": [{"id": "x", "commands": [shell(["true"])]}, {"id": "y", "commands": [{"tool": "shell.rnu"}]}],
        "edges": [{"from": "x", "to": "y"}, {"from": "y", "to": "x"}],
    }
    f = lab
    llm.add(plan(cyclic), plan(GOOD_PLAN))
    done = f.wait_task(request(f, "do it")["id"])
    assert done["state"] == "succeeded"
    repair = json.dumps(llm.requests[1]["messages"][-1])
    assert "dag_cycle" in repair and "x -> y -> x" in repair


def test_a_planner_that_breaks_on_a_malformed_reply_fails_the_task_instead_of_leaving_it_planning(
    lab: Fleet, llm: FakeLLM
) -> None:
    """Issue 12: a planner job that failed with anything but an LLM error was swallowed, and the
    task stayed `planning` for ever. Here the "OpenAI-compatible" server answers 200 with a
    message that is a string, not an object, which the client library does not catch."""
    f = lab
    llm.add(raw({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"message": "?"}]}))
    done = f.wait_task(request(f, "anything")["id"], timeout=30)
    assert done["state"] == "failed", done
    assert done["error"]["code"] == "planning_failed"
    assert "unexpectedly" in done["error"]["message"]


def test_three_invalid_plans_fail_with_planning_failed(lab: Fleet, llm: FakeLLM) -> None:
    f = lab
    llm.add(
        say("I cannot do JSON"),
        plan({"nodes": []}),
        plan({"nodes": [{"id": "z", "commands": [{"tool": "nope.x"}]}]}),
    )
    done = f.wait_task(request(f, "impossible")["id"])
    assert done["state"] == "failed"
    assert done["error"]["code"] == "planning_failed"
    assert "unknown_tool" in done["error"]["message"]
    assert len(llm_log(f, done["id"])) == 3


def test_rate_limits_are_retried_and_the_call_succeeds(lab: Fleet, llm: FakeLLM) -> None:
    f = lab
    llm.add(status(429), status(503), plan(GOOD_PLAN))
    done = f.wait_task(request(f, "retry me")["id"])
    assert done["state"] == "succeeded"
    assert len(llm.requests) == 3


def agent_dag(instruction: str, max_steps: int = 6) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "helper",
                "kind": "agent",
                "placement": {"device": "agent-box"},
                "instruction": instruction,
                "max_steps": max_steps,
            }
        ]
    }


def test_an_agent_node_makes_two_tool_calls_then_finishes(lab: Fleet, llm: FakeLLM) -> None:
    f = lab
    box = agent_named(f, "agent-box")
    llm.add(
        call("files__write", path="notes.txt", content="agent was here"),
        calls(call("shell__run", argv=["cat", "notes.txt"]), call("system.info")),
        call("finish", answer="notes written"),
    )
    done = f.wait_task(_post(f, {"dag": agent_dag("write notes then read them")})["id"])
    node = done["nodes"][0]
    assert done["state"] == "succeeded", done
    assert node["output"] == "notes written"
    assert (box.workspace / "notes.txt").read_text() == "agent was here"
    tools = [t["function"]["name"] for t in llm.requests[0]["tools"]]
    assert "shell__run" in tools and "finish" in tools and "fail" in tools
    second = json.dumps(llm.requests[2]["messages"])
    assert "agent was here" in second  # the tool results were fed back
    attempt = node["attempts"][0]
    assert attempt["device_id"] == box.device_id and attempt["status"] == "succeeded"


def test_an_agent_repeating_a_failing_call_is_stopped(lab: Fleet, llm: FakeLLM) -> None:
    f = lab
    failing = call("files.read", path="missing.txt")
    llm.add(failing, failing, failing, failing)
    done = f.wait_task(_post(f, {"dag": agent_dag("read the missing file")})["id"])
    node = done["nodes"][0]
    assert node["state"] == "failed"
    assert node["error"]["code"] == "agent_stuck"
    assert len([r for r in llm.requests if r.get("tools")]) == 2


def test_model_mistakes_are_fed_back_not_crashed_on(lab: Fleet, llm: FakeLLM) -> None:
    f = lab
    llm.add(
        say("let me think"),
        call("Shell-Run", argv="not a list"),
        call("read_file", path="x.txt"),
        call("finish", answer="done"),
    )
    done = f.wait_task(_post(f, {"dag": agent_dag("anything")})["id"])
    assert done["state"] == "succeeded"
    fed_back = json.dumps(llm.requests[2]["messages"][-1])
    assert "invalid arguments" in fed_back and "argv" in fed_back
    assert "Plain text is not an action" in json.dumps(llm.requests[1]["messages"])


def test_a_failed_node_is_replanned_with_a_compensating_node(lab: Fleet, llm: FakeLLM) -> None:
    edits = {
        "reason": "write the fallback",
        "edits": [
            {
                "op": "add_node",
                "node": {
                    "id": "fallback",
                    "placement": {"device": "planner-a"},
                    "commands": [shell(["echo", "compensated"])],
                },
            },
            {"op": "add_edge", "edge": {"from": "break", "to": "fallback", "on": "failure"}},
            {"op": "remove_node", "id": "after"},
        ],
    }
    f = lab
    dag = {
        "nodes": [{"id": "break", "commands": [shell(["false"])]}, {"id": "after", "commands": [shell(["true"])]}],
        "edges": [{"from": "break", "to": "after"}],
    }
    llm.add(plan(edits))
    done = f.wait_task(_post(f, {"dag": dag, "replan": True})["id"])
    assert done["state"] == "succeeded", done
    states = {n["id"]: n["state"] for n in done["nodes"]}
    assert states == {"break": "failed", "fallback": "succeeded"}
    assert done["dag_version"] == 2
    shown = json.dumps(llm.requests[0]["messages"])
    assert "break" in shown and "failed" in shown and "tool_error" in shown
    log = llm_log(f, done["id"])
    assert any(i["kind"] == "dag_edit" and i["dag_edit"] == 2 and i["reason"] == "write the fallback" for i in log)


def test_an_edit_touching_a_finished_node_is_refused_and_rolled_back(lab: Fleet, llm: FakeLLM) -> None:
    bad = {
        "reason": "rewrite history",
        "edits": [
            {"op": "add_node", "node": {"id": "extra", "commands": [shell(["true"])]}},
            {"op": "update_node", "node": {"id": "first", "commands": [shell(["echo", "changed"])]}},
        ],
    }
    f = lab
    dag = {
        "nodes": [
            {"id": "first", "commands": [shell(["true"])]},
            {"id": "second", "commands": [shell(["false"])]},
            {"id": "third", "commands": [shell(["true"])]},
        ],
        "edges": [{"from": "first", "to": "second"}, {"from": "second", "to": "third"}],
    }
    llm.add(plan(bad))
    done = f.wait_task(_post(f, {"dag": dag, "replan": True})["id"])
    assert done["state"] == "failed"
    assert done["dag_version"] == 1
    assert [n["id"] for n in done["nodes"]] == ["first", "second", "third"]
    assert {n["id"]: n["state"] for n in done["nodes"]}["third"] == "skipped"
    with f.server.client() as c:
        text = c.get(f"/v1/tasks/{done['id']}/events").text
    refused = [
        json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and '"applied":false' in line
    ]
    assert refused and refused[0]["problems"][0]["code"] == "edit_refused"


def test_exceeding_the_llm_budget_fails_the_task(tmp_path: Path, llm: FakeLLM) -> None:
    with Fleet(tmp_path, **llm.env(llm_calls_per_task="2")) as f:
        f.agent("agent-box")
        llm.add(call("system.info"), call("system.info"), call("system.info"))
        done = f.wait_task(_post(f, {"dag": agent_dag("loop forever", max_steps=10)})["id"])
        node = done["nodes"][0]
        assert done["state"] == "failed"
        assert node["error"]["code"] == "llm_budget_exceeded"
        assert len(llm.requests) == 2
