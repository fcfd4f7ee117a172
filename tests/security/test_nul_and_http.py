"""Issue 14, items 4 and 10: a NUL (U+0000) anywhere a client can put text, on SQLite and on
Postgres (whose driver cannot store or even compare such text: it answered 500 and reset the
connection), 405 answers that name every method of the path, and an OpenAPI document that says
what the API answers. Real servers (and a real Postgres), real agents."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from orchestrator.api import errors
from tests.services import fresh_database
from tests.support import Fleet

ECHO = {"tool": "shell.run", "arguments": {"argv": ["echo", "hi"]}}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One server per backend, with one agent (so `shell.run` is a tool of the fleet)."""
    tmp = tmp_path_factory.mktemp(f"nul-{request.param}")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":  # named, so ORRERY_TEST_BACKEND=postgres leaves it alone
            database = f"sqlite+aiosqlite:///{tmp}/orrery.db"
        else:
            database = stack.enter_context(fresh_database(request.getfixturevalue("postgres_url")))
        f = stack.enter_context(Fleet(tmp, database_url=database))
        f.agent("nul-dev")
        yield f


def _problem(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = r.json()
    assert body["code"] == code, body
    return body


def _finished_task(f: Fleet) -> dict[str, Any]:
    task = f.submit({"nodes": [{"id": "a", "commands": [ECHO]}]}, name="nul-finished")
    return f.wait_task(task["id"])


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/tasks", {"name": "x\u0000y", "dag": {"nodes": [{"id": "a", "commands": [ECHO]}]}}, "name"),
        ("POST", "/v1/tasks", {"request": "list files\u0000"}, "request"),
        (
            "POST",
            "/v1/tasks",
            {"labels": {"team": "a\u0000"}, "dag": {"nodes": [{"id": "a", "commands": [ECHO]}]}},
            "team",
        ),
        (
            "POST",
            "/v1/tasks",
            {"labels": {"te\u0000am": "a"}, "dag": {"nodes": [{"id": "a", "commands": [ECHO]}]}},
            "labels",
        ),
        ("POST", "/v1/api-keys", {"role": "viewer", "name": "ci\u0000bot"}, "name"),
        ("POST", "/v1/devices", {"name": "nul-x\u0000"}, "name"),
        ("POST", "/v1/devices", {"name": "nul-y", "labels": {"site": "lab\u0000"}}, "site"),
        ("PATCH", "/v1/devices/nul-dev", {"labels": {"site": "lab\u0000"}}, "site"),
        ("POST", "/v1/tasks/nul-finished/rerun", {"from_node": "a\u0000"}, "from_node"),
    ],
)
def test_a_nul_in_body_text_is_refused_with_422_naming_the_field(
    fleet: Fleet, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    if "rerun" in path:
        _finished_task(fleet)
    with fleet.server.client() as c:
        problem = _problem(c.request(method, path, json=body), 422, "validation_error")
        assert any(field in p["loc"] for p in problem["problems"]), problem
        assert "NUL" in problem["detail"] or "pattern" in problem["detail"], problem
        assert c.get("/v1/tasks").status_code == 200  # the same connection still works
    if method == "PATCH":
        assert "site" not in fleet.device("nul-dev")["labels"]
    assert "Traceback" not in fleet.server.log()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/tasks/task%00"),
        ("GET", "/v1/tasks/ab%00cd"),
        ("GET", "/v1/tasks/nul-finished%00/events"),
        ("GET", "/v1/tasks/abcd%00/llm"),
        ("POST", "/v1/tasks/abcd%00/cancel"),
        ("POST", "/v1/tasks/abcd%00/rerun"),
        ("GET", "/v1/devices/nul-dev%00"),
        ("GET", "/v1/devices/ab%00cd/history"),
        ("GET", "/v1/devices/ab%00cd/attempts"),
        ("PATCH", "/v1/devices/dev_%00"),
        ("POST", "/v1/devices/%00%00%00%00/drain"),
        ("DELETE", "/v1/devices/ab%00cd"),
        ("DELETE", "/v1/api-keys/key_%00"),
    ],
)
def test_a_nul_in_a_path_id_is_404_and_never_reaches_the_store(fleet: Fleet, method: str, path: str) -> None:
    with fleet.server.client() as c:
        body = {"labels": {}} if method == "PATCH" else None
        problem = _problem(c.request(method, path, json=body), 404, "not_found")
        assert "NUL" in problem["detail"], problem
        assert c.get("/v1/devices/nul-dev").status_code == 200  # no reset connection
    assert "Traceback" not in fleet.server.log()


def test_a_nul_in_a_list_cursor_is_400_bad_request(fleet: Fleet) -> None:
    cursor = base64.urlsafe_b64encode(json.dumps(["2026-01-01T00:00:00+00:00", "task_\u0000"]).encode()).decode()
    with fleet.server.client() as c:
        for path in ("/v1/tasks", "/v1/devices/nul-dev/attempts", "/v1/devices/nul-dev/history"):
            _problem(c.get(path, params={"cursor": cursor.rstrip("=")}), 400, "bad_request")
    assert "Traceback" not in fleet.server.log()


