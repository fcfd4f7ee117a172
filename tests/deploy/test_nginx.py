"""deploy/nginx.conf: finds scaled replicas at run time and passes WebSockets and SSE through."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.api.errors import problem_body
from orchestrator.config import Settings
from tests.deploy.compose_env import ROOT
from tests.support import TLS, Fleet, free_port, shell, wait_until

CONF = ROOT / "deploy" / "nginx.conf"
TEXT = CONF.read_text()
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)


def directives(name: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(rf"^\s*{name}\s+([^;]*);", TEXT, re.MULTILINE)]


def test_it_passes_the_websocket_upgrade() -> None:
    assert directives("proxy_http_version") == ["1.1"]
    headers = directives("proxy_set_header")
    assert "Upgrade $http_upgrade" in headers
    assert "Connection $connection_upgrade" in headers
    assert re.search(r"map \$http_upgrade \$connection_upgrade \{[^}]*default\s+upgrade;", TEXT)


def test_it_finds_scaled_replicas_through_dockers_dns_at_run_time() -> None:
    assert directives("resolver") == ["127.0.0.11 valid=5s ipv6=off"]
    # A variable in proxy_pass is what makes nginx resolve per request rather than once at start.
    assert directives("set") == ["$orchestrator http://orchestrator:8765"]
    assert set(directives("proxy_pass")) == {"$orchestrator"}
    assert directives("listen") == ["8765"]


def test_device_sockets_and_event_streams_get_long_read_timeouts() -> None:
    agent = re.search(r"location /v1/agent \{(.*?)\}", TEXT, re.DOTALL)
    events = re.search(r"location ~ \^/v1/tasks/\[\^/\]\+/events\$ \{(.*?)\}", TEXT, re.DOTALL)
    assert agent and events
    for block in (agent.group(1), events.group(1)):
        assert "proxy_read_timeout 1h;" in block
        assert "proxy_buffering off;" in block


def test_its_body_limit_is_the_orchestrators_and_answers_with_the_same_problem() -> None:
    (size,) = directives("client_max_body_size")
    assert int(size.rstrip("m")) * 1024 * 1024 == Settings().max_request_bytes
    assert "413 @payload_too_large" in directives("error_page")
    page = re.search(r"location @payload_too_large \{(.*?)\n        \}", TEXT, re.DOTALL)
    assert page and "default_type application/problem+json;" in page.group(1)
    body = json.loads(re.search(r"return 413 '(.*)';", page.group(1)).group(1))  # type: ignore[union-attr]
    assert body == problem_body(413, "payload_too_large", "the request body is over the limit")


def test_it_has_slow_client_limits_and_spares_device_sockets_the_per_address_limit() -> None:
    for name in ("client_header_timeout", "client_body_timeout", "send_timeout", "keepalive_timeout"):
        (value,) = directives(name)
        assert value.endswith("s") and 0 < int(value[:-1]) <= 60, (name, value)
    (head_buffers,) = directives("large_client_header_buffers")
    assert head_buffers.split()[1] == f"{Settings().max_header_bytes // 1024}k"
    assert directives("limit_conn_zone") == ["$binary_remote_addr zone=per_client:10m"]
    agent = re.search(r"location /v1/agent \{(.*?)\}", TEXT, re.DOTALL)
    assert agent and "limit_conn" not in agent.group(1)  # devices behind one NAT share an address
    assert len(directives("limit_conn")) == 2  # the API and the event streams


def test_nginx_accepts_the_config(tmp_path: Path) -> None:
    if NGINX is None:
        pytest.skip("nginx is not installed (Debian package nginx-light); the text checks above still ran")
    conf = local_conf(tmp_path, upstream_port=free_port(), port=free_port())
    command = [NGINX, "-t", "-e", "stderr", "-p", str(tmp_path), "-c", str(conf)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "test is successful" in done.stderr


HEADER_TIMEOUT_S = 2  # client_header_timeout in the test's copy of the config


def local_conf(tmp_path: Path, upstream_port: int, port: int) -> Path:
    """The real config with only the addresses changed (the replicas' DNS name becomes a loopback
    port; there is no Docker DNS here) and a short client_header_timeout, written under tmp_path."""
    assert "client_header_timeout 10s;" in TEXT
    conf = (
        TEXT.replace("http://orchestrator:8765", f"http://127.0.0.1:{upstream_port}")
        .replace("listen 8765;", f"listen 127.0.0.1:{port};")
        .replace("pid /tmp/nginx.pid;", f"pid {tmp_path}/nginx.pid;")
        .replace("worker_processes auto;", "worker_processes 1;")
        .replace("client_header_timeout 10s;", f"client_header_timeout {HEADER_TIMEOUT_S}s;")
    )
    for temp in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        conf = conf.replace("http {", f"http {{\n    {temp}_temp_path {tmp_path}/{temp};", 1)
    if os.geteuid() == 0:  # workers would otherwise be `nobody`, shut out of pytest's 0700 tmp dir
        conf = "user root;\n" + conf
    path = tmp_path / "nginx.conf"
    path.write_text(conf)
    return path


@pytest.fixture
def nginx_in_front(tmp_path: Path) -> Iterator[tuple[Fleet, str]]:
    """The real config in front of one real orchestrator. Only the addresses change: the
    replicas' DNS name becomes the server's loopback port (no Docker DNS here)."""
    if NGINX is None:
        pytest.skip("nginx is not installed (Debian package nginx-light); the text checks above still ran")
    port = free_port()
    (tmp_path / "fleet").mkdir()
    with Fleet(tmp_path / "fleet") as f:
        conf = local_conf(tmp_path, upstream_port=f.server.port, port=port)
        log = (tmp_path / "nginx.log").open("wb")
        proc = subprocess.Popen(
            [NGINX, "-e", "stderr", "-p", str(tmp_path), "-c", str(conf), "-g", "daemon off;"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: _up(port, proc, tmp_path / "nginx.log"), 20, "nginx to listen")
            yield f, f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(15)
            log.close()


def _up(port: int, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"nginx exited with {proc.returncode}: {log.read_text()}")
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1, verify=TLS).status_code == 200
    except httpx.HTTPError:
        return False


def test_an_agent_and_an_event_stream_work_through_nginx(nginx_in_front: tuple[Fleet, str]) -> None:
    f, lb_url = nginx_in_front
    agent = f.agent("via-lb", start=False)
    agent.server_url = lb_url  # the device WebSocket goes through the proxy
    agent.start()
    f.wait_device(agent.device_id, "idle")

    headers = {"Authorization": f"Bearer {f.server.api_key}"}
    with httpx.Client(base_url=lb_url, headers=headers, timeout=30) as lb:
        dag = {"nodes": [{"id": "hi", "placement": {"device": agent.device_id}, "commands": [shell(["echo", "hi"])]}]}
        r = lb.post("/v1/tasks", json={"dag": dag})
        assert r.status_code == 201, r.text
        task_id = r.json()["id"]
        states = []
        with lb.stream("GET", f"/v1/tasks/{task_id}/events", timeout=httpx.Timeout(30, connect=5)) as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            for line in events.iter_lines():
                if line.startswith("data:"):
                    data = json.loads(line[5:])
                    if data.get("node_id") is None:
                        states.append(data["state"])
                        if data["state"] in ("succeeded", "failed", "cancelled"):
                            break
        assert states[-1] == "succeeded", states
        done = lb.get(f"/v1/tasks/{task_id}").json()
    assert done["nodes"][0]["output"]["stdout"] == "hi\n"
    assert done["nodes"][0]["attempts"][0]["device_id"] == agent.device_id


def test_nginx_cuts_a_slow_request_head(nginx_in_front: tuple[Fleet, str]) -> None:
    """Slowloris at the edge: a head still incomplete after client_header_timeout is closed."""
    _, lb_url = nginx_in_front
    port = int(lb_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=HEADER_TIMEOUT_S + 10) as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: a")
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):  # until nginx closes (the socket timeout bounds it)
                answer += chunk
        elapsed = time.monotonic() - started
    assert HEADER_TIMEOUT_S - 0.5 <= elapsed < HEADER_TIMEOUT_S + 10, elapsed
    assert b"200 OK" not in answer


def test_nginx_refuses_bodies_over_the_limit_with_the_orchestrators_problem(
    nginx_in_front: tuple[Fleet, str],
) -> None:
    f, lb_url = nginx_in_front
    limit = Settings().max_request_bytes
    headers = {"Authorization": f"Bearer {f.server.api_key}", "content-type": "application/json"}
    with httpx.Client(base_url=lb_url, headers=headers, timeout=30) as lb:
        declared = lb.post("/v1/tasks", content=b"x" * (limit + 1))
        chunked = lb.post("/v1/tasks", content=iter([b"x" * limit, b"x"]))
        under = lb.post("/v1/tasks", content=iter([b"x" * (limit - 1)]))
    for r in (declared, chunked):
        assert r.status_code == 413, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "payload_too_large"
    assert under.status_code == 422, under.text  # passed on: the app read it (and it is not JSON)
