"""The `shell` toolset: run one program from an argv list (SPEC section 5).

There is no shell: argv goes to `exec` as is, so `;`, `$(...)`, quotes and globs are plain
characters. Who wants a shell asks for one (`["sh", "-c", "..."]`) and the policy decides.

Each run gets its own process group (`start_new_session=True`) so a timeout or a cancel kills
everything the program started, not only the program. Output is read as it comes and kept up to
`Policy.max_output_bytes` per stream; the rest is counted and dropped, so a chatty program cannot
exhaust the agent's memory, and is still read so the program never blocks on a full pipe.

The same separation would let a run outlive its agent: the program dies with the agent (the
parent-death signal), its group is recorded in the ledger and its environment marked, so the
next agent kills what is left before it reports the call (device_agent/orphans.py).

With `sandbox = "bwrap"` every program runs confined (device_agent/sandbox.py): the workspace is
the only writable place, the network is off, resource limits apply. The group kill still reaches
everything: killing bwrap tears down the run's whole pid namespace.

POSIX only: process groups and `os.killpg` have no Windows equivalent here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult
from pydantic import Field
from typing_extensions import TypedDict

from device_agent.policy import PolicyDenied, check_action, check_program, child_env, contain
from device_agent.sandbox import signal_exit
from device_agent.toolsets.base import Toolkit, ToolsetContext, action, failure, success, tool

_CHUNK = 64 * 1024
# Signals the kernel sends when a sandbox resource limit (setrlimit) is reached.
_LIMIT_SIGNALS = {
    "SIGXFSZ": " (a file reached the sandbox's size limit, sandbox_file_size_mb)",
    "SIGXCPU": " (the program used up the sandbox's CPU time, sandbox_cpu_s)",
}
# After the group is killed, how long to wait for the pipes to close. A process that escaped the
# group (setsid) may hold them forever; we stop reading rather than hang.
_REAP_GRACE_S = 2.0


class RunResult(TypedDict):
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    stdout_truncated: bool
    stderr_truncated: bool


class _Capture:
    """One output stream, kept up to `cap` bytes; the excess is only counted."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.dropped = 0

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_CHUNK):
            room = self.cap - len(self.kept)
            if room > 0:
                self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - max(room, 0))

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... truncated {self.dropped} bytes]"
        return text


GUARDRAIL = (
    "shell_allow and shell_deny are a guardrail against mistakes, not a security boundary: an allowed "
    "shell or interpreter runs anything the agent's user can (sh -c 'rm ...', env rm, find -delete, "
    "a copied binary all get past shell_deny = ['rm'])"
)


def check(ctx: ToolsetContext) -> dict[str, Any]:
    """`orrery agent --check` for the shell: how programs are confined (the sandbox was probed already)."""
    if ctx.sandbox is None:
        return {
            "ready": True,
            "reason": None,
            "sandbox": {"kind": "none"},
            "warning": f"{GUARDRAIL}; programs run unconfined, as the agent's user: turn on the sandbox "
            "(sandbox = 'bwrap', --sandbox bwrap) to make the workspace the only writable place",
        }
    return {
        "ready": True,
        "reason": None,
        "sandbox": ctx.sandbox.report(),
        "note": f"{GUARDRAIL}; the bwrap sandbox is the boundary: the workspace is the only writable place"
        + ("" if ctx.sandbox.network else ", and there is no network"),
    }


