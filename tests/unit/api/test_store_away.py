"""A database that cannot be reached now (a Postgres restart, an outage) is the server's trouble for
a while, not the request's: the API answers 503 `store_unavailable` with Retry-After, never a 500
with a stack trace in the log for every request (docs/replicas.md: Postgres restarted)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import DBAPIError, OperationalError

from orchestrator.api.errors import install, store_unreachable


class _PgError(Exception):
    """What asyncpg raises, as far as the handler looks: a Postgres error with its SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def _refused() -> None:
    raise ConnectionRefusedError(111, "Connect call failed")


def _wrapped_refusal() -> None:
    try:
        _refused()
    except ConnectionRefusedError as exc:
        raise RuntimeError("the API key check could not read the store") from exc


def _starting() -> None:
    raise DBAPIError("SELECT 1", {}, _PgError("57P03"))


def _gone() -> None:
    raise OperationalError("SELECT 1", {}, _PgError("08006"))


def _not_stored() -> None:
    raise DBAPIError("INSERT", {}, _PgError("23505"))  # a unique violation: a real bug, a 500


def _app(fail: Callable[[], None]) -> TestClient:
    app = FastAPI()
    install(app)

    @app.get("/x")
    async def route() -> dict[str, str]:
        fail()
        return {}

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("fail", [_refused, _wrapped_refusal, _starting, _gone], ids=lambda f: f.__name__)
def test_a_database_out_of_reach_answers_503_store_unavailable(fail: Callable[[], None]) -> None:
    r = _app(fail).get("/x")
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "store_unavailable" and r.headers["Retry-After"] == "5"


def test_any_other_database_failure_stays_an_internal_error() -> None:
    r = _app(_not_stored).get("/x")
    assert r.status_code == 500 and r.json()["code"] == "internal_error"
    assert not store_unreachable(ValueError("no"))
