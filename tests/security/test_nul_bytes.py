"""Issue 14 item 1: a NUL byte (U+0000) in a tool argument is refused with `invalid_arguments`
before anything runs, on the device itself and (where the schema says so) at submission.

The attack: under uvloop (the agent's loop when installed) a subprocess spawn cuts every string at
its first NUL, where stdlib asyncio raises. `argv[0] = "rm\\u0000x"` passed the shell deny list
(`rm\\u0000x` is not `rm`) and then ran `rm`; `"keep\\u0000DROPPED"` arrived as `keep`.

A device cannot trust the orchestrator, so the device tests get the NUL past the submission checks
the way a real submitter can: a `${nodes...}` reference, filled in at run time with the output of
an upstream `system.echo` (whose text may hold any character: it never reaches a syscall).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Agent, Fleet, shell

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


@pytest.mark.parametrize(
    ("text", "command", "field", "not_created"),
    [
        # the deny-list bypass: 'rm\0x' is not 'rm' to the policy, but uvloop spawned 'rm'
        ("rm\x00x", shell([REF, VICTIM]), "argv[0]", None),
        # silent truncation of an argument: 'keep\0DROPPED' would have arrived as 'keep'
        ("keep\x00DROPPED", shell(["touch", REF]), "argv[1]", "keep"),
        ("sub\x00x", shell(["touch", "made-in-cwd"], cwd=REF), "cwd", "sub/made-in-cwd"),
        ("keep\x00DROPPED", {"tool": "files.write", "arguments": {"path": REF, "content": "x"}}, "path", "keep"),
        ("keep\x00DROPPED", {"tool": "files.append", "arguments": {"path": REF, "content": "x"}}, "path", "keep"),
        (f"{VICTIM}\x00x", {"tool": "files.read", "arguments": {"path": REF}}, "path", None),
        (f"{VICTIM}\x00x", {"tool": "files.delete", "arguments": {"path": REF}}, "path", None),
        ("sub\x00x", {"tool": "files.list", "arguments": {"path": REF}}, "path", None),
        (".\x00x", {"tool": "system.disk", "arguments": {"path": REF}}, "path", None),
    ],
    ids=["argv0-deny-bypass", "argv-truncation", "cwd", "write", "append", "read", "delete", "list", "disk"],
)
def test_a_nul_reaching_the_device_is_refused_before_anything_runs(
    env: tuple[Fleet, Agent], victim: Path, text: str, command: dict[str, Any], field: str, not_created: str | None
) -> None:
    f, agent = env
    node = smuggled(f, text, command)
    assert node["state"] == "failed"
    assert node["error"]["code"] == "invalid_arguments", node["error"]
    assert f"argument {field} contains a NUL byte" in node["error"]["message"]
    assert victim.read_text() == "still here\n"
    if not_created:
        assert not (agent.workspace / not_created).exists()


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