def build(ctx: ToolsetContext) -> MCPServer:
    """The `shell` MCP server: one tool, `run`."""
    kit = Toolkit("shell")

    @tool(kit, action(idempotent=False, destructive=True))
    async def run(
        argv: Annotated[
            list[str],
            Field(
                min_length=1,
                description='Program and arguments, e.g. ["ls", "-la"]. Not a shell string: no pipes, '
                'globs or variables; use ["sh", "-c", "..."] when a shell is really needed.',
            ),
        ],
        cwd: Annotated[
            str | None,
            Field(description="Working directory relative to the workspace (default: the workspace)."),
        ] = None,
        timeout_s: Annotated[
            float | None,
            Field(
                gt=0,
                description="Seconds before the program and its children are killed "
                "(default and maximum: the command's timeout_s).",
            ),
        ] = None,
        stdin: Annotated[str | None, Field(description="Text fed to the program's standard input.")] = None,
    ) -> Annotated[CallToolResult, RunResult]:
        """Run a program on the device and return its exit code, stdout and stderr.

        argv[0] is looked up on PATH; arguments are passed literally, never through a shell.
        Exit code 0 is success; any other exit code is an error result that still carries
        exit_code, stdout and stderr. Each stream is capped (marked *_truncated when cut). On
        timeout the program and everything it started are killed and partial output is returned.
        The program may change the device, so this tool is never retried automatically.
        """
        policy = ctx.policy
        try:
            check_action(policy, tool_is_read_only=False)
            check_program(policy, argv[0])
            workdir = contain(ctx.workspace, cwd or ".")
        except PolicyDenied as exc:
            return failure(exc.code, str(exc))
        if not workdir.is_dir():
            return failure(
                "invalid_arguments", f"cwd {cwd!r} is not a directory in the workspace; create it or omit cwd"
            )
        timeout = policy.default_timeout_s if timeout_s is None else timeout_s
        if timeout > policy.max_timeout_s:
            return failure(
                "invalid_arguments",
                f"timeout_s {timeout_s} exceeds this device's maximum of {policy.max_timeout_s} s; "
                "use a smaller value or split the work",
            )
        return await _run(ctx, argv, workdir, timeout, stdin)

    return kit.server()


async def _run(
    ctx: ToolsetContext, argv: list[str], workdir: Path, timeout: float, stdin: str | None
) -> CallToolResult:
    started = time.monotonic()
    env = ctx.processes.environment(child_env(ctx.policy, os.environ))
    command = argv
    if ctx.sandbox is not None:
        # bwrap would report a missing program as its own exit status 1; say it the usual way.
        if not _findable(argv[0], workdir, env):
            return _not_found(argv[0])
        command = ctx.sandbox.wrap(argv, workdir)
    spawning = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *command,
            cwd=workdir,
            env=env,
            # Without input, the child must not inherit (and block on) the agent's own stdin.
            stdin=asyncio.subprocess.DEVNULL if stdin is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=ctx.processes.preexec(),
        )
    )
    try:
        proc = await asyncio.shield(spawning)
    except asyncio.CancelledError:
        await _kill_once_started(spawning)
        raise
    except FileNotFoundError:
        return _not_found(argv[0])
    except PermissionError:
        return failure("invalid_arguments", f"program {argv[0]!r} is not executable by the agent's user")
    except (ValueError, OSError) as exc:  # e.g. a NUL byte in an argument
        return failure("invalid_arguments", f"cannot start {argv[0]!r}: {exc}")

    out, err = _Capture(ctx.policy.max_output_bytes), _Capture(ctx.policy.max_output_bytes)
    assert proc.stdout is not None and proc.stderr is not None  # PIPE was asked for both
    tasks = {
        asyncio.create_task(out.drain(proc.stdout)),
        asyncio.create_task(err.drain(proc.stderr)),
        asyncio.create_task(proc.wait()),
    }
    if stdin is not None:
        tasks.add(asyncio.create_task(_feed(proc, stdin.encode())))
    try:
        ctx.processes.add(proc)  # recorded in the ledger; if it cannot be, the cleanup reaps it
        # `proc.wait()` also waits for the pipes to close, so a background child that keeps
        # stdout open counts against the timeout too; the group kill then ends it.
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            _kill_group(proc)
            await asyncio.wait(pending, timeout=_REAP_GRACE_S)
        return _result(
            proc,
            argv[0],
            (out, err),
            started,
            killed=ctx.processes.was_killed(proc),
            timed_out=bool(pending),
            timeout=timeout,
            sandboxed=ctx.sandbox is not None,
        )
    finally:
        await _cleanup(proc, tasks)
        ctx.processes.discard(proc)


def _findable(program: str, workdir: Path, env: dict[str, str]) -> bool:
    """Whether `program` names an executable the way exec looks it up (the sandbox sees the same files)."""
    if "/" in program:
        return os.access(workdir / program, os.X_OK)
    return shutil.which(program, path=env.get("PATH", os.defpath)) is not None


def _not_found(program: str) -> CallToolResult:
    return failure(
        "invalid_arguments",
        f"program {program!r} was not found on PATH; check the spelling, give its absolute path, "
        "or check that it is installed on this device (system.info tells the platform)",
    )


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
        await proc.stdin.wait_closed()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the program exited without reading all of its input: not our error to report


