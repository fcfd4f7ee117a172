"""Attacks on `shell.run` with `shell_deny = ["rm"]`, through the real shell toolset and real bwrap.

The deny list is a guardrail: with the sandbox off, every attack below deletes or overwrites a
file outside the workspace. With `sandbox = "bwrap"` none does, the network is gone, the limits
bite, and a timeout or cancel still kills everything the program started.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import CallToolResult

from device_agent.config import AgentConfig
from device_agent.runner import toolset_context
from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.shell import build

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

ORIGINAL = "keep me\n"
# The interpreter itself, not a venv's link to it: the sandbox's /tmp is private, so a checkout (and
# its venv) under the host's /tmp is not there to run (as in a fresh CI clone in /tmp).
PYTHON = os.path.realpath(sys.executable)


def make(tmp: Path, **settings: Any) -> ToolsetContext:
    """The context the agent builds from these settings (the sandbox probed as at start-up)."""
    return toolset_context(AgentConfig(data_dir=tmp / "data", shell_deny=["rm"], **settings))


async def run(ctx: ToolsetContext, **arguments: Any) -> CallToolResult:
    async with Client(build(ctx)) as client:
        return await client.call_tool("run", arguments)


def data(result: CallToolResult) -> dict[str, Any]:
    assert result.structured_content is not None, result.content
    return dict(result.structured_content)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside the workspace that the sandbox can see: /var/tmp, not the private /tmp."""
    path = Path(tempfile.mkdtemp(prefix="orrery-sandbox-test-", dir="/var/tmp"))
    (path / "victim.txt").write_text(ORIGINAL)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def attacks(victim: Path) -> dict[str, list[str]]:
    folder = victim.parent
    return {
        "sh -c rm": ["sh", "-c", f"rm {victim}"],
        "env rm": ["env", "rm", str(victim)],
        "find -delete": ["find", str(folder), "-name", victim.name, "-delete"],
        "copied rm": ["sh", "-c", f'cp "$(command -v rm)" ./myrm && ./myrm {victim}'],
        "python unlink": [PYTHON, "-c", f"import os; os.unlink({str(victim)!r})"],
        "overwrite": ["sh", "-c", f"echo pwned > {victim}"],
        "write via /tmp/..": ["sh", "-c", f"echo x > /tmp/..{folder}/planted.txt"],
    }


def untouched(folder: Path) -> bool:
    return (
        sorted(p.name for p in folder.iterdir()) == ["victim.txt"] and (folder / "victim.txt").read_text() == ORIGINAL
    )


@pytest.mark.parametrize("attack", list(attacks(Path("/x"))))
async def test_the_sandbox_stops_what_the_deny_list_lets_through(tmp_path: Path, outside: Path, attack: str) -> None:
    argv = attacks(outside / "victim.txt")[attack]
    result = await run(make(tmp_path, sandbox="bwrap"), argv=argv)
    assert result.is_error
    err = data(result)
    assert err["code"] == "tool_error"
    assert "Read-only file system" in err["stderr"], err  # seen, but not writable: the mount refused it
    assert untouched(outside)


@pytest.mark.parametrize("attack", list(attacks(Path("/x"))))
async def test_without_the_sandbox_the_deny_list_is_only_a_guardrail(
    tmp_path: Path, outside: Path, attack: str
) -> None:
    argv = attacks(outside / "victim.txt")[attack]
    result = await run(make(tmp_path), argv=argv)
    assert not result.is_error, data(result)
    assert not untouched(outside)  # shell_deny = ["rm"], and the file is gone or changed anyway


async def test_rm_itself_is_still_refused_by_the_deny_list_in_the_sandbox(tmp_path: Path, outside: Path) -> None:
    err = data(await run(make(tmp_path, sandbox="bwrap"), argv=["rm", str(outside / "victim.txt")]))
    assert err["code"] == "policy_denied"
    assert untouched(outside)


async def test_the_workspace_is_writable_and_the_host_sees_the_result(tmp_path: Path) -> None:
    ctx = make(tmp_path, sandbox="bwrap")
    (ctx.workspace / "in.txt").write_text("from the host\n")
    scratch = f"/tmp/orrery-sandbox-{uuid.uuid4().hex}"
    script = f"mkdir -p sub && echo hello > sub/out.txt && echo private > {scratch} && cat {scratch} in.txt"
    out = data(await run(ctx, argv=["sh", "-c", script]))
    assert out["exit_code"] == 0 and out["stdout"] == "private\nfrom the host\n"
    assert (ctx.workspace / "sub" / "out.txt").read_text() == "hello\n"
    assert not await anyio.Path(scratch).exists()  # /tmp in the sandbox is its own, gone with the run

    out = data(await run(ctx, argv=["pwd"], cwd="sub"))
    assert out["stdout"] == f"{ctx.workspace / 'sub'}\n"


async def test_the_cwd_argument_is_still_contained_in_the_workspace(tmp_path: Path) -> None:
    err = data(await run(make(tmp_path, sandbox="bwrap"), argv=["pwd"], cwd="../.."))
    assert err["code"] == "policy_denied"


