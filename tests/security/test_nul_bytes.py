"""Issue 14 item 1: a NUL byte (U+0000) in a tool argument is refused with `invalid_arguments`
before anything runs: at submission (where the schema says so), by the engine before dispatch
once a reference's value is known, and on the device itself.

The attack: under uvloop (the agent's loop when installed) a subprocess spawn cuts every string at
its first NUL, where stdlib asyncio raises. `argv[0] = "rm\\u0000x"` passed the shell deny list
(`rm\\u0000x` is not `rm`) and then ran `rm`; `"keep\\u0000DROPPED"` arrived as `keep`.

A real submitter gets a NUL past the submission checks with a `${nodes...}` reference, filled in at
run time with the output of an upstream `system.echo` (whose text may hold any character: it never
reaches a syscall); the engine refuses it before dispatch. A device cannot trust the orchestrator,
so the device's own check is tested with the scripted orchestrator sending the NUL anyway, to a
real agent process.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Agent, Fleet, shell
from tests.unit.device_agent.scripted import scripted

VICTIM = "victim.txt"
POOL = {"labels": {"pool": "nul"}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Agent]]:
    with Fleet(tmp_path_factory.mktemp("nul")) as f:
        agent = f.agent("nul", {"pool": "nul"}, ORRERY_AGENT_SHELL_DENY='["rm"]')
        (agent.workspace / "sub").mkdir()
        yield f, agent


@pytest.fixture
def victim(env: tuple[Fleet, Agent]) -> Path:
    path = env[1].workspace / VICTIM
    path.write_text("still here\n")
    return path


def smuggled(f: Fleet, text: str, command: dict[str, Any]) -> dict[str, Any]:
    """Run `command` with `${nodes.src.output.text}` standing for `text` (NUL included) on the device."""
    dag = {
        "nodes": [
            {"id": "src", "placement": POOL, "commands": [{"tool": "system.echo", "arguments": {"text": text}}]},
            {"id": "use", "placement": POOL, "commands": [command]},
        ],
        "edges": [{"from": "src", "to": "use"}],
    }
    task = f.wait_task(f.submit(dag)["id"])
    assert f.node(task, "src")["output"] == {"text": text}  # the NUL did reach the device's side
    node: dict[str, Any] = f.node(task, "use")
    return node


REF = "${nodes.src.output.text}"


# (text standing for REF, the command, the field as the device names it, as the orchestrator
# names it, a file the command would have made from a cut string)
CASES = [
    # the deny-list bypass: 'rm\0x' is not 'rm' to the policy, but uvloop spawned 'rm'
    ("rm\x00x", shell([REF, VICTIM]), "argv[0]", "argv.0", None),
    # silent truncation of an argument: 'keep\0DROPPED' would have arrived as 'keep'
    ("keep\x00DROPPED", shell(["touch", REF]), "argv[1]", "argv.1", "keep"),
    ("sub\x00x", shell(["touch", "made-in-cwd"], cwd=REF), "cwd", "cwd", "sub/made-in-cwd"),
    ("keep\x00DROPPED", {"tool": "files.write", "arguments": {"path": REF, "content": "x"}}, "path", "path", "keep"),
    ("keep\x00DROPPED", {"tool": "files.append", "arguments": {"path": REF, "content": "x"}}, "path", "path", "keep"),
    (f"{VICTIM}\x00x", {"tool": "files.read", "arguments": {"path": REF}}, "path", "path", None),
    (f"{VICTIM}\x00x", {"tool": "files.delete", "arguments": {"path": REF}}, "path", "path", None),
    ("sub\x00x", {"tool": "files.list", "arguments": {"path": REF}}, "path", "path", None),
    (".\x00x", {"tool": "system.disk", "arguments": {"path": REF}}, "path", "path", None),
]
IDS = ["argv0-deny-bypass", "argv-truncation", "cwd", "write", "append", "read", "delete", "list", "disk"]


def filled(value: Any, text: str) -> Any:
    """`value` with REF replaced by `text`, as a run-time reference would fill it in."""
    if isinstance(value, str):
        return text if value == REF else value
    if isinstance(value, list):
        return [filled(v, text) for v in value]
    if isinstance(value, dict):
        return {k: filled(v, text) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("text", "command", "device_field", "field", "not_created"), CASES, ids=IDS)
def test_a_nul_filled_in_by_a_reference_is_refused_by_the_orchestrator_before_dispatch(
    env: tuple[Fleet, Agent],
    victim: Path,
    text: str,
    command: dict[str, Any],
    device_field: str,
    field: str,
    not_created: str | None,
) -> None:
    """The submission check cannot see a reference's value; the engine checks it against the
    device's schema once it is known, so the command never reaches the device."""
    f, agent = env
    node = smuggled(f, text, command)
    assert node["state"] == "failed"
    assert node["error"]["code"] == "invalid_arguments", node["error"]
    assert f"argument '{field}' contains a NUL byte" in node["error"]["message"]
    assert node["attempts"] == []  # never dispatched
    assert victim.read_text() == "still here\n"
    if not_created:
        assert not (agent.workspace / not_created).exists()


