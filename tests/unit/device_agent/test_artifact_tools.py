"""The artifact tools on the device, before anything moves: paths stay inside the workspace
(`..`, absolute paths, symlinks out and NUL bytes are `invalid_arguments`), and the pieces of a
transfer that need no orchestrator (hashing, URLs, retries against the clock) do what they say.
Transfers themselves run against a real orchestrator in tests/integration/test_artifacts.py."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from device_agent.artifacts import file_digest, refusal
from device_agent.config import AgentConfig
from device_agent.policy import Policy
from device_agent.router import CallLimit
from device_agent.toolset_host import ToolsetHost
from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.files import build
from device_agent.transfer import ArtifactLink, Connection, Refused, TransferError, http_base
from protocol.messages import Command, CommandBatch
from tests.unit.device_agent.toolkit import call, make_ctx, routing


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed


def running(workspace: Path, servers: tuple[str, ...] = ("http://127.0.0.1:9",)) -> ToolsetContext:
    ctx = make_ctx(workspace)
    ctx.artifacts = ArtifactLink(servers, "orrd_dev_x.secret", None, 1024)
    command = Command(call_id="c", tool="files.publish_artifact", arguments={})
    batch = CommandBatch(batch_id="b_1", task_id="t_1", node_id="n", attempt=1, fence=1, commands=[command])
    ctx.current_batch = lambda: batch
    return ctx


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "report.txt").write_text("hello\n")
    (ws / "dir").mkdir()
    return ws


async def refused(ctx: ToolsetContext, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(build, ctx, tool, **arguments)
    assert result.is_error and result.structured_content is not None, result.content
    return dict(result.structured_content)


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/hostname", "dir/../../x", "out/report.txt"])
async def test_paths_that_lead_out_of_the_workspace_are_invalid_arguments(workspace: Path, path: str) -> None:
    (workspace / "out").symlink_to(workspace.parent)  # a symlink inside that points outside
    (workspace.parent / "report.txt").write_text("not yours\n")
    ctx = running(workspace)
    assert (await refused(ctx, "publish_artifact", path=path))["code"] == "invalid_arguments"
    assert (await refused(ctx, "fetch_artifact", path=path, name="report.txt"))["code"] == "invalid_arguments"
    assert (workspace.parent / "report.txt").read_text() == "not yours\n"


async def test_a_nul_byte_in_a_path_is_refused_by_the_router_before_the_tool(workspace: Path, tmp_path: Path) -> None:
    host = ToolsetHost("files", build(running(workspace)), strict_arguments=True, in_process=True)
    async with routing(make_ctx(workspace).policy, tmp_path / "audit.jsonl", host) as r:
        for tool, arguments in [
            ("files.publish_artifact", {"path": "report.txt\x00.evil"}),
            ("files.fetch_artifact", {"path": "x\x00", "name": "report.txt"}),
        ]:
            result = await r.call(Command(call_id="c", tool=tool, arguments=arguments), "b_1", CallLimit(10))
            assert result.error is not None and result.error.code == "invalid_arguments", result


async def test_what_is_not_a_file_or_not_nameable_is_refused_before_anything_is_sent(workspace: Path) -> None:
    ctx = running(workspace)
    assert (await refused(ctx, "publish_artifact", path="dir"))["code"] == "invalid_arguments"
    assert (await refused(ctx, "publish_artifact", path="missing.txt"))["code"] == "invalid_arguments"
    (workspace / "-odd name").write_text("x")
    odd = await refused(ctx, "publish_artifact", path="-odd name")
    assert odd["code"] == "invalid_arguments" and "pass name" in odd["message"]
    assert (await refused(ctx, "fetch_artifact", path="x.txt"))["code"] == "invalid_arguments"  # no name, no sha256
    assert (await refused(ctx, "fetch_artifact", path="dir", name="report.txt"))["code"] == "invalid_arguments"


async def test_without_a_running_batch_the_tools_say_so(workspace: Path) -> None:
    ctx = make_ctx(workspace)  # an agent's context outside any batch
    answer = await refused(ctx, "publish_artifact", path="report.txt")
    assert answer["code"] == "tool_error" and "batch" in answer["message"]


async def test_an_unreachable_orchestrator_is_retried_until_the_command_runs_out_of_time(workspace: Path) -> None:
    link = ArtifactLink((f"http://127.0.0.1:{closed_port()}", f"http://127.0.0.1:{closed_port()}"), "t", None, 1024)
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:  # a virtual clock: the backoff's waits take no time
        slept.append(seconds)
        now[0] += seconds

    async with Connection(link, deadline=20.0, clock=lambda: now[0], sleep=sleep) as conn:
        with pytest.raises(TransferError) as failed:
            await conn.call("GET", "", "fetching 'x'")
    assert failed.value.code == "timeout" and "could not be reached in time" in str(failed.value)
    assert conn.retries >= 5 and max(slept) <= 2.0  # capped backoff, every try a real connection refused
    assert now[0] + 0.5 + 2.0 >= 18.0 and now[0] <= 20.0


def test_a_file_is_hashed_in_pieces_and_refused_over_the_devices_limit(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "f").write_bytes(data)
    assert file_digest(tmp_path / "f", len(data)) == (len(data), hashlib.sha256(data).hexdigest())
    with pytest.raises(TransferError) as big:
        file_digest(tmp_path / "f", len(data) - 1)
    assert big.value.code == "artifact_too_large" and "max_artifact_bytes" in str(big.value)


def test_the_orchestrators_refusals_become_the_tools_codes() -> None:
    cases = {
        (413, "artifact_too_large"): "artifact_too_large",
        (404, "not_found"): "artifact_not_found",
        (422, "validation_error"): "invalid_arguments",
        (401, "unauthorized"): "transfer_failed",
        (409, "batch_closed"): "transfer_failed",
        (403, "batch_not_yours"): "transfer_failed",
    }
    for (status, code), expected in cases.items():
        assert refusal(Refused(status, {"code": code, "detail": "d"}), "publishing 'x'").code == expected


def test_the_artifact_routes_are_reached_like_the_websocket() -> None:
    assert http_base("wss://orch.example:8765/v1/agent") == "https://orch.example:8765"
    assert http_base("ws://127.0.0.1:8765/base/v1/agent") == "http://127.0.0.1:8765/base"
    assert http_base("https://orch.example/") == "https://orch.example"
    cfg = AgentConfig(server="https://a:1", servers=["http://b:2"], token="orrd_dev_1.s", max_artifact_bytes=5)
    assert cfg.artifact_link() == ArtifactLink(("https://a:1", "http://b:2"), "orrd_dev_1.s", None, 5)


async def test_the_kill_switch_lets_a_publish_run_and_refuses_a_fetch_and_a_stop_refuses_both(
    workspace: Path, tmp_path: Path
) -> None:
    ctx = make_ctx(workspace)  # no batch runs: a publish that gets past the policy says so
    host = ToolsetHost("files", build(ctx), strict_arguments=True, in_process=True)
    publish = Command(call_id="p", tool="files.publish_artifact", arguments={"path": "report.txt"})
    fetch = Command(call_id="f", tool="files.fetch_artifact", arguments={"path": "x", "name": "report.txt"})
    async with routing(Policy(kill_switch=True), tmp_path / "audit.jsonl", host) as r:
        ran = await r.call(publish, "b_1", CallLimit(10))
        refused = await r.call(fetch, "b_1", CallLimit(10))
        assert ran.error is not None and ran.error.code == "tool_error"  # it ran: it changes nothing here
        assert refused.error is not None and refused.error.code == "policy_denied"
        await r.stop_latch.engage("test")
        for cmd in (publish, fetch):
            stopped = await r.call(cmd, "b_1", CallLimit(10))
            assert stopped.error is not None and stopped.error.code == "device_stopped"
