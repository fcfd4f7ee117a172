"""Problems become typed errors carrying the stable code; no answer at all is `Unavailable`
with its own code, never a transport exception."""

from __future__ import annotations

import asyncio
import json

import pytest

from orrery import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    OrreryError,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
    Unavailable,
)
from orrery.sdk.calls import problem
from tests.support import free_port


def problem_json(status: int, code: str, **extra: object) -> bytes:
    return json.dumps(
        {"type": "t", "title": "t", "status": status, "detail": f"{code} said", "code": code, **extra}
    ).encode()


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (400, "bad_request", InvalidRequest),
        (401, "unauthorized", Unauthorized),
        (403, "approval_local_only", Forbidden),
        (404, "not_found", NotFound),
        (409, "ambiguous_id", Conflict),
        (413, "payload_too_large", PayloadTooLarge),
        (422, "dag_cycle", InvalidRequest),
        (429, "rate_limited", RateLimited),
        (503, "cluster_unavailable", Unavailable),
        (500, "internal_error", ServerError),
    ],
)
def test_a_problem_becomes_the_error_of_its_kind_with_its_code(status: int, code: str, kind: type[OrreryError]) -> None:
    error = problem(status, problem_json(status, code, problems=[{"code": code, "message": "m"}]))
    assert type(error) is kind
    assert (error.status, error.code, error.detail) == (status, code, f"{code} said")
    assert error.problems == [{"code": code, "message": "m"}]


def test_an_answer_that_is_no_problem_is_named_by_its_status() -> None:
    error = problem(404, b"<html>not here</html>")
    assert isinstance(error, NotFound) and error.code == "not_found"
    assert "not here" in error.detail


def test_an_unreachable_server_is_unavailable_with_its_own_code_and_no_transport_exception() -> None:
    server = f"http://127.0.0.1:{free_port()}"
    with Client(server, "key") as client, pytest.raises(Unavailable) as raised:
        client.task("anything")
    error = raised.value
    assert (error.status, error.code) == (0, "unreachable")
    assert "is `orrery serve` running?" in error.detail
    assert error.__cause__ is None and error.__suppress_context__


def test_an_unreachable_server_is_unavailable_for_the_async_client_and_its_streams_too() -> None:
    async def run() -> None:
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", "key") as client:
            with pytest.raises(Unavailable) as raised:
                await client.devices()
            assert raised.value.code == "unreachable"
            with pytest.raises(Unavailable) as streamed:
                async for _ in client.events("task"):
                    pass
            assert streamed.value.code == "unreachable"

    asyncio.run(run())
