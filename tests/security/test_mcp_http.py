"""Third-party MCP servers over streamable HTTP with a bearer token: real servers (the official
`mcp` SDK under uvicorn) that refuse requests without the token, driven through the orchestrator.

The token must reach the configured server and nothing else: not another origin (a redirect),
not the agent's logs (even at debug level), not hello.info, not `--check` output."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from device_agent.mcp_client import HttpTarget
from tests.integration.test_third_party_mcp import agent_with
from tests.services import run_async
from tests.support import ROOT, TLS, Fleet, child_env, free_port, wait_until

TOKEN = "tok-5f3a9c1e-never-in-any-log"
API_KEY = "key-7d2b-also-secret"
FIXTURE = ROOT / "tests" / "fixtures" / "http_mcp.py"


@dataclass
class HttpMcp:
    """One tests/fixtures/http_mcp.py server on a loopback port, and what reached it."""

    url: str
    state: Path

    def requests(self) -> list[dict[str, Any]]:
        log = self.state / "requests.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@contextlib.contextmanager
def http_mcp(tmp: Path, name: str, mode: str, location: str = "") -> Iterator[HttpMcp]:
    port = free_port()
    state = tmp / name
    state.mkdir(parents=True)
    with (tmp / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(FIXTURE), str(port), str(state), mode, location],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(HTTP_MCP_TOKEN=TOKEN, PYTHONPATH=str(ROOT)),
            cwd=ROOT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited: {(tmp / f'{name}.log').read_text()}")
        try:
            return httpx.get(f"{base}/ready", timeout=1, verify=TLS).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 30, f"the {name} MCP server")
        yield HttpMcp(f"{base}/mcp", state)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def http_toml(url: str, token: str, *, log_level: str = "debug") -> str:
    return f"""
[agent]
toolsets = ["system"]
log_level = "{log_level}"

