"""REST: invalid DAGs are refused with precise problems and nothing is stored; errors are problem+json."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import Fleet, shell


@pytest.fixture(scope="module")
def fleet_with_agent(shared_fleet: Fleet) -> Fleet:
    shared_fleet.agent("rest-agent", {"role": "any"})
    return shared_fleet


def post(fleet: Fleet, body: Any, **headers: str) -> Any:
    with fleet.server.client() as c:
        return c.post("/v1/tasks", json=body, headers=headers)


def task_count(fleet: Fleet) -> int:
    with fleet.server.client() as c:
        return len(c.get("/v1/tasks", params={"limit": 500}).json()["items"])


@pytest.mark.parametrize(
    ("dag", "code"),
    [
        (
            {
                "nodes": [{"id": "a", "commands": [shell(["ls"])]}, {"id": "b", "commands": [shell(["ls"])]}],
                "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}],
            },
            "dag_cycle",
        ),
        (
            {"nodes": [{"id": "a", "commands": [shell(["ls"])]}], "edges": [{"from": "a", "to": "ghost"}]},
            "unknown_node",
        ),
        ({"nodes": [{"id": "a", "commands": [{"tool": "shell.rum", "arguments": {}}]}]}, "unknown_tool"),
        (
            {"nodes": [{"id": "a", "placement": {"labels": {"role": "gpu"}}, "commands": [shell(["ls"])]}]},
            "no_capable_device",
        ),
        ({"nodes": []}, "validation_error"),
        ({"nodes": [{"id": "../etc", "commands": [shell(["ls"])]}]}, "validation_error"),
    ],
)
def test_an_invalid_dag_is_422_problem_json_with_its_code_and_nothing_is_stored(
    fleet_with_agent: Fleet, dag: dict[str, Any], code: str
) -> None:
    before = task_count(fleet_with_agent)
    r = post(fleet_with_agent, {"dag": dag})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["code"] == code
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    assert task_count(fleet_with_agent) == before


def test_the_cycle_problem_names_the_path(fleet_with_agent: Fleet) -> None:
    dag = {
        "nodes": [{"id": n, "commands": [shell(["ls"])]} for n in "xyz"],
        "edges": [{"from": "x", "to": "y"}, {"from": "y", "to": "z"}, {"from": "z", "to": "x"}],
    }
    body = post(fleet_with_agent, {"dag": dag}).json()
    assert body["problems"][0]["cycle"] == ["x", "y", "z"]


def test_the_unknown_tool_problem_suggests_near_names(fleet_with_agent: Fleet) -> None:
    body = post(fleet_with_agent, {"dag": {"nodes": [{"id": "a", "commands": [{"tool": "files.reed"}]}]}}).json()
    assert "files.read" in body["problems"][0]["nearest"]


def test_a_request_without_an_llm_is_planner_unavailable(fleet_with_agent: Fleet) -> None:
    r = post(fleet_with_agent, {"request": "do something"})
    assert r.status_code == 422 and r.json()["code"] == "planner_unavailable"


def test_both_or_neither_of_request_and_dag_is_a_validation_error(fleet_with_agent: Fleet) -> None:
    assert post(fleet_with_agent, {}).json()["code"] == "validation_error"


def test_the_server_takes_request_or_dag_exactly_as_its_published_schema_says(fleet_with_agent: Fleet) -> None:
    """The body's oneOf is about which key is present, so a key given as null counts as given:
    schemathesis found {"request": ..., "dag": null} accepted, which the schema refuses. Each body
    here is refused with validation_error if and only if the schema refuses it."""
    import jsonschema

    with fleet_with_agent.server.client() as c:
        spec = c.get("/openapi.json").json()
        schema = {"$ref": "#/components/schemas/TaskCreate", "components": spec["components"]}
        dag = {"nodes": [{"id": "a", "commands": [{"tool": "system.echo", "arguments": {"text": "x"}}]}]}
        bodies: list[dict[str, Any]] = [
            {},
            {"dag": dag},
            {"request": "collect the logs"},
            {"request": "collect the logs", "dag": dag},
            {"request": "collect the logs", "dag": None},
            {"request": None, "dag": dag},
            {"dag": None},
            {"request": None},
        ]
        for body in bodies:
            schema_ok = jsonschema.Draft202012Validator(schema).is_valid(body)
            r = c.post("/v1/tasks", params={"dry_run": "true"}, json=body)
            refused = r.status_code == 422 and r.json()["code"] == "validation_error"
            assert refused == (not schema_ok), (body, schema_ok, r.status_code, r.text)
    assert schema_ok is False and task_count(fleet_with_agent) == 0  # dry runs: nothing was created


def test_no_key_is_401_and_an_unknown_task_is_404(fleet_with_agent: Fleet) -> None:
    import httpx

    r = httpx.get(f"{fleet_with_agent.server.url}/v1/tasks")
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"
    with fleet_with_agent.server.client() as c:
        r = c.get("/v1/tasks/task_nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_malformed_json_body_is_a_422_not_a_500(fleet_with_agent: Fleet) -> None:
    with fleet_with_agent.server.client() as c:
        r = c.post("/v1/tasks", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["code"] == "validation_error"


def test_an_oversize_body_is_413(fleet_with_agent: Fleet) -> None:
    with fleet_with_agent.server.client() as c:
        r = c.post("/v1/tasks", content=b"x" * (3 * 1024 * 1024), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"


def test_tasks_list_pages_with_a_cursor_newest_first(fleet_with_agent: Fleet) -> None:
    ids = [
        post(fleet_with_agent, {"dag": {"nodes": [{"id": "a", "commands": [shell(["true"])]}]}}).json()["id"]
        for _ in range(3)
    ]
    with fleet_with_agent.server.client() as c:
        first = c.get("/v1/tasks", params={"limit": 2}).json()
        second = c.get("/v1/tasks", params={"limit": 2, "cursor": first["next_cursor"]}).json()
        bad = c.get("/v1/tasks", params={"cursor": "garbage"})
    assert [t["id"] for t in first["items"]] == ids[::-1][:2]
    assert second["items"][0]["id"] == ids[0]
    assert bad.status_code == 400 and bad.json()["code"] == "bad_request"
