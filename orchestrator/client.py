"""A small synchronous REST client for the CLI and scripts (SPEC section 3, client CLI)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx


class ClientError(Exception):
    """An API problem (problem+json) or a connection failure, with a stable code."""

    def __init__(self, status: int, code: str, detail: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body or {}


def default_server() -> str:
    if os.environ.get("ORRERY_URL"):
        return os.environ["ORRERY_URL"]
    host = os.environ.get("ORRERY_HOST", "127.0.0.1")
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{host}:{os.environ.get('ORRERY_PORT', '8765')}"


def server_url(server: str) -> str:
    """`--server` as the agent takes it: a bare `host:port` is `http://host:port`, and a ws(s)
    URL (or one ending in `/v1/agent`, as given to an agent) names the same server over http(s)."""
    parts = urlsplit(server if "://" in server else f"http://{server}")
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/").removesuffix("/v1/agent")
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def default_api_key(data_dir: Path | None = None) -> str | None:
    if os.environ.get("ORRERY_API_KEY"):
        return os.environ["ORRERY_API_KEY"]
    base = data_dir or Path(os.environ.get("ORRERY_DATA_DIR", ".orrery"))
    path = base / "admin.key"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


class Client:
    def __init__(self, server: str | None = None, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.server = server_url(server or default_server())
        self.api_key = api_key or default_api_key()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._http = httpx.Client(base_url=self.server, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        if resp.status_code >= 400:
            raise self._problem(resp)
        try:
            return resp.json() if resp.content else None
        except ValueError:
            raise ClientError(
                resp.status_code, "bad_response", f"{self.server} answered {method} {path} with something not JSON"
            ) from None

    def _unreachable(self, exc: httpx.HTTPError) -> ClientError:
        if isinstance(exc, httpx.ConnectError) and any(
            r in str(exc) for r in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")
        ):  # OpenSSL's words for an answer to a TLS hello that was not TLS
            detail = (
                f"the orchestrator at {self.server} answered, but not with TLS: it serves plain http. "
                "Use an http:// URL, or start the server with --tls-cert and --tls-key"
            )
        elif isinstance(exc, httpx.ConnectError):
            detail = f"cannot reach the orchestrator at {self.server}: is `orrery serve` running?"
        elif isinstance(exc, httpx.TimeoutException):
            detail = f"the orchestrator at {self.server} did not answer in time"
        else:
            detail = f"cannot talk to the orchestrator at {self.server}: {exc or type(exc).__name__}"
        return ClientError(0, "unreachable", detail)

    def _problem(self, resp: httpx.Response) -> ClientError:
        problem = _problem(resp)
        if problem.status == 401 and not self.api_key:
            problem.detail = (
                "no API key: pass --api-key, set ORRERY_API_KEY, "
                "or set ORRERY_DATA_DIR to the server's data directory (it holds admin.key)"
            )
        return problem

    # ------------------------------------------------------------------ resources

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        result: dict[str, Any] = self.request("POST", "/v1/tasks", json=body, headers=headers)
        return result

    def task(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/tasks/{task_id}")
        return result

    def tasks(self, state: str | None = None, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        if cursor:
            params["cursor"] = cursor
        result: dict[str, Any] = self.request("GET", "/v1/tasks", params=params)
        return result

    def cancel(self, task_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/v1/tasks/{task_id}/cancel")
        return result

    def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """A dry run of a submission: placement, problems, warnings; never creates a task."""
        result: dict[str, Any] = self.request("POST", "/v1/tasks", params={"dry_run": "true"}, json=body)
        return result

    def rerun(self, task_id: str, from_node: str | None = None) -> dict[str, Any]:
        body = {"from_node": from_node} if from_node else {}
        result: dict[str, Any] = self.request("POST", f"/v1/tasks/{task_id}/rerun", json=body)
        return result

    def devices(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/v1/devices")["items"]
        return result

    def device(self, device_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/devices/{device_id}")
        return result

    def enroll(self, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", "/v1/devices", json={"name": name, "labels": labels or {}})
        return result

    def device_action(self, device_id: str, action: str) -> dict[str, Any]:
        if action == "revoke":
            result: dict[str, Any] = self.request("DELETE", f"/v1/devices/{device_id}")
        else:
            result = self.request("POST", f"/v1/devices/{device_id}/{action}")
        return result

    def stop_device(self, device_id: str, reason: str = "") -> dict[str, Any]:
        """Emergency stop (see `POST /v1/devices/{id}/stop`)."""
        result: dict[str, Any] = self.request("POST", f"/v1/devices/{device_id}/stop", json={"reason": reason})
        return result

    def label(self, device_id: str, labels: dict[str, str | None]) -> dict[str, Any]:
        """Merge labels into a device's; a None value deletes that label."""
        result: dict[str, Any] = self.request("PATCH", f"/v1/devices/{device_id}", json={"labels": labels})
        return result

    def rotate_token(self, device_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", f"/v1/devices/{device_id}/token")
        return result

    def device_history(self, device_id: str, limit: int = 50) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/devices/{device_id}/history", params={"limit": limit})
        return result

    def create_api_key(self, role: str, name: str = "") -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", "/v1/api-keys", json={"role": role, "name": name})
        return result

    def revoke_api_key(self, key_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("DELETE", f"/v1/api-keys/{key_id}")
        return result

    def api_keys(self, revoked: bool = False) -> list[dict[str, Any]]:
        """Every API key (never its secret), page after page."""
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 500, "revoked": revoked, **({"cursor": cursor} if cursor else {})}
            page = self.request("GET", "/v1/api-keys", params=params)
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return items

    def approvals(self, state: str | None = "pending", limit: int = 100) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        result: dict[str, Any] = self.request("GET", "/v1/approvals", params=params)
        return result

    def decide(self, approval_id: str, decision: str, reason: str = "") -> dict[str, Any]:
        """`decision`: approve or deny."""
        result: dict[str, Any] = self.request(
            "POST", f"/v1/approvals/{approval_id}/{decision}", json={"reason": reason}
        )
        return result

    def create_schedule(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", "/v1/schedules", json=body)
        return result

    def schedules(self, limit: int = 500) -> list[dict[str, Any]]:
        """Every schedule, by name (page after page)."""
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
            page = self.request("GET", "/v1/schedules", params=params)
            items += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return items

    def schedule(self, ref: str, next_runs: int = 5) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/v1/schedules/{ref}", params={"next": next_runs})
        return result

    def schedule_ticks(self, ref: str, limit: int = 50, outcome: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, **({"outcome": outcome} if outcome else {})}
        result: dict[str, Any] = self.request("GET", f"/v1/schedules/{ref}/ticks", params=params)
        return result

    def schedule_action(self, ref: str, action: str) -> dict[str, Any]:
        """`pause`, `resume` or `delete` a schedule."""
        if action == "delete":
            result: dict[str, Any] = self.request("DELETE", f"/v1/schedules/{ref}")
        else:
            result = self.request("POST", f"/v1/schedules/{ref}/{action}")
        return result

    # ---- artifacts

    def artifacts(self, task_id: str, history: bool = False, limit: int = 500) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit, "history": str(history).lower()}
        result: dict[str, Any] = self.request("GET", f"/v1/tasks/{task_id}/artifacts", params=params)
        return result

    def artifact(self, task_id: str, name: str, version: int | None = None) -> dict[str, Any]:
        params = {"version": version} if version is not None else {}
        result: dict[str, Any] = self.request("GET", f"/v1/tasks/{task_id}/artifacts/{name}", params=params)
        return result

    @contextlib.contextmanager
    def stream(self, path: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
        """A streamed GET of `path` (a problem answer raises `ClientError`)."""
        with self._http.stream("GET", path, headers=headers, timeout=httpx.Timeout(30, read=300)) as resp:
            if resp.status_code >= 400:
                resp.read()
                raise self._problem(resp)
            yield resp

    def events(self, task_id: str, after: int = 0) -> Iterator[tuple[int, str, dict[str, Any]]]:
        """Server-sent events of a task: (id, type, data), until the task ends."""
        params = {"after": after}
        try:
            with self._http.stream("GET", f"/v1/tasks/{task_id}/events", params=params, timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise self._problem(resp)
                event_id, event_type, data = 0, "", ""
                for line in resp.iter_lines():
                    if line.startswith("id:"):
                        event_id = int(line[3:].strip())
                    elif line.startswith("event:"):
                        event_type = line[6:].strip()
                    elif line.startswith("data:"):
                        data += line[5:].strip()
                    elif line == "" and event_type == "error":  # the server ends the stream and says why
                        body = json.loads(data or "{}")
                        raise ClientError(
                            401, str(body.get("code", "stream_closed")), str(body.get("detail", "")), body
                        )
                    elif line == "" and event_type:
                        yield event_id, event_type, json.loads(data or "{}")
                        event_type, data = "", ""
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None


def _problem(resp: httpx.Response) -> ClientError:
    try:
        body = resp.json()
    except ValueError:
        body = {}
    return ClientError(
        resp.status_code, str(body.get("code", "http_error")), str(body.get("detail", resp.text[:200])), body
    )