[[agent.mcp_servers]]
namespace = "remote"
url = "{url}"
bearer_token = "{token}"
headers = {{ X-Api-Key = "{API_KEY}" }}
"""


def check(config: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """`orrery agent --check` with this config, as an owner runs it."""
    return subprocess.run(
        [sys.executable, "-m", "device_agent", "--check", "--config", str(config), "--data-dir", str(tmp / "check")],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=ROOT,
        check=False,
    )


def test_an_http_mcp_server_behind_a_bearer_token_serves_the_fleet_and_the_token_goes_nowhere_else(
    tmp_path: Path,
) -> None:
    with http_mcp(tmp_path, "remote", "serve") as remote, Fleet(tmp_path) as f:
        agent = agent_with(f, "http-box", http_toml(remote.url, TOKEN))
        f.wait_device(agent.device_id, "idle")
        device = f.device(agent.device_id)
        assert {"remote.add", "remote.shout"} <= {t["name"] for t in device["tools"]}
        done = f.wait_task(
            f.submit(
                {
                    "nodes": [
                        {
                            "id": "n",
                            "placement": {"labels": {"kind": "http-box"}},
                            "commands": [
                                {"tool": "remote.add", "arguments": {"a": 2, "b": 3}},
                                {"tool": "remote.shout", "arguments": {"text": "quiet"}},
                            ],
                        }
                    ]
                }
            )["id"]
        )
        node = done["nodes"][0]
        assert done["state"] == "succeeded", node
        assert [r["result"] for r in node["attempts"][0]["results"]] == [{"result": 5}, {"result": "QUIET"}]

        seen = remote.requests()
        assert seen and all(r["headers"].get("authorization") == f"Bearer {TOKEN}" for r in seen)
        assert all(r["headers"].get("x-api-key") == API_KEY for r in seen)
        log = agent.log()
        assert "DEBUG" in log and "HTTP Request: POST" in log  # the debug lines of the HTTP client are there
        for secret in (TOKEN, API_KEY):
            assert secret not in log
            assert secret not in json.dumps(device)  # hello.info (policy, device info) and the catalogue
            assert secret not in f.server.log()

        config = agent.data_dir / "agent.toml"
        report = check(config, tmp_path)
        assert report.returncode == 0, report.stderr
        toolset = json.loads(report.stdout)["toolsets"]["remote"]
        assert toolset["ready"] and {"add", "shout"} <= set(toolset["tools"])
        for secret in (TOKEN, API_KEY):
            assert secret not in report.stdout + report.stderr


def test_a_wrong_bearer_token_is_named_as_the_reason_and_is_not_echoed(tmp_path: Path) -> None:
    wrong = "tok-wrong-0b1c-also-never-logged"
    with http_mcp(tmp_path, "remote", "serve") as remote, Fleet(tmp_path) as f:
        agent = agent_with(f, "http-box", http_toml(remote.url, wrong))
        f.wait_device(agent.device_id, "idle")
        wait_until(lambda: "401 Unauthorized" in agent.log(), 30, "the agent to log the refusal")
        log = agent.log()
        assert "toolset 'remote' failed to start" in log
        assert "refused the configured bearer_token/headers" in log
        assert not {t["name"] for t in f.device(agent.device_id)["tools"]} & {"remote.add", "remote.shout"}

        report = check(agent.data_dir / "agent.toml", tmp_path)
        assert report.returncode == 1
        reason = json.loads(report.stdout)["toolsets"]["remote"]["reason"]
        assert "401 Unauthorized" in reason and remote.url in reason
        for secret in (wrong, API_KEY):
            assert secret not in log
            assert secret not in report.stdout + report.stderr


def test_a_redirect_to_another_origin_is_refused_and_the_other_server_never_sees_the_token(tmp_path: Path) -> None:
    with (
        http_mcp(tmp_path, "elsewhere", "record") as elsewhere,
        http_mcp(tmp_path, "redirector", "redirect", location=f"{elsewhere.url}?stolen=1") as redirector,
        Fleet(tmp_path) as f,
    ):
        agent = agent_with(f, "http-box", http_toml(redirector.url, TOKEN))
        f.wait_device(agent.device_id, "idle")
        wait_until(lambda: "not followed" in agent.log(), 30, "the agent to refuse the redirect")
        assert redirector.requests(), "the configured server was asked"
        assert all(TOKEN not in json.dumps(r) and API_KEY not in json.dumps(r) for r in elsewhere.requests())
        assert TOKEN not in agent.log()


def test_the_token_and_headers_are_taken_off_any_request_for_another_origin(tmp_path: Path) -> None:
    """Even when something follows a cross-origin redirect (here: the HTTP client itself, asked to
    follow), the configured headers stay with the configured origin; repr does not show them."""
    with (
        http_mcp(tmp_path, "elsewhere", "record") as elsewhere,
        http_mcp(tmp_path, "redirector", "redirect", location=elsewhere.url) as redirector,
    ):
        target = HttpTarget(redirector.url, (("Authorization", f"Bearer {TOKEN}"), ("X-Api-Key", API_KEY)))
        assert TOKEN not in repr(target) and API_KEY not in repr(target)

        async def fetch() -> int:
            client, _ = target.client()
            async with client:
                await client.get(redirector.url)  # an ordinary request to the configured origin carries them
                response = await client.get(redirector.url, follow_redirects=True)
                await client.get(elsewhere.url)  # a request straight to another origin
                return response.status_code

        assert run_async(fetch()) == 404  # the redirect was followed to the recording server
        assert redirector.requests()[0]["headers"]["authorization"] == f"Bearer {TOKEN}"
        reached = elsewhere.requests()
        assert len(reached) == 2
        for request in reached:
            assert "authorization" not in request["headers"] and "x-api-key" not in request["headers"]


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"url": "http://user:pw@127.0.0.1:1/mcp"}, "not in its url"),
        ({"url": "ftp://127.0.0.1/mcp"}, "http(s) URL"),
        ({"url": "http://127.0.0.1:1/mcp", "roots": ["relative/dir"]}, "absolute"),
    ],
)
def test_mcp_server_settings_that_would_leak_or_mislead_are_refused(server: dict[str, Any], message: str) -> None:
    from pydantic import ValidationError

    from device_agent.config import McpServerConfig

    with pytest.raises(ValidationError) as err:
        McpServerConfig(namespace="remote", **server)
    assert message in str(err.value)
    assert "pw@" not in str(err.value)


def test_the_config_keeps_secrets_out_of_its_repr_and_dumps() -> None:
    from device_agent.config import McpServerConfig

    server = McpServerConfig(
        namespace="remote", url="https://mcp.example/x", bearer_token=TOKEN, headers={"K": API_KEY}
    )
    assert server.http_headers() == {"K": API_KEY, "Authorization": f"Bearer {TOKEN}"}
    for shown in (repr(server), str(server), server.model_dump_json()):
        assert TOKEN not in shown and API_KEY not in shown
