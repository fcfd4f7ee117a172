"""deploy/nginx.conf: finds scaled replicas at run time and passes WebSockets and SSE through."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.deploy.compose_env import ROOT
from tests.support import Fleet, free_port, shell, wait_until

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


def test_it_lets_the_orchestrator_answer_for_large_bodies() -> None:
    (size,) = directives("client_max_body_size")
    assert int(size.rstrip("m")) * 1024 * 1024 > 2 * 1024 * 1024  # ORRERY_MAX_REQUEST_BYTES default


@pytest.fixture
def nginx_in_front(tmp_path: Path) -> Iterator[tuple[Fleet, str]]:
    """The real config in front of one real orchestrator. Only the addresses change: the
    replicas' DNS name becomes the server's loopback port (no Docker DNS here)."""
    if NGINX is None:
        pytest.skip("nginx is not installed (Debian package nginx-light); the text checks above still ran")
    port = free_port()
    (tmp_path / "fleet").mkdir()
    with Fleet(tmp_path / "fleet") as f:
        conf = (
            TEXT.replace("http://orchestrator:8765", f"http://127.0.0.1:{f.server.port}")
            .replace("listen 8765;", f"listen 127.0.0.1:{port};")
            .replace("pid /tmp/nginx.pid;", f"pid {tmp_path}/nginx.pid;")
            .replace("worker_processes auto;", "worker_processes 1;")
        )
        for temp in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            conf = conf.replace("http {", f"http {{\n    {temp}_temp_path {tmp_path}/{temp};", 1)
        if os.geteuid() == 0:  # workers would otherwise be `nobody`, shut out of pytest's 0700 tmp dir
            conf = "user root;\n" + conf
        (tmp_path / "nginx.conf").write_text(conf)
        log = (tmp_path / "nginx.log").open("wb")
        proc = subprocess.Popen(
            [NGINX, "-e", "stderr", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
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
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
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