def test_a_nul_in_command_arguments_is_invalid_arguments_with_the_field(fleet: Fleet) -> None:
    dag = {"nodes": [{"id": "a", "commands": [{"tool": "shell.run", "arguments": {"argv": ["rm\u0000x", "f"]}}]}]}
    with fleet.server.client() as c:
        problem = _problem(c.post("/v1/tasks", json={"dag": dag}), 422, "invalid_arguments")
        first = problem["problems"][0]
        assert (first["node_id"], first["command"], first["tool"], first["field"]) == ("a", 0, "shell.run", "argv.0")
        # A dry run reports the same problem (200, not valid) and creates nothing.
        r = c.post("/v1/tasks", params={"dry_run": "true"}, json={"dag": dag})
        assert r.status_code == 200, r.text
        assert r.json()["valid"] is False
        assert r.json()["problems"][0]["field"] == "argv.0"
        # Elsewhere in the DAG: validation_error with the path of the field.
        agent = {"nodes": [{"id": "b", "commands": [ECHO], "placement": {"labels": {"site": "\u0000"}}}]}
        problem = _problem(c.post("/v1/tasks", json={"dag": agent}), 422, "validation_error")
        assert problem["problems"][0]["field"] == "dag.nodes.0.placement.labels.site"
        names = [t["name"] for t in c.get("/v1/tasks", params={"limit": 500}).json()["items"]]
    assert all("\u0000" not in n for n in names)
    assert "Traceback" not in fleet.server.log()


def test_postgres_refusing_a_character_is_a_422_problem_not_a_500(postgres_db: str) -> None:
    """The last resort behind the edge checks: the driver's own refusal (SQLSTATE 22021) from a
    real Postgres, through the API's error handlers, is a 422 problem and no stack trace."""
    engine = create_async_engine(postgres_db)
    app = FastAPI()
    errors.install(app)

    @app.get("/echo")
    async def echo(value: str) -> dict[str, Any]:
        async with engine.connect() as conn:
            return {"value": (await conn.execute(text("SELECT CAST(:v AS text)"), {"v": value})).scalar_one()}

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)  # re-raises what the handlers did not handle
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            assert (await c.get("/echo", params={"value": "ok"})).json() == {"value": "ok"}
            _problem(await c.get("/echo", params={"value": "a\u0000b"}), 422, "validation_error")
            assert (await c.get("/echo", params={"value": "still ok"})).status_code == 200
        await engine.dispose()

    asyncio.run(run())


# ---------------------------------------------------------------- 405 and the OpenAPI document


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("http")) as f:
        yield f


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/tasks", "GET, POST"),
        ("DELETE", "/v1/tasks", "GET, POST"),
        ("PUT", "/v1/devices/some-device", "DELETE, GET, PATCH"),
        ("POST", "/v1/devices/some-device", "DELETE, GET, PATCH"),
        ("GET", "/v1/devices/some-device/drain", "POST"),
        ("PATCH", "/v1/api-keys/me", "DELETE, GET"),
        ("POST", "/healthz", "GET"),
        ("DELETE", "/v1/tasks/some-task/events", "GET"),
    ],
)
def test_a_405_names_every_method_the_path_takes(plain: Fleet, method: str, path: str, allow: str) -> None:
    with plain.server.client() as c:
        r = c.request(method, path)
        _problem(r, 405, "method_not_allowed")
        assert r.headers["allow"] == allow


def test_the_openapi_document_describes_the_event_stream_and_the_documented_problems(plain: Fleet) -> None:
    with plain.server.client() as c:
        doc = c.get("/openapi.json").json()
    paths = doc["paths"]
    stream = paths["/v1/tasks/{task_id}/events"]["get"]["responses"]
    assert list(stream["200"]["content"]) == ["text/event-stream"]
    for word in ("id:", "event:", "data:", "task.state", "node.state", "node.attempt", "dag.edited", "Last-Event-ID"):
        assert word in stream["200"]["description"], word
    assert stream["200"]["content"]["text/event-stream"]["example"].startswith("id: ")

    def problem(path: str, method: str, status: str) -> str:
        answer = paths[path][method]["responses"][status]
        assert list(answer["content"]) == ["application/problem+json"], (path, method, status)
        assert set(answer["content"]["application/problem+json"]["schema"]["required"]) >= {"code", "status", "detail"}
        description: str = answer["description"]
        return description

    for path in ("/v1/tasks", "/v1/devices/{device_id}/history", "/v1/devices/{device_id}/attempts"):
        assert "cursor" in problem(path, "get", "400")
    assert "Last-Event-ID" in problem("/v1/tasks/{task_id}/events", "get", "400")
    submit = problem("/v1/tasks", "post", "422")
    for code in ("planner_unavailable", "invalid_arguments", "validation_error", "no_capable_device"):
        assert code in submit
    assert "Idempotency-Key" in problem("/v1/tasks", "post", "409")
    for path, ops in paths.items():
        for method in ops:
            if path.startswith("/v1/"):
                for status in ("401", "403", "413", "429"):
                    assert problem(path, method, status).startswith("`"), (path, method, status)
    # A NUL is refused, and the schema says so (schemathesis sends it as a negative case).
    submit_body = doc["components"]["schemas"]["TaskCreate"]["properties"]
    assert submit_body["request"]["pattern"] == "^[^\\u0000]*$"