@pytest.mark.parametrize(("text", "command", "device_field", "field", "not_created"), CASES, ids=IDS)
async def test_a_nul_reaching_the_device_is_refused_before_anything_runs(
    tmp_path: Path, text: str, command: dict[str, Any], device_field: str, field: str, not_created: str | None
) -> None:
    """A device cannot trust the orchestrator: one that sends a NUL anyway (the scripted one here;
    a real one refuses first, above) meets the agent's own check, in a real agent process."""
    async with scripted(tmp_path, ORRERY_AGENT_SHELL_DENY='["rm"]') as (server, device):
        device.start()
        conn = await server.next_connection()
        await conn.welcome()
        await conn.recv("heartbeat")  # the agent is up, its workspace made
        (device.workspace / "sub").mkdir(exist_ok=True)
        victim = device.workspace / VICTIM
        victim.write_text("still here\n")
        done = await conn.result_for(await conn.batch(filled(command, text), fence=1))
        (result,) = done["results"]
        assert result["status"] == "failure" and result["error"]["code"] == "invalid_arguments", result
        assert f"argument {device_field} contains a NUL byte" in result["error"]["message"]
        assert victim.read_text() == "still here\n"
        if not_created:
            assert not (device.workspace / not_created).exists()


def test_the_denied_program_still_runs_as_denied_without_a_nul(env: tuple[Fleet, Agent], victim: Path) -> None:
    """The control for the first case: the same DAG without the NUL reaches the deny list."""
    node = smuggled(env[0], "rm", shell([REF, VICTIM]))
    assert node["error"]["code"] == "policy_denied"
    assert victim.exists()


def test_data_that_never_reaches_a_syscall_may_hold_a_nul(env: tuple[Fleet, Agent]) -> None:
    """File content and stdin are bytes, not C strings: a NUL in them is data, written as sent."""
    f, agent = env
    data = "a\x00b"
    node = smuggled(
        f,
        data,
        {"tool": "files.write", "arguments": {"path": "with-nul.bin", "content": REF}},
    )
    assert node["state"] == "succeeded", node.get("error")
    assert (agent.workspace / "with-nul.bin").read_bytes() == b"a\x00b"
    node = smuggled(f, data, shell(["od", "-An", "-c"], stdin=REF))
    assert node["state"] == "succeeded", node.get("error")
    assert "\\0" in node["output"]["stdout"]


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (shell(["rm\x00x", VICTIM]), "argv.0"),
        (shell(["echo", "keep\x00DROPPED"]), "argv.1"),
        (shell(["true"], cwd="sub\x00x"), "cwd"),
        ({"tool": "files.read", "arguments": {"path": f"{VICTIM}\x00x"}}, "path"),
        ({"tool": "files.write", "arguments": {"path": "keep\x00DROPPED", "content": "x"}}, "path"),
    ],
)
def test_a_nul_is_refused_at_submission_naming_the_field(
    env: tuple[Fleet, Agent], victim: Path, command: dict[str, Any], field: str
) -> None:
    f, _ = env
    with f.server.client() as c:
        before = len(c.get("/v1/tasks", params={"limit": 500}).json()["items"])
        r = c.post("/v1/tasks", json={"dag": {"nodes": [{"id": "n", "placement": POOL, "commands": [command]}]}})
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["code"] == "invalid_arguments"
        (problem,) = body["problems"]
        assert problem["field"] == field
        assert "contains a NUL byte" in problem["message"]
        assert len(c.get("/v1/tasks", params={"limit": 500}).json()["items"]) == before
    assert victim.read_text() == "still here\n"