async def _kill_once_started(spawning: asyncio.Future[asyncio.subprocess.Process]) -> None:
    """The call was cancelled (a cancel, its timeout, an emergency stop) while its program was
    being started. Left to itself, asyncio would kill only the program and then wait for its
    pipes, which the program's own children hold open: the cancel would hang until they exit,
    and they would run on. So the start (a fork and an exec, quick) is let finish, then the
    whole group is killed and reaped, and the cancel goes on."""
    while not spawning.done():
        try:
            await asyncio.wait({spawning})
        except asyncio.CancelledError:
            continue  # cancelled again: the one cancel already under way is re-raised by the caller
    if spawning.cancelled() or spawning.exception() is not None:
        return  # it never started: nothing to kill
    proc = spawning.result()
    await _cleanup(proc, {asyncio.create_task(proc.wait())})


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


async def _cleanup(proc: asyncio.subprocess.Process, tasks: set[asyncio.Task[Any]]) -> None:
    """Leave no process, task or transport behind, even when the call itself is cancelled."""
    pending = {task for task in tasks if not task.done()}
    if proc.returncode is None or pending:
        _kill_group(proc)
    # The SDK runs tools under anyio cancel scopes, which cancel every await in a cancelled
    # scope again: shield the bounded reaping so it can finish.
    with anyio.CancelScope(shield=True):
        if pending:
            await asyncio.wait(pending, timeout=_REAP_GRACE_S)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
    if proc.returncode is None or any(not task.done() or task.cancelled() for task in tasks):
        # A process outside the group still holds the pipes: close our ends (private, but there
        # is no public way) so the transport is not leaked.
        transport = getattr(proc, "_transport", None)
        if transport is not None:
            transport.close()


def _result(
    proc: asyncio.subprocess.Process,
    program: str,
    streams: tuple[_Capture, _Capture],
    started: float,
    *,
    killed: bool,
    timed_out: bool,
    timeout: float,
    sandboxed: bool = False,
) -> CallToolResult:
    """Map how the run ended to a result (SPEC section 4 codes: tool_error, timeout, cancelled)."""
    out, err = streams
    outputs: dict[str, Any] = {
        "stdout": out.text(),
        "stderr": err.text(),
        "duration_ms": round((time.monotonic() - started) * 1000, 3),
        "stdout_truncated": out.truncated,
        "stderr_truncated": err.truncated,
    }
    code = proc.returncode
    if killed:
        return failure("cancelled", f"{program} was cancelled and killed with its process group", **outputs)
    if timed_out:
        if code is not None and code >= 0:
            # The program itself finished; something it started in the background held the pipes.
            return failure(
                "timeout",
                f"{program} exited with code {code}, but processes it started kept stdout/stderr open "
                f"past the {timeout:g} s timeout and were killed; redirect the output of background "
                "processes (e.g. >/dev/null 2>&1) so the call ends when the program does",
                exit_code=code,
                **outputs,
            )
        return failure(
            "timeout",
            f"{program} did not finish within {timeout:g} s and was killed with its process group",
            **outputs,
        )
    if code is None:  # cannot happen once proc.wait() completed; kept so the type is narrowed
        return failure("tool_error", f"{program} did not report an exit status", **outputs)
    if code < 0:
        name = _signal_name(-code)
        return failure("tool_error", f"{program} was killed by signal {name}", exit_code=code, signal=name, **outputs)
    if code != 0 and sandboxed and (number := signal_exit(code)) is not None:
        # In the sandbox a signal comes back as bwrap's exit status 128 + N, as from a shell.
        name = _signal_name(number)
        hint = _LIMIT_SIGNALS.get(name, "")
        message = f"{program} exited with code {code}, the sandbox's way of saying killed by signal {name}{hint}"
        return failure("tool_error", message, exit_code=code, signal=name, **outputs)
    if code != 0:
        first = next((line for line in outputs["stderr"].splitlines() if line.strip()), "")
        detail = first[:300] if first else "(nothing on stderr; see stdout)"
        message = f"{program} exited with code {code}: {detail}"
        return failure("tool_error", message, exit_code=code, **outputs)
    return success({"exit_code": 0, **outputs})


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
