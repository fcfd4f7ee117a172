"""docker-compose.yml without Docker: its migrate, orchestrator (two replicas) and agent services started
as local processes with the same commands and environment, against real Postgres and Redis. Only the
addresses of the backing services, the listening ports and the agent's volume path differ."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx

from tests.deploy.compose_env import services
from tests.support import ROOT, TLS, free_port, wait_until


def test_the_compose_services_run_as_local_processes(tmp_path: Path, postgres_db: str, redis_db: str) -> None:
    admin = "orrk_" + secrets.token_urlsafe(24)
    procs = services(
        {"POSTGRES_PASSWORD": "unused", "ORRERY_SECRET_KEY": secrets.token_hex(16), "ORRERY_ADMIN_KEY": admin}
    )
    assert {"migrate", "orchestrator", "agent", "postgres", "redis"} <= set(procs)
    local = {"ORRERY_DATABASE_URL": postgres_db, "ORRERY_REDIS_URL": redis_db}
    bin_dir = str(Path(sys.executable).parent)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    base_env["PATH"] = f"{bin_dir}:{base_env.get('PATH', '')}"

    def env(service: str, **extra: str) -> dict[str, str]:
        return {**base_env, **procs[service].environment, **local, **extra}

    migrate = subprocess.run(
        procs["migrate"].local_argv(),
        env=env("migrate"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stderr
    running: list[subprocess.Popen[bytes]] = []
    try:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            with (tmp_path / f"orchestrator-{i}.log").open("ab") as log:
                running.append(
                    subprocess.Popen(
                        procs["orchestrator"].local_argv(),
                        env=env("orchestrator", ORRERY_PORT=str(port), ORRERY_DATA_DIR=str(tmp_path / f"data-{i}")),
                        cwd=ROOT,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            wait_until(lambda u=url: _ready(u), 60, f"orchestrator {url}")
        with (tmp_path / "agent.log").open("ab") as agent_log:
            running.append(
                subprocess.Popen(
                    procs["agent"].local_argv(),
                    env=env("agent", ORRERY_AGENT_SERVER=urls[0], ORRERY_AGENT_DATA_DIR=str(tmp_path / "agent")),
                    cwd=ROOT,
                    stdout=agent_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        headers = {"Authorization": f"Bearer {admin}"}
        with httpx.Client(base_url=urls[1], headers=headers, timeout=30) as c:
            wait_until(
                lambda: any(
                    d["name"] == "sample-agent" and d["state"] == "idle" for d in c.get("/v1/devices").json()["items"]
                ),
                90,
                "the sample agent",
            )
            dag = {
                "nodes": [
                    {
                        "id": "hi",
                        "placement": {"labels": {"role": "sample"}},
                        "commands": [{"tool": "shell.run", "arguments": {"argv": ["echo", "from compose"]}}],
                    }
                ]
            }
            task = c.post("/v1/tasks", json={"dag": dag}).json()
            done = wait_until(
                lambda: (t := c.get(f"/v1/tasks/{task['id']}").json())["state"] == "succeeded" and t, 60, "the task"
            )
        assert done["nodes"][0]["output"]["stdout"] == "from compose\n"
        assert (tmp_path / "agent" / "device.token").exists()
    finally:
        for proc in running:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in running:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2, verify=TLS).status_code == 200
    except httpx.HTTPError:
        return False