async def test_the_data_dir_with_the_ledger_is_hidden_and_run_is_empty(tmp_path: Path) -> None:
    ctx = make(tmp_path, sandbox="bwrap")
    assert ctx.data_dir is not None
    (ctx.data_dir / "ledger.sqlite3").write_text("every argument and result")
    script = 'ls -A "$0"; cat "$0/ledger.sqlite3"; echo x > "$0/planted"; ls -A /run'
    err = data(await run(ctx, argv=["sh", "-c", script, str(ctx.data_dir)]))
    assert err["stdout"] == "workspace\n"  # the workspace bound over an empty tmpfs, nothing else
    assert "No such file" in err["stderr"]
    assert sorted(p.name for p in ctx.data_dir.iterdir()) == ["ledger.sqlite3", "workspace"]


async def test_a_missing_program_is_invalid_arguments_as_without_the_sandbox(tmp_path: Path) -> None:
    err = data(await run(make(tmp_path, sandbox="bwrap"), argv=["no-such-program-orrery"]))
    assert err["code"] == "invalid_arguments" and "not found on PATH" in err["message"]


# ---------------------------------------------------------------- network


async def connect_from_the_sandbox(tmp_path: Path, **settings: Any) -> tuple[CallToolResult, int]:
    """Run a TCP connect to a loopback server of the test's from the sandbox; count connections."""
    accepted = 0

    def on_connect(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10); print('connected')"
    async with server:
        result = await run(make(tmp_path, sandbox="bwrap", **settings), argv=[PYTHON, "-c", code])
    return result, accepted


async def test_the_sandbox_has_no_network_not_even_the_hosts_loopback(tmp_path: Path) -> None:
    result, accepted = await connect_from_the_sandbox(tmp_path)
    assert result.is_error
    assert "ConnectionRefusedError" in data(result)["stderr"]  # its own loopback, where nobody listens
    assert accepted == 0


async def test_sandbox_network_true_lets_the_same_connection_through(tmp_path: Path) -> None:
    result, accepted = await connect_from_the_sandbox(tmp_path, sandbox_network=True)
    assert data(result)["stdout"] == "connected\n"
    assert accepted == 1


# ---------------------------------------------------------------- resource limits


async def test_the_file_size_limit_bites(tmp_path: Path) -> None:
    ctx = make(tmp_path, sandbox="bwrap", sandbox_file_size_mb=1)
    err = data(await run(ctx, argv=["sh", "-c", "head -c 3000000 /dev/zero > big"]))
    assert (err["code"], err["signal"]) == ("tool_error", "SIGXFSZ")
    assert "sandbox_file_size_mb" in err["message"]
    assert (ctx.workspace / "big").stat().st_size == 1024 * 1024


async def test_the_memory_limit_bites(tmp_path: Path) -> None:
    grab = [PYTHON, "-c", "x = bytearray(256 * 1024 * 1024); print('allocated')"]
    err = data(await run(make(tmp_path, sandbox="bwrap", sandbox_memory_mb=64), argv=grab))
    assert err["code"] == "tool_error" and "MemoryError" in err["stderr"]
    ok = data(await run(make(tmp_path, sandbox="bwrap"), argv=grab))  # the default limit is 2048 MiB
    assert ok["stdout"] == "allocated\n"


async def test_the_cpu_limit_bites(tmp_path: Path) -> None:
    ctx = make(tmp_path, sandbox="bwrap", sandbox_cpu_s=1)
    err = data(await run(ctx, argv=["sh", "-c", "while :; do :; done"], timeout_s=60))
    assert (err["code"], err["signal"]) == ("tool_error", "SIGXCPU")


# ---------------------------------------------------------------- timeout and cancel


def processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every live process as the host sees it, zombies excluded."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            yield int(entry.name), argv


def sleepers(marker: str) -> list[int]:
    return [
        pid for pid, argv in processes() if argv[:1] == ["sleep"] and argv[1:2] in ([f"{marker}.1"], [f"{marker}.2"])
    ]


def anything_with(marker: str) -> list[int]:
    """The sleepers, and the sh, prlimit and bwrap processes whose arguments name them."""
    return [pid for pid, argv in processes() if any(marker in arg for arg in argv)]


async def wait_for(condition: Any, what: str, timeout: float = 10) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def escaping_sleepers() -> tuple[list[str], str]:
    """A shell that starts a sleeper in its own session (out of the process group) and one in it."""
    n = uuid.uuid4().int % 10**6
    marker = f"77{n:06d}"
    return ["sh", "-c", f"setsid sleep {marker}.1 & sleep {marker}.2 & wait"], marker


async def test_a_timeout_kills_everything_in_the_sandbox_even_what_left_the_group(tmp_path: Path) -> None:
    argv, marker = escaping_sleepers()
    call = asyncio.create_task(run(make(tmp_path, sandbox="bwrap"), argv=argv, timeout_s=3))
    await wait_for(lambda: len(sleepers(marker)) == 2, "both sleepers to start")
    err = data(await call)
    assert err["code"] == "timeout"
    await wait_for(lambda: not anything_with(marker), "every process of the run to be gone")


async def test_a_cancel_kills_everything_in_the_sandbox(tmp_path: Path) -> None:
    ctx = make(tmp_path, sandbox="bwrap")
    argv, marker = escaping_sleepers()
    call = asyncio.create_task(run(ctx, argv=argv, timeout_s=120))
    await wait_for(lambda: len(sleepers(marker)) == 2, "both sleepers to start")
    await wait_for(lambda: ctx.processes.count() == 1, "the tool to track its process")
    assert ctx.processes.kill_all() == 1  # one group: bwrap's
    err = data(await call)
    assert err["code"] == "cancelled"
    await wait_for(lambda: not anything_with(marker), "every process of the run to be gone")
