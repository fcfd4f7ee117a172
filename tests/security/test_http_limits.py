"""Body and slow-client limits (issue 14, items 8 and 10): attacks on a real server over raw sockets.

Chunked bodies over the limit, Content-Lengths that lie, bodies that stall, request heads sent
one byte at a time or never finished, heads over the size limit, too many connections. Each is
answered with a problem (413, 408) or a close within a bound, and normal clients, slow but
complete ones and event streams are not hurt.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.server import HeadLimitsH11, server_options
from tests.support import Fleet, shell, wait_until

LIMIT = 4096  # ORRERY_MAX_REQUEST_BYTES
HEAD_S = 1.5  # ORRERY_HEADER_TIMEOUT_S
BODY_S = 2.0  # ORRERY_BODY_TIMEOUT_S
KEEPALIVE_S = 4.0  # ORRERY_KEEPALIVE_TIMEOUT_S
MAX_HEAD = 4096  # ORRERY_MAX_HEADER_BYTES
SLACK = 5.0  # on a loaded machine: how much later than its deadline a close may come


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(
        tmp_path_factory.mktemp("limits"),
        max_request_bytes=str(LIMIT),
        header_timeout_s=str(HEAD_S),
        body_timeout_s=str(BODY_S),
        keepalive_timeout_s=str(KEEPALIVE_S),
        max_header_bytes=str(MAX_HEAD),
    ) as f:
        yield f


class Raw:
    """One TCP connection to the server, written and read byte for byte."""

    def __init__(self, fleet: Fleet) -> None:
        self.sock = socket.create_connection(("127.0.0.1", fleet.server.port), timeout=10)
        self.buffer = b""
        self.key = fleet.server.api_key

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def head(self, method: str, path: str, *lines: str) -> bytes:
        return "\r\n".join(
            [f"{method} {path} HTTP/1.1", "Host: test", f"Authorization: Bearer {self.key}", *lines, "", ""]
        ).encode()

    def quiet_for(self, seconds: float) -> bool:
        """True when the server sends nothing and keeps the connection open for `seconds`."""
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return True
        self.buffer += data
        return False

    def closed_within(self, seconds: float) -> bool:
        """True when the server ends the connection within `seconds` (what it sent is kept)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
            if not data:
                return True
            self.buffer += data
        return False

    def response(self, timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
        """The next response: status, headers (lower-case names), body (Content-Length framed)."""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buffer:
            self._more(deadline)
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in header_lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._more(deadline)
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(status_line.split()[1]), headers, body

    def _more(self, deadline: float) -> None:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = self.sock.recv(65536)
        if not data:
            raise AssertionError(f"connection closed mid-response; got {self.buffer!r}")
        self.buffer += data


@pytest.fixture
def raw(fleet: Fleet) -> Iterator[Any]:
    opened: list[Raw] = []

    def connect() -> Raw:
        opened.append(Raw(fleet))
        return opened[-1]

    yield connect
    for conn in opened:
        conn.close()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def problem(status: int, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    assert headers["content-type"] == "application/problem+json", (status, headers, body)
    return status, json.loads(body)["code"]


# ---------------------------------------------------------------- bodies (item 8)


def body_routes(fleet: Fleet) -> list[tuple[str, str]]:
    with fleet.server.client() as c:
        paths = c.get("/openapi.json").json()["paths"]
    routes = [
        (method.upper(), path.replace("{", "").replace("}", ""))
        for path, ops in paths.items()
        for method, op in ops.items()
        if "requestBody" in op
    ]
    assert len(routes) >= 4, routes  # tasks, devices, api keys, ...: the OpenAPI document was read
    return routes


def test_a_chunked_body_over_the_limit_is_413_on_every_endpoint(fleet: Fleet) -> None:
    """Before: 400 "There was an error parsing the body" (FastAPI swallowed the middleware's error)."""
    routes = [*body_routes(fleet), ("POST", "/healthz"), ("PUT", "/no/such/route")]
    with fleet.server.client() as c:
        for method, path in routes:
            parts = iter([b"[" + b"1," * 1000, b"1," * 1500 + b"1]"])  # no Content-Length: chunked
            r = c.request(method, path, content=parts, headers={"content-type": "application/json"})
            assert r.status_code == 413, (method, path, r.status_code, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            assert r.json()["code"] == "payload_too_large", (method, path)


def test_a_chunked_body_is_answered_at_the_limit_and_the_connection_closed(raw: Any) -> None:
    """The body is not read to its end: 413 comes as soon as the limit is passed, then a close
    (before: a 400, and the server went on reading and discarding whatever the client sent)."""
    conn = raw()
    conn.send(conn.head("POST", "/v1/devices", "Content-Type: application/json", "Transfer-Encoding: chunked"))
    conn.send(chunk(b"x" * (LIMIT + 1)))  # no last chunk: the client is still "sending"
    assert problem(*conn.response()) == (413, "payload_too_large")
    assert conn.closed_within(SLACK)


def test_an_endless_chunked_body_is_cut_off(raw: Any) -> None:
    """A client that never stops sending is disconnected instead of read forever."""
    conn = raw()
    conn.send(conn.head("POST", "/v1/tasks", "Content-Type: application/json", "Transfer-Encoding: chunked"))
    piece = chunk(b"y" * 65536)
    deadline = time.monotonic() + 20
    conn.sock.settimeout(2)
    sent = 0
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        while time.monotonic() < deadline:
            conn.sock.sendall(piece)
            sent += len(piece)
    assert sent < 64 * 1024 * 1024, sent


def test_a_chunked_body_under_the_limit_is_served(fleet: Fleet) -> None:
    body = json.dumps({"name": "chunked-ok", "labels": {f"pad{i}": "p" * 150 for i in range(6)}}).encode()
    with fleet.server.client() as c:
        r = c.post("/v1/devices", content=iter([body[:500], body[500:]]), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "chunked-ok"


def test_a_content_length_over_the_limit_is_413_before_any_body(raw: Any) -> None:
    conn = raw()
    conn.send(conn.head("POST", "/v1/tasks", "Content-Type: application/json", "Content-Length: 1000000000"))
    assert problem(*conn.response()) == (413, "payload_too_large")
    assert conn.closed_within(SLACK)


def test_a_content_length_that_says_less_than_is_sent_frames_the_body(raw: Any) -> None:
    """The declared length is the body: the app sees `{}` only (422, no name), and the bytes after
    it are read as the next request, which is not one (400, close). Nothing more reaches the app."""
    conn = raw()
    conn.send(conn.head("POST", "/v1/devices", "Content-Type: application/json", "Content-Length: 2"))
    conn.send(b"{}" + b'"name": "smuggled"}\r\n\r\n')
    assert problem(*conn.response()) == (422, "validation_error")
    status, _, _ = conn.response()
    assert status == 400
    assert conn.closed_within(SLACK)


def test_a_body_that_stalls_gets_408_and_a_close(raw: Any) -> None:
    """Content-Length says 100, 10 bytes come, then nothing (before: the request waited forever)."""
    conn = raw()
    started = time.monotonic()
    conn.send(conn.head("POST", "/v1/devices", "Content-Type: application/json", "Content-Length: 100"))
    conn.send(b'{"name": "')
    status, headers, body = conn.response(timeout=BODY_S + SLACK)
    assert problem(status, headers, body) == (408, "request_timeout")
    assert time.monotonic() - started >= BODY_S - 0.1
    assert conn.closed_within(SLACK)


# ---------------------------------------------------------------- request heads (item 10)


def test_a_request_head_that_never_ends_gets_408_and_a_close(raw: Any) -> None:
    """Before: the connection stayed open as long as the client liked."""
    conn = raw()
    started = time.monotonic()
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: test\r\n")
    assert conn.closed_within(HEAD_S + SLACK)
    assert time.monotonic() - started >= HEAD_S - 0.1
    status, headers, body = conn.response()
    assert problem(status, headers, body) == (408, "request_timeout")


def test_a_head_sent_one_byte_at_a_time_is_cut_at_the_deadline(raw: Any) -> None:
    """Slowloris: each byte arriving does not move the deadline."""
    conn = raw()
    started = time.monotonic()
    conn.send(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    cut = False
    while time.monotonic() - started < HEAD_S + SLACK:
        try:
            conn.send(b"a")
        except (BrokenPipeError, ConnectionResetError):
            cut = True
            break
        if not conn.quiet_for(0.1):  # the pace of the attack, and a look for the server's answer
            cut = conn.closed_within(SLACK)
            break
    assert cut, "the server kept a dribbling request head open"
    assert time.monotonic() - started < HEAD_S + SLACK


def test_a_connection_that_sends_nothing_is_closed(raw: Any) -> None:
    conn = raw()
    assert conn.closed_within(HEAD_S + SLACK)
    assert conn.buffer == b""  # nothing was asked, so nothing is answered


def test_a_slow_but_complete_head_is_served_and_keep_alive_idles_are_not_cut(raw: Any) -> None:
    conn = raw()
    head = conn.head("GET", "/v1/devices")
    for i in range(3):  # in three parts, within the deadline
        conn.send(head[i * len(head) // 3 : (i + 1) * len(head) // 3])
        if i < 2:
            assert conn.quiet_for(0.3)
    assert conn.response()[0] == 200
    # Idle between requests longer than the head deadline, shorter than keep-alive: still open.
    assert conn.quiet_for(HEAD_S + 0.5)
    conn.send(head)
    assert conn.response()[0] == 200
    # Idle past keep-alive: closed.
    assert conn.closed_within(KEEPALIVE_S + SLACK)


def test_a_head_over_the_size_limit_is_refused_even_in_one_piece(raw: Any) -> None:
    """Before: uvicorn's h11 limit only counts a head still incomplete after a read, so a large
    head sent in one write was accepted."""
    conn = raw()
    conn.send(conn.head("GET", "/healthz", "X-Big: " + "b" * MAX_HEAD))
    status, headers, body = conn.response()
    assert problem(status, headers, body) == (431, "headers_too_large")
    assert json.loads(body)["title"] == "Request header fields too large"
    assert conn.closed_within(SLACK)
    dribbled = raw()
    dribbled.send(dribbled.head("GET", "/healthz", "X-Big: " + "b" * MAX_HEAD)[: MAX_HEAD + 100])
    assert problem(*dribbled.response()) == (431, "headers_too_large")
    ok = raw()
    ok.send(ok.head("GET", "/healthz", "X-Big: " + "b" * (MAX_HEAD // 2)))
    assert ok.response()[0] == 200


def test_an_event_stream_outlives_the_head_deadline(fleet: Fleet) -> None:
    """The deadline is for the request head only: a stream open far longer is not cut."""
    agent = fleet.agent("limits-sse")
    dag = {"nodes": [{"id": "nap", "placement": {"device": agent.device_id}, "commands": [shell(["sleep", "4"])]}]}
    task = fleet.submit(dag)
    started = time.monotonic()
    states = []
    with (
        fleet.server.client() as c,
        c.stream("GET", f"/v1/tasks/{task['id']}/events", timeout=httpx.Timeout(60, connect=5)) as events,
    ):
        for line in events.iter_lines():
            if line.startswith("data:") and (data := json.loads(line[5:])).get("node_id") is None:
                states.append(data["state"])
                if data["state"] in ("succeeded", "failed", "cancelled"):
                    break
    assert states[-1] == "succeeded", states
    assert time.monotonic() - started > 2 * HEAD_S


# ---------------------------------------------------------------- connections and wiring


def test_connections_over_the_limit_get_503_until_some_close(tmp_path: Path) -> None:
    with Fleet(tmp_path, max_connections="4") as f:
        idle = [socket.create_connection(("127.0.0.1", f.server.port), timeout=10) for _ in range(4)]
        try:
            with httpx.Client(base_url=f.server.url, timeout=10) as c:
                wait_until(lambda: c.get("/healthz").status_code == 503, 10, "the limit to refuse a request")
        finally:
            for s in idle:
                s.close()
        with httpx.Client(base_url=f.server.url, timeout=10) as c:
            wait_until(lambda: c.get("/healthz").status_code == 200, 10, "requests to be served again")


def test_serve_passes_every_slow_client_setting_to_uvicorn() -> None:
    settings = Settings(header_timeout_s=3, keepalive_timeout_s=7, max_connections=99, max_header_bytes=2048)
    options = server_options(settings)
    assert issubclass(options["http"], HeadLimitsH11)
    assert (options["http"].header_timeout_s, options["http"].max_head_bytes) == (3, 2048)
    assert options["timeout_keep_alive"] == 7
    assert options["limit_concurrency"] == 99
    assert options["h11_max_incomplete_event_size"] == 2048
    defaults = Settings()
    assert (defaults.header_timeout_s, defaults.body_timeout_s, defaults.keepalive_timeout_s) == (10, 30, 5)
