"""`orrery demo`: an embedded orchestrator, three local device agents and one multi-device DAG.

No configuration: everything lives in a temporary directory (removed at the end, so the demo
prints no path into it) or in `--data-dir` (kept), the server listens on a free loopback port, and
the agents are real `orrery agent` processes with their own workspaces. `--keep` leaves the server
and the agents running after the DAG, prints the dashboard URL and a viewer API key, and stops
everything on Ctrl-C (exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvicorn
from rich.console import Console

from orchestrator.config import Settings
from orrery.sdk import AsyncClient, Client, OrreryError

DEVICES = [
    ("web-1", {"role": "web"}),
    ("web-2", {"role": "web"}),
    ("analysis", {"role": "analysis"}),
]

_LOG_LINES = {
    "web-1": "GET /index.html 200\nGET /api/orders 500\nGET /api/users 200\nPOST /api/orders 500\n",
    "web-2": "GET /index.html 200\nGET /api/orders 200\nGET /health 200\nGET /api/users 500\n",
}


def demo_dag() -> dict[str, Any]:
    """Collect logs on the two web servers, merge them on the analysis box, count errors, report."""

    def collect(device: str) -> dict[str, Any]:
        return {
            "id": f"{device}-logs",
            "placement": {"device": device},
            "commands": [
                {"tool": "files.write", "arguments": {"path": "access.log", "content": _LOG_LINES[device]}},
                {"tool": "system.info", "arguments": {}},
                {"tool": "files.read", "arguments": {"path": "access.log"}},
            ],
            "retry": {"max_attempts": 2},
        }

    return {
        "name": "collect-merge-report",
        "nodes": [
            collect("web-1"),
            collect("web-2"),
            {
                "id": "merge",
                "placement": {"labels": {"role": "analysis"}},
                "commands": [
                    {
                        "tool": "files.write",
                        "arguments": {
                            "path": "merged.log",
                            "content": "${nodes.web-1-logs.output.content}${nodes.web-2-logs.output.content}",
                        },
                    },
                    {"tool": "shell.run", "arguments": {"argv": ["sort", "merged.log"]}},
                ],
            },
            {
                "id": "count-errors",
                "placement": {"labels": {"role": "analysis"}},
                "commands": [{"tool": "shell.run", "arguments": {"argv": ["grep", "-c", " 500", "merged.log"]}}],
            },
            {
                "id": "report",
                "placement": {"labels": {"role": "analysis"}},
                "commands": [
                    {
                        "tool": "files.write",
                        "arguments": {
                            "path": "report.txt",
                            "content": "Server errors (HTTP 500) across web-1 and web-2: "
                            "${nodes.count-errors.output.stdout}",
                        },
                    },
                    {"tool": "files.read", "arguments": {"path": "report.txt"}},
                ],
            },
        ],
        "edges": [
            {"from": "web-1-logs", "to": "merge"},
            {"from": "web-2-logs", "to": "merge"},
            {"from": "merge", "to": "count-errors"},
            {"from": "count-errors", "to": "report"},
        ],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_demo(console: Console, data_dir: Path | None, keep: bool = False) -> int:
    base = data_dir.absolute() if data_dir else Path(tempfile.mkdtemp(prefix="orrery-demo-"))
    temporary = data_dir is None
    # The server announces where it wrote the admin key; in a temporary dir that path is gone
    # when the demo ends, so it is not printed at all (a --data-dir one stays and is printed).
    hide = _HideAdminKeyPath()
    if temporary:
        logging.getLogger("orrery").addFilter(hide)
    try:
        return asyncio.run(_demo(console, base, temporary=temporary, keep=keep))
    finally:
        logging.getLogger("orrery").removeFilter(hide)


class _HideAdminKeyPath(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("created an admin API key")


async def _demo(console: Console, base: Path, temporary: bool, keep: bool = False) -> int:
    started = time.monotonic()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = Settings(data_dir=base / "server", port=port, heartbeat_interval_s=2.0, heartbeat_timeout_s=10.0)
    from orchestrator.app import create_app
    from orchestrator.gateway.websocket import websocket_options
    from orchestrator.server import server_options

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="on",
            **websocket_options(settings),
            **server_options(settings),
        )
    )
    if keep:
        # uvicorn puts back the handlers it found and then re-raises the signal it caught; with
        # these, Ctrl-C (or SIGTERM) ends the kept demo cleanly instead of as a KeyboardInterrupt.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
    serving = asyncio.create_task(server.serve())
    agents: list[subprocess.Popen[bytes]] = []
    try:
        where = "a temporary dir, removed at the end" if temporary else str(base)
        console.print(f"[bold]orrery demo[/bold]  orchestrator on {url}, data in {where}", soft_wrap=True)
        if not temporary:
            console.print(f"  admin API key: {settings.data_dir / 'admin.key'}", soft_wrap=True, highlight=False)
        await _until(lambda: server.started, 30, "the orchestrator did not start")
        api_key = await asyncio.to_thread(_read_key, settings.data_dir / "admin.key")
        async with AsyncClient(url, api_key) as api:
            for name, labels in DEVICES:
                enrolled = await api.enroll(name, labels)
                agents.append(_start_agent(url, enrolled.token, base / "agents" / name, labels))
                console.print(f"  enrolled [cyan]{name}[/cyan] {labels} and started its agent")
            await _until_idle(api, len(DEVICES))
            console.print("  all three devices are connected and idle\n")
            try:
                task = await api.submit(demo_dag())
            except OrreryError as exc:
                console.print(f"[red]the demo DAG was refused[/red]: {exc.body}")
                return 1
        from orchestrator.console import watch

        with Client(url, api_key) as client:
            final = await asyncio.to_thread(watch, client, task.id, console)
        elapsed = time.monotonic() - started
        report: dict[str, Any] = next((n for n in final["nodes"] if n["id"] == "report"), {})
        content = (report.get("output") or {}).get("content", "")
        console.print(f"\n[bold]result[/bold]: {content}")
        style = "green" if final["state"] == "succeeded" else "red"
        console.print(
            f"task [{style}]{final['state']}[/{style}] in {elapsed:.1f}s (3 devices, {len(final['nodes'])} nodes)"
        )
        if keep:
            async with AsyncClient(url, api_key) as api:
                created = await api.request("POST", "/v1/api-keys", json={"role": "viewer", "name": "demo viewer"})
                viewer = created["key"]
            console.print(
                f"\nThe orchestrator and the 3 agents keep running.\n"
                f"  dashboard:  {url}/\n"
                f"  viewer key: {viewer}  (paste it on the sign-in page; it can look, not act)\n"
                f"  CLI:        ORRERY_URL={url} ORRERY_API_KEY={viewer} orrery tasks list\n"
                "Press Ctrl-C to stop them" + (" (the temporary data dir is then removed)." if temporary else "."),
                highlight=False,
                soft_wrap=True,
            )
            await serving
        return 0 if final["state"] == "succeeded" else 1
    finally:
        for proc in agents:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in agents:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 15)
        if temporary:
            shutil.rmtree(base, ignore_errors=True)


def _read_key(path: Path) -> str:
    return path.read_text().strip()


def _start_agent(url: str, token: str, data_dir: Path, labels: dict[str, str]) -> subprocess.Popen[bytes]:
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir / "agent.log").open("ab")
    args = [sys.executable, "-m", "device_agent", "--server", url, "--token", token, "--data-dir", str(data_dir)]
    for k, v in labels.items():
        args += ["--label", f"{k}={v}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORRERY_")}
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


async def _until(check: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(message)
        await asyncio.sleep(0.05)


async def _until_idle(api: AsyncClient, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if sum(1 for d in await api.devices() if d.state == "idle") >= count:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the device agents did not connect in time; see their agent.log files")
