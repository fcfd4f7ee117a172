"""The `system` toolset over real MCP: info, processes, disk; all read-only (SPEC section 5)."""

from __future__ import annotations

import functools
import os
import platform
import socket
import sys
from pathlib import Path

import pytest
from mcp import Client

from device_agent.toolsets.system import build, device_info
from tests.unit.device_agent import toolkit
from tests.unit.device_agent.toolkit import make_ctx

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

call = functools.partial(toolkit.call, build)
ok = functools.partial(toolkit.ok, build)


def test_device_info_has_the_hello_fields() -> None:
    info = device_info()
    assert set(info) == {"platform", "os", "version", "hostname", "cpu_count", "memory_mb"}
    assert info["platform"] in ("linux", "windows", "macos", "other")
    assert info["hostname"] == socket.gethostname()
    assert info["version"] == platform.release()
    assert info["cpu_count"] >= 1


@linux_only
def test_device_info_reads_memory_on_linux() -> None:
    assert device_info()["platform"] == "linux"
    assert device_info()["memory_mb"] > 0


async def test_info_tool_extends_device_info(tmp_path: Path) -> None:
    info = await ok(make_ctx(tmp_path), "info")
    assert {k: info[k] for k in device_info()} == device_info()
    assert info["python"] == platform.python_version()
    assert info["arch"] == platform.machine()
    if sys.platform.startswith("linux"):
        assert info["uptime_s"] > 0


@linux_only
async def test_processes_lists_this_process_by_pid(tmp_path: Path) -> None:
    listed = await ok(make_ctx(tmp_path), "processes", limit=10_000)
    mine = [p for p in listed["processes"] if p["pid"] == os.getpid()]
    assert len(mine) == 1
    assert mine[0]["state"] in ("running", "sleeping")
    assert listed["total"] == len(listed["processes"])
    assert listed["truncated"] is False and listed["note"] is None


@linux_only
async def test_processes_limit_truncates_lowest_pid_first(tmp_path: Path) -> None:
    listed = await ok(make_ctx(tmp_path), "processes", limit=1)
    assert len(listed["processes"]) == 1
    assert listed["total"] > 1 and listed["truncated"] is True
    assert listed["processes"][0]["pid"] == min(int(name) for name in os.listdir("/proc") if name.isdigit())


async def test_disk_reports_the_workspace_filesystem(tmp_path: Path) -> None:
    disk = await ok(make_ctx(tmp_path), "disk")
    assert disk["path"] == "."
    assert disk["total_bytes"] >= disk["used_bytes"] > 0
    assert disk["free_bytes"] >= 0


async def test_disk_outside_the_workspace_is_denied_and_a_missing_path_is_a_tool_error(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    denied = await call(ctx, "disk", path="../..")
    assert denied.structured_content is not None and denied.structured_content["code"] == "policy_denied"
    missing = await call(ctx, "disk", path="missing")
    assert missing.structured_content is not None and missing.structured_content["code"] == "tool_error"


async def test_system_tools_work_with_the_kill_switch_on(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, kill_switch=True)
    for tool in ("info", "processes", "disk"):
        await ok(ctx, tool)


async def test_every_system_tool_is_read_only_and_idempotent(tmp_path: Path) -> None:
    async with Client(build(make_ctx(tmp_path))) as client:
        tools = (await client.list_tools()).tools
    assert sorted(t.name for t in tools) == ["disk", "echo", "info", "processes"]
    for tool in tools:
        assert tool.description
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is True
        assert tool.annotations.idempotent_hint is True
        assert tool.annotations.destructive_hint is False


async def test_echo_returns_its_text_unchanged(tmp_path: Path) -> None:
    assert await ok(make_ctx(tmp_path), "echo", text="ping ✓") == {"text": "ping ✓"}
