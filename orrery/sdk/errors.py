"""The SDK's one error tree: every problem the server answers (RFC 9457 problem+json, SPEC
section 3) and every failure to reach it is an `OrreryError` with the stable `code`; the class
says the kind, so callers catch `NotFound` or `Conflict` and read `.code` for the exact reason.
A raw httpx2 exception never leaves the SDK."""

from __future__ import annotations

from typing import Any


class OrreryError(Exception):
    """An error with a stable `code` (the problem's, or the SDK's own for a failure with no
    answer), the HTTP `status` (0 when no answer came) and a `detail` written for the reader."""

    def __init__(self, status: int, code: str, detail: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.body: dict[str, Any] = body or {}

    @property
    def problems(self) -> list[dict[str, Any]]:
        """Each thing wrong (a refused submission lists every one, with `code` and `message`)."""
        found = self.body.get("problems")
        return [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []


class InvalidRequest(OrreryError):
    """400 or 422: the request (a body, a parameter, a DAG) is not valid; `problems` says why."""


class DagError(InvalidRequest):
    """A DAG the builder refuses before sending it (duplicate ids, unknown nodes, a cycle,
    references to nodes that are not ancestors): the same codes the server would answer with."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        first = problems[0]
        super().__init__(0, str(first["code"]), str(first["message"]), {"problems": problems})


class Unauthorized(OrreryError):
    """401: no API key, an unknown or revoked one; also a stream closed because its key was revoked."""


class Forbidden(OrreryError):
    """403: the key's role may not do this (or only a device's owner may)."""


class NotFound(OrreryError):
    """404: nothing with that id, id prefix or name."""


class Conflict(OrreryError):
    """409: the resource's state does not allow it, an ambiguous id prefix, or an Idempotency-Key
    used before with another body."""


class PayloadTooLarge(OrreryError):
    """413: the request body is over the server's limit."""


class RateLimited(OrreryError):
    """429: too many failed authentications from this address; wait a minute."""


class Unavailable(OrreryError):
    """503 (the cluster or its database cannot answer now: retry), or no answer at all: the
    server cannot be reached, or an event stream could not be resumed (code `unreachable`)."""


class ServerError(OrreryError):
    """Any other status (a 500 is the server's bug: its log says more), or an answer that is not
    the API's: not JSON, or not the shape asked for (code `bad_response`)."""


class WaitTimeout(OrreryError):
    """`wait` gave up after its timeout; the task goes on (code `wait_timeout`)."""


_KINDS: dict[int, type[OrreryError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidRequest,
    429: RateLimited,
    503: Unavailable,
}
# The code a status means when the answer is not a problem (a proxy's own error page, say).
_STATUS_WORDS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "payload_too_large",
    422: "validation_error",
    429: "rate_limited",
    503: "unavailable",
}


def from_problem(status: int, body: Any, text: str = "") -> OrreryError:
    """The error a problem answer means: its class by status, its `code` and `detail` as sent."""
    problem: dict[str, Any] = body if isinstance(body, dict) else {}
    code = problem.get("code")
    detail = problem.get("detail")
    kind = _KINDS.get(status, ServerError)
    return kind(
        status,
        str(code) if code else _STATUS_WORDS.get(status, "bad_response"),
        str(detail) if detail is not None else (text[:200] or f"the server answered {status}"),
        problem,
    )
