"""The compose deployment, for real: `docker-compose.yml` up in containers, checked from the host
through nginx as a user would, under faults, then taken down. Run by `scripts/compose-check`
(which installs Docker and builds the images first); exits non-zero on the first failed check.

Checks, in order:
  1. `up --scale orchestrator=3` becomes healthy; the migration ran once, in one container, exit 0.
  2. The sample agent container enrolled itself, is idle and healthy (the image's HEALTHCHECK:
     connected); an agent on the host enrolls too.
  3. A DAG across both devices succeeds.
  4. `docker kill` of one orchestrator mid-run: the task finishes, 0 lost, 0 run twice.
  5. `restart` of the Postgres container mid-run, then of the Redis container: the same.
  6. The sample agent's volume lost: it takes its device over again (same device, new token).
  7. `down -v` leaves no container, volume or network of the project.

"Run twice" is counted on the devices: every node appends its id to a file in the device's
workspace with `files.append`, which is not idempotent, so Orrery never retries it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "orrerycheck"
T = TypeVar("T")


class CheckFailed(Exception):
    pass


def say(text: str) -> None:
    print(f"[compose-check {time.strftime('%H:%M:%S')}] {text}", flush=True)


def wait(check: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, subprocess.CalledProcessError, KeyError, ValueError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(interval)
    raise CheckFailed(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


class Deployment:
    def __init__(self, workdir: Path, port: int) -> None:
        self.dir = workdir / "checkout"
        self.port = port
        self.admin_key = "orrk_" + secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{port}"

    # ------------------------------------------------------------ setup

    def prepare(self) -> None:
        """A copy of this checkout (as a user's clone would be) with a filled-in .env."""
        files = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        ).stdout.split(b"\0")
        for name in filter(None, files):
            src = ROOT / name.decode()
            if src.is_file():
                dst = self.dir / name.decode()
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        env = (ROOT / "deploy" / "env.example").read_text()
        env = env.replace("COMPOSE_PROJECT_NAME=orrery\n", f"COMPOSE_PROJECT_NAME={PROJECT}\n")
        env = env.replace("POSTGRES_PASSWORD=\n", f"POSTGRES_PASSWORD={secrets.token_hex(16)}\n")
        env = env.replace("ORRERY_SECRET_KEY=\n", f"ORRERY_SECRET_KEY={secrets.token_hex(32)}\n")
        env = env.replace("ORRERY_ADMIN_KEY=\n", f"ORRERY_ADMIN_KEY={self.admin_key}\n")
        env += f"LB_PORT={self.port}\n"
        # Short heartbeats, so a killed replica's devices move over within seconds. The timeout
        # must outlast a device's way back through nginx: a reconnect sent to the killed
        # replica's address (still in nginx's DNS cache) waits out `proxy_connect_timeout` before
        # the next address is tried; at 5 s the new leader, which takes over within a second,
        # judged a device reconnecting that way offline and its running batch lost.
        env += "ORRERY_HEARTBEAT_INTERVAL_S=1\nORRERY_HEARTBEAT_TIMEOUT_S=15\n"
        (self.dir / ".env").write_text(env)

    def compose(self, *args: str, capture: bool = False) -> str:
        done = subprocess.run(
            ["docker-compose", "-p", PROJECT, *args],
            cwd=self.dir,
            check=False,
            capture_output=capture,
            text=True,
        )
        if done.returncode != 0:
            raise CheckFailed(f"docker-compose {' '.join(args)} exited {done.returncode}: {done.stderr or ''}")
        return done.stdout or ""

    def containers(self, service: str, all_: bool = False) -> list[dict[str, Any]]:
        ids = subprocess.run(
            [
                "docker",
                "ps",
                *(["-a"] if all_ else []),
                "-q",
                "--filter",
                f"label=com.docker.compose.project={PROJECT}",
                "--filter",
                f"label=com.docker.compose.service={service}",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if not ids:
            return []
        inspected: list[dict[str, Any]] = json.loads(
            subprocess.run(["docker", "inspect", *ids], check=True, capture_output=True, text=True).stdout
        )
        return inspected

    def healthy(self, service: str, count: int) -> bool:
        states = [c["State"].get("Health", {}).get("Status") for c in self.containers(service)]
        return states.count("healthy") == count

    def leader(self) -> dict[str, Any]:
        """The orchestrator container whose replica holds the engine lease (its own /readyz says)."""
        probe = (
            "import urllib.request; "
            "print(urllib.request.urlopen('http://127.0.0.1:8765/readyz', timeout=5).read().decode())"
        )
        for c in self.containers("orchestrator"):
            done = subprocess.run(
                ["docker", "exec", c["Id"], "python", "-c", probe], capture_output=True, text=True, check=False
            )
            if done.returncode == 0 and json.loads(done.stdout)["cluster"].get("leader") is True:
                return c
        raise CheckFailed("no orchestrator container says it leads")

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=15)

    def get(self, path: str) -> Any:
        with self.api() as c:
            r = c.get(path)
            r.raise_for_status()
            return r.json()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        with self.api() as c:
            r = c.post(path, json=body)
            if r.status_code >= 300:
                raise CheckFailed(f"POST {path}: {r.status_code} {r.text[:500]}")
            return r.json()

    def device(self, name: str) -> dict[str, Any] | None:
        return next((d for d in self.get("/v1/devices")["items"] if d["name"] == name), None)

    def idle(self, name: str) -> dict[str, Any] | None:
        d = self.device(name)
        return d if d and d["state"] == "idle" else None

    # ------------------------------------------------------------ tasks

    def submit(self, name: str, nodes: list[dict[str, Any]], edges: list[dict[str, str]]) -> str:
        task = self.post("/v1/tasks", {"name": name, "dag": {"nodes": nodes, "edges": edges}})
        return str(task["id"])

    def finished(self, task_id: str, timeout: float) -> dict[str, Any]:
        task: dict[str, Any] = wait(
            lambda: (t := self.get(f"/v1/tasks/{task_id}"))["state"] in ("succeeded", "failed", "cancelled") and t,
            timeout,
            f"task {task_id} to finish",
        )
        return task


def node(node_id: str, labels: dict[str, str], delay: float = 0.0) -> dict[str, Any]:
    """A node that appends its id to exec.log on a device with `labels`, then waits `delay`."""
    commands: list[dict[str, Any]] = [
        {"tool": "files.append", "arguments": {"path": "exec.log", "content": f"{node_id}\n"}}
    ]
    if delay:
        commands.append({"tool": "shell.run", "arguments": {"argv": ["sleep", str(delay)]}})
    return {"id": node_id, "placement": {"labels": labels}, "commands": commands}


SAMPLE = {"role": "sample"}
HOST = {"where": "host"}


class Run:
    """A task whose nodes alternate between the two devices in layers: long enough to put a fault
    in the middle of it."""

    def __init__(self, dep: Deployment, name: str, layers: int = 12, width: int = 4) -> None:
        self.dep, self.name = dep, name
        self.ids = [f"{name}-{layer}-{i}" for layer in range(layers) for i in range(width)]
        nodes = [
            node(f"{name}-{layer}-{i}", SAMPLE if (layer + i) % 2 else HOST, delay=0.2)
            for layer in range(layers)
            for i in range(width)
        ]
        edges = [
            {"from": f"{name}-{layer - 1}-{i}", "to": f"{name}-{layer}-{i}"}
            for layer in range(1, layers)
            for i in range(width)
        ]
        self.task_id = dep.submit(name, nodes, edges)

    def started(self) -> bool:
        task = self.dep.get(f"/v1/tasks/{self.task_id}")
        done = sum(n["state"] == "succeeded" for n in task["nodes"])
        return 0 < done < len(self.ids) // 2


def executions(dep: Deployment, host_workspace: Path) -> Counter[str]:
    """How many times each node id was appended, on both devices."""
    text = (host_workspace / "exec.log").read_text() if (host_workspace / "exec.log").exists() else ""
    agent = dep.containers("agent")
    if agent:
        done = subprocess.run(
            ["docker", "exec", agent[0]["Id"], "sh", "-c", "cat /var/lib/orrery-agent/workspace/exec.log || true"],
            capture_output=True,
            text=True,
            check=False,
        )
        text += done.stdout
    return Counter(line for line in text.splitlines() if line)


def expect_exactly_once(dep: Deployment, run: Run, host_workspace: Path, what: str) -> None:
    task = dep.finished(run.task_id, 300)
    states = Counter(n["state"] for n in task["nodes"])
    counts = executions(dep, host_workspace)
    lost = [i for i in run.ids if counts[i] == 0]
    twice = [i for i in run.ids if counts[i] > 1]
    say(f"{what}: task {task['state']}, nodes {dict(states)}, lost {len(lost)}, ran twice {len(twice)}")
    if task["state"] != "succeeded" or lost or twice:
        unlike = [
            {k: n.get(k) for k in ("id", "state", "device_id", "error", "attempts")}
            for n in task["nodes"]
            if n["state"] != "succeeded" or n["id"] in lost or n["id"] in twice
        ]
        raise CheckFailed(
            f"{what}: state {task['state']}, nodes {dict(states)}, lost {lost}, twice {twice}; "
            f"those nodes: {json.dumps(unlike)[:3000]}"
        )


@contextlib.contextmanager
def host_agent(dep: Deployment, workdir: Path) -> Iterator[Path]:
    enrolled = dep.post("/v1/devices", {"name": "host-agent", "labels": HOST})
    data = workdir / "host-agent"
    log = (workdir / "host-agent.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "device_agent",
            "--server",
            dep.url,
            "--token",
            enrolled["token"],
            "--data-dir",
            str(data),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait(lambda: dep.idle("host-agent"), 60, "the host agent to be idle")
        yield data / "workspace"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def check(dep: Deployment, workdir: Path) -> None:
    started = time.monotonic()
    dep.compose("build")
    for image in ("orrery:local", "orrery-agent:local"):
        inspected = subprocess.run(["docker", "image", "inspect", image], capture_output=True, text=True, check=True)
        say(f"image {image}: {json.loads(inspected.stdout)[0]['Size'] / 1e6:.0f} MB")
    dep.compose("up", "-d", "--scale", "orchestrator=3")
    wait(lambda: dep.healthy("orchestrator", 3), 240, "3 healthy orchestrators")
    wait(lambda: dep.get("/readyz") is not None, 60, "/readyz through nginx")
    say(f"1. up with 3 healthy replicas in {time.monotonic() - started:.0f}s (build included)")

    migrations = dep.containers("migrate", all_=True)
    codes = [c["State"]["ExitCode"] for c in migrations]
    if codes != [0]:
        raise CheckFailed(f"the migration should have run once and exited 0; containers' exit codes: {codes}")
    say("1. the migration ran once, exit 0")

    wait(lambda: dep.idle("sample-agent"), 120, "the sample agent container to be idle")
    wait(lambda: dep.healthy("agent", 1), 120, "the sample agent container to be healthy (its HEALTHCHECK)")
    with host_agent(dep, workdir) as host_workspace:
        say("2. the sample agent container (healthy) and an agent on the host are idle")

        nodes = [node("hello-a", SAMPLE), node("hello-b", HOST), node("hello-c", SAMPLE)]
        task_id = dep.submit(
            "hello", nodes, [{"from": "hello-a", "to": "hello-b"}, {"from": "hello-b", "to": "hello-c"}]
        )
        task = dep.finished(task_id, 120)
        if task["state"] != "succeeded":
            raise CheckFailed(f"the two-device DAG ended {task['state']}: {json.dumps(task)[:2000]}")
        say("3. a DAG across both devices succeeded")

        run = Run(dep, "kill")
        wait(run.started, 120, "the task to be under way")
        victim = dep.leader()  # the engine's replica: the hardest one to lose
        subprocess.run(["docker", "kill", victim["Id"]], check=True, capture_output=True)
        say(f"4. killed {victim['Name'].lstrip('/')} (the engine's leader) mid-run")
        expect_exactly_once(dep, run, host_workspace, "4. after docker kill of a replica")
        dep.compose("up", "-d", "--scale", "orchestrator=3", "--no-recreate")
        wait(lambda: dep.healthy("orchestrator", 3), 240, "3 healthy orchestrators again")

        for service in ("postgres", "redis"):
            run = Run(dep, f"restart-{service}")
            wait(run.started, 120, "the task to be under way")
            dep.compose("restart", service)
            say(f"5. restarted {service} mid-run")
            expect_exactly_once(dep, run, host_workspace, f"5. after restarting {service}")
            wait(lambda: dep.healthy("orchestrator", 3), 240, "3 healthy orchestrators after the restart")

    sample = dep.device("sample-agent")
    assert sample is not None
    dep.compose("rm", "-s", "-f", "agent")
    subprocess.run(["docker", "volume", "rm", f"{PROJECT}_agent-data"], check=True, capture_output=True)
    dep.compose("up", "-d", "--no-deps", "agent")
    wait(lambda: dep.idle("sample-agent"), 120, "the sample agent to be idle with a new volume")
    devices = [d for d in dep.get("/v1/devices")["items"] if d["name"] == "sample-agent"]
    if [d["id"] for d in devices] != [sample["id"]]:
        raise CheckFailed(f"a lost volume should give the same device back, not {devices}")
    say("6. the sample agent, its volume lost, took its device over again")


def report_failure(dep: Deployment, workdir: Path) -> None:
    """What a failure needs to be understood from the end of a long CI log: every service's last
    lines, then the replicas' warnings and errors of the whole run, then the host agent's log."""
    print(dep.compose("logs", "--tail=40", capture=True)[-20000:], flush=True)
    logs = dep.compose("logs", "--no-color", "orchestrator", capture=True)
    notable = [line for line in logs.splitlines() if " WARNING " in line or " ERROR " in line]
    print("the replicas' warnings and errors:", *notable[-60:], sep="\n", flush=True)
    host_log = workdir / "host-agent.log"
    if host_log.exists():
        print("the host agent's log (its end):", host_log.read_text(errors="replace")[-4000:], sep="\n", flush=True)


def leftovers() -> list[str]:
    found = []
    for kind in ("container", "volume", "network"):
        args = ["docker", kind, "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        if kind == "container":
            args = ["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()
        found += [f"{kind} {x}" for x in out]
    return found


def main() -> int:
    port = int(os.environ.get("COMPOSE_CHECK_PORT", "18765"))
    with tempfile.TemporaryDirectory(prefix="orrery-compose-check-") as tmp:
        workdir = Path(tmp)
        dep = Deployment(workdir, port)
        dep.prepare()
        failed: Exception | None = None
        try:
            check(dep, workdir)
        except (CheckFailed, AssertionError, subprocess.CalledProcessError, httpx.HTTPError) as exc:
            failed = exc
            say(f"FAILED: {exc}")
            with contextlib.suppress(Exception):
                report_failure(dep, workdir)
        finally:
            with contextlib.suppress(CheckFailed):
                dep.compose("down", "-v", "--remove-orphans", capture=True)
        left = leftovers()
        if left:
            say(f"FAILED: down -v left {left}")
            return 1
        say("7. down -v left no container, volume or network")
        if failed is not None:
            where = " < ".join(f"{f.name}:{f.lineno}" for f in traceback.extract_tb(failed.__traceback__)[::-1])
            say(f"FAILED (repeated after the logs above; {type(failed).__name__} in {where}): {failed}")
            return 1
    say("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
