"""docs/tutorial.md runs as a reader follows it: every sh block in order, as one session.

The server started in the tutorial's first blocks, the devices it enrolls and the agents it starts
serve its later blocks, as they do for a reader; its YAML files are written as the reader saves
them. The session (tests/integration/test_docs_examples.py) makes only the changes it documents:
a free port for 8765, each `orrd_...` the token the matching `orrery devices enroll` printed, and
`apr_...` the approval that is pending. Any command that fails fails this test, naming its block.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakellm import FakeLLM
from tests.integration.test_docs_examples import (
    SHELL,
    TUTORIAL,
    TUTORIAL_NOT_RUN,
    Session,
    code_blocks,
    finish_steps,
    runnable_lines,
    write_named_files,
)


@pytest.fixture()
def llm() -> Iterator[FakeLLM]:
    model = FakeLLM()
    model.add(*finish_steps())
    yield model
    model.close()


def tutorial_lines() -> list[tuple[str, str]]:
    """(where, line) of every line the tutorial asks the reader to run, in order."""
    return [
        (block.where, line)
        for block in code_blocks([TUTORIAL])
        if block.lang in SHELL
        for line in runnable_lines(block, TUTORIAL_NOT_RUN)
    ]


def test_the_tutorial_has_the_steps_it_promises() -> None:
    """The extraction: the steps are found, and every file it saves is used by a later command."""
    blocks = code_blocks([TUTORIAL])
    lines = [line for _where, line in tutorial_lines()]
    for step in (
        "orrery serve",
        "orrery devices enroll analysis",
        "orrery agent",
        "orrery devices list",
        "orrery tools",
        "orrery validate",
        "orrery submit",
        "orrery approvals approve",
        "orrery tasks rerun",
        "orrery devices stop",
        "orrery devices resume",
        "kill %1",
    ):
        assert any(line.split("#")[0].find(step) >= 0 for line in lines), step
    assert sum("orrery agent" in line for line in lines) == 3, lines
    files = [b.file_name for b in blocks if b.file_name]
    assert files, "the tutorial saves its DAGs as files"
    for name in files:
        assert any(name in line for line in lines), f"{name} is saved but no command uses it"
    # Only runnable blocks: a yaml block that is not a file the session writes would go unchecked.
    for block in blocks:
        assert block.lang in (*SHELL, "yaml") and (block.lang in SHELL or block.file_name), block.where


def test_the_tutorial_runs_as_written_in_one_session(tmp_path: Path, llm: FakeLLM) -> None:
    write_named_files(code_blocks([TUTORIAL]), tmp_path)
    session = Session(tmp_path, llm, tls=False)
    try:
        for where, line in tutorial_lines():
            session.where = where
            try:
                session.run(line)
            except AssertionError as exc:  # later lines need this one: stop at the first failure
                raise AssertionError(
                    f"{where}: {line}\n    {str(exc).strip()}\n\nbackground logs:\n{session.logs()}"
                ) from exc
        with session.http() as c:
            tasks = c.get("/v1/tasks", params={"limit": 50}).json()["items"]
            devices = {d["name"]: d for d in c.get("/v1/devices").json()["items"]}
            approvals = c.get("/v1/approvals").json()["items"]
            rerun = c.get(f"/v1/tasks/{tasks[0]['id']}").json()
        # first, publish, and first again from `count`: all succeeded
        assert [(t["name"], t["state"]) for t in reversed(tasks)] == [
            ("first", "succeeded"),
            ("publish", "succeeded"),
            ("first", "succeeded"),
        ], tasks
        ran = {n["id"]: len(n["attempts"]) for n in rerun["nodes"]}
        assert ran["count"] == 1 and ran["uname"] == 0 and ran["save"] == 0, ran
        assert [a["state"] for a in approvals] == ["approved"], approvals
        # `kill %1 %2 %3`: each agent said goodbye, so its device is offline at once
        assert {name: d["state"] for name, d in devices.items()} == dict.fromkeys(
            ("web-1", "web-2", "analysis"), "offline"
        ), devices
        # step 7's viewer key signs in to the dashboard
        viewer = re.search(r"orrk_\S+", "\n".join(t for t in session.transcript if "api-keys create" in t))
        assert viewer, session.transcript
        assert "<html" in httpx.get(f"{session.url}/", timeout=10).text.lower()
        seen = httpx.get(f"{session.url}/v1/tasks", headers={"Authorization": f"Bearer {viewer.group()}"}, timeout=10)
        assert seen.status_code == 200 and len(seen.json()["items"]) == 3, seen.text
    finally:
        session.stop()
