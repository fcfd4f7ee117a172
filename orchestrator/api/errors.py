"""The one place errors become HTTP problems (RFC 9457, `application/problem+json`)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from orchestrator.api.schemas import LABEL_KEY_PATTERN, NUL_MESSAGE
from orchestrator.artifacts.errors import ArtifactError
from orchestrator.cluster import ClusterUnavailable
from orchestrator.domain.model import DEVICE_NAME_PATTERN, DEVICE_NAME_WORDS, SLUG_PATTERN, unknown_field
from orchestrator.domain.problems import DomainError
from orchestrator.store.repo import BadCursor

log = logging.getLogger("orrery.api")

PROBLEM = "application/problem+json"

_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    408: "Request timeout",
    409: "Conflict",
    410: "Gone",
    413: "Payload too large",
    415: "Unsupported media type",
    416: "Range not satisfiable",
    422: "Unprocessable request",
    429: "Too many requests",
    431: "Request header fields too large",
    500: "Internal error",
    503: "Service unavailable",
    504: "Gateway timeout",
}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "rate_limited",
    503: "unavailable",
}


_UNSTORABLE_TEXT = {"22021", "22P05"}  # Postgres SQLSTATEs for text it cannot store


class ApiError(Exception):
    """An error with a stable `code`, raised anywhere in the API layer."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra


def problem_body(status: int, code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": f"https://orrery.dev/problems/{code}",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
        **extra,
    }


class Problem(BaseModel):
    """RFC 9457 problem details, with Orrery's stable `code`."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    problems: list[dict[str, Any]] | None = None


def problems(*statuses: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the problem+json errors a route may answer with; a
    `described` entry (`s422="..."`) says what that status means on this route."""
    schema = Problem.model_json_schema()
    wanted = {*statuses, *(int(k.removeprefix("s")) for k in described)}
    return {
        s: {
            "description": described.get(f"s{s}", _DESCRIPTIONS.get(s, _TITLES.get(s, "Error"))),
            "content": {PROBLEM: {"schema": schema}},
        }
        for s in sorted(wanted)
    }


# What each status means on every route (a route's own `responses=` may say more).
_DESCRIPTIONS = {
    400: "`bad_request`: a malformed request (e.g. a list `cursor` this server did not issue)",
    401: "`unauthorized`: no API key, or an unknown or revoked one (`WWW-Authenticate: Bearer`)",
    403: "`forbidden`: the key's role may not do this",
    404: "`not_found`: nothing with that id, id prefix or name",
    409: "`conflict` (the resource's state does not allow it) or `ambiguous_id` (with `candidates`)",
    413: "`payload_too_large`: the request body is over the server's limit",
    422: "`validation_error`: the body, a parameter or a header is not valid (`problems` lists each, with `loc`)",
    429: "`rate_limited`: too many failed authentications from this address; wait a minute",
    503: "`cluster_unavailable` (with `Retry-After`): no engine answered within the deadline; or "
    "`store_unavailable`: the database cannot be reached now (a restart)",
}

COMMON = problems(400, 401, 403, 413, 422, 429, 503)
LISTING = problems(s400="`bad_request`: the `cursor` is not one this server issued; start again without it")


def problem_response(status: int, code: str, detail: str, **extra: Any) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(problem_body(status, code, detail, **extra), status, media_type=PROBLEM, headers=headers)


def _count(req: Request, code: str) -> None:
    components = getattr(req.app.state, "components", None)
    if components is not None:
        components.engine.metrics.errors.labels(code).inc()


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(req: Request, exc: ApiError) -> JSONResponse:
        _count(req, exc.code)
        return problem_response(exc.status, exc.code, exc.detail, **exc.extra)

    @app.exception_handler(DomainError)
    async def _domain_error(req: Request, exc: DomainError) -> JSONResponse:
        _count(req, exc.code)
        return problem_response(
            exc.status, exc.code, exc.problems[0].message, problems=[p.as_dict() for p in exc.problems]
        )

    @app.exception_handler(ArtifactError)
    async def _artifact_error(req: Request, exc: ArtifactError) -> JSONResponse:
        _count(req, exc.code)  # uploads, downloads and links (orchestrator/artifacts/errors.py)
        return problem_response(exc.status, exc.code, exc.detail, **exc.extra)

    @app.exception_handler(BadCursor)
    async def _bad_cursor(req: Request, exc: BadCursor) -> JSONResponse:
        _count(req, "bad_request")  # every listing's `?cursor=` that the store cannot read
        return problem_response(400, "bad_request", str(exc))

    @app.exception_handler(ClusterUnavailable)
    async def _cluster(req: Request, exc: ClusterUnavailable) -> JSONResponse:
        # SPEC section 7: a cross-replica request ends within its deadline, with a clear answer.
        _count(req, "cluster_unavailable")
        response = problem_response(503, "cluster_unavailable", str(exc))
        response.headers["Retry-After"] = "5"
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, exc: RequestValidationError) -> JSONResponse:
        _count(req, "validation_error")
        problems = [
            {
                "code": "validation_error",
                "message": f"{'.'.join(str(p) for p in e.get('loc', ()))}: {_said(req, e)}",
                "loc": [str(p) for p in e.get("loc", ())],
            }
            for e in exc.errors()[:50]
        ]
        detail = str(problems[0]["message"]) if problems else "the request is not valid"
        return problem_response(422, "validation_error", detail, problems=problems)

    @app.exception_handler(DBAPIError)
    async def _unstorable(req: Request, exc: DBAPIError) -> JSONResponse:
        # The last resort behind the edge checks (schemas.NO_NUL, lookup.check_ref): Postgres
        # refusing a character it cannot store (22021 character_not_in_repertoire, 22P05
        # untranslatable_character: a NUL) is the client's text, so 422 and no stack trace.
        if store_unreachable(exc):
            return _store_away(req, exc)
        if getattr(exc.orig, "sqlstate", None) not in _UNSTORABLE_TEXT:
            raise exc  # any other database failure stays a logged 500 (the handler below)
        _count(req, "validation_error")
        log.warning(
            "refused %s %s: the database cannot store a character of it (%s)", req.method, req.url.path, exc.orig
        )
        return problem_response(
            422, "validation_error", "the request holds a character that cannot be stored (a NUL, U+0000); remove it"
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        _count(req, code)
        response = problem_response(exc.status_code, code, str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405 and (allowed := _allowed_methods(req)):
            response.headers["Allow"] = ", ".join(sorted(allowed))  # RFC 9110: every method of the path
        return response

    @app.exception_handler(Exception)
    async def _unexpected(req: Request, exc: Exception) -> JSONResponse:
        if store_unreachable(exc):
            return _store_away(req, exc)
        _count(req, "internal_error")
        log.exception("unhandled error on %s %s", req.method, req.url.path)
        return problem_response(500, "internal_error", "the server failed to handle this request; see its log")


# The patterns names are checked against, in words: a refused name is answered with which
# characters it may hold (as the CLI says it), never with the regular expression.
_PATTERN_WORDS = {
    DEVICE_NAME_PATTERN: DEVICE_NAME_WORDS,
    LABEL_KEY_PATTERN: "letters, digits, '_', '.', '/' and '-', starting with a letter or digit",
    SLUG_PATTERN: "letters, digits, '_' and '-', starting with a letter or digit (at most 64 characters)",
}


def _said(req: Request, error: Any) -> Any:
    """A request validation error's message; a key the body's model does not have names the
    nearest field (`unknown field 'placment'; did you mean 'placement'?`) at any depth."""
    loc = tuple(error.get("loc", ()))
    if error.get("type") == "string_pattern_mismatch":
        words = _PATTERN_WORDS.get(str((error.get("ctx") or {}).get("pattern")))
        given = str(error.get("input"))
        if "\x00" in given:  # said as other NULs are: the character, not the name rules
            return NUL_MESSAGE
        if words:
            return f"may hold only {words}; got {given[:100]!r}"
    if error.get("type") != "extra_forbidden" or loc[:1] != ("body",):
        return error.get("msg")
    body = getattr(req.scope.get("route"), "body_field", None)
    root = getattr(getattr(body, "field_info", None), "annotation", None)
    return (unknown_field(root, loc[1:]) if root is not None else None) or error.get("msg")


# Postgres's connection-exception class (08xxx) and an operator shutting it down or starting it
# (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now).
_STORE_AWAY_STATES = ("08", "57P01", "57P02", "57P03")


def store_unreachable(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says the database cannot be reached now: a restart, an
    outage. That is the server's trouble for a while, not the request's: 503, never a 500."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionError | TimeoutError):
            return True
        if isinstance(current, DBAPIError) and current.connection_invalidated:
            return True
        state = getattr(current, "sqlstate", None)
        if isinstance(state, str) and state.startswith(_STORE_AWAY_STATES):
            return True
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)
    return False


def _store_away(req: Request, exc: BaseException) -> JSONResponse:
    _count(req, "store_unavailable")
    log.warning("%s %s: the database cannot be reached now (%s)", req.method, req.url.path, type(exc).__name__)
    response = problem_response(
        503, "store_unavailable", "the orchestrator's database cannot be reached right now (a restart?); retry shortly"
    )
    response.headers["Retry-After"] = "5"
    return response


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(req: Request) -> set[str]:
    """The methods some route of the app takes at this request's path (Starlette's own 405 names
    only the first route that matches the path, e.g. `GET` for `/v1/devices/{id}` without `PATCH`
    and `DELETE`). Asks each route whose path matches (`BaseRoute.matches`, nested routers too)."""
    allowed: set[str] = set()
    for route in req.app.router.routes:
        if route.matches(req.scope)[0] is not Match.PARTIAL:
            continue  # another path, or a mount that answers every method itself
        allowed |= {m for m in _METHODS if route.matches({**req.scope, "method": m})[0] is Match.FULL}
    return allowed
