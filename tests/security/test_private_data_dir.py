"""Issue 14 item 9: the agent's data dir is 0700 and every file in it 0600 (directories 0700),
whatever the umask, even when the data dir already existed 0755 and an older agent left its ledger
0644. The ledger holds every command's full arguments and results; SQLite's `-wal` and `-shm`
companions hold the same rows, and SQLite would create all three 0644 less the umask.

Real agents under umask 022 (the common default) and 000 (the worst), doing real work, walked
while they run (the `-wal` and `-shm` files exist only while the ledger is open).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_agent.datadir import make_private
from tests.support import Fleet, shell, wait_until


def modes(data_dir: Path, workspace: Path) -> dict[str, int]:
    """Every path under `data_dir` with its permission bits, the workspace's contents left out, and
    `agent.log`: the test harness's redirect of the agent's output, which the agent never creates."""
    out = {".": stat.S_IMODE(data_dir.stat().st_mode)}
    for root, dirs, files in os.walk(data_dir):
        if Path(root) == workspace:
            dirs[:] = []
            continue
        for name in [*dirs, *files]:
            path = Path(root, name)
            if path != data_dir / "agent.log":
                out[str(path.relative_to(data_dir))] = stat.S_IMODE(path.lstat().st_mode)
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("private")) as f:
        yield f


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_the_data_dir_and_everything_the_agent_keeps_in_it_are_private(fleet: Fleet, umask: int) -> None:
    name = f"private-{umask:03o}"
    previous = os.umask(umask)
    try:
        agent = fleet.agent(name, {"pool": name}, start=False)
        agent.data_dir.mkdir(parents=True, mode=0o755)
        os.chmod(agent.data_dir, 0o755)
        # What an older agent left behind: a ledger (and its WAL) created 0644, an audit log.
        sqlite3.connect(agent.data_dir / "ledger.sqlite3").close()
        for leftover in ("ledger.sqlite3", "audit.jsonl"):
            (agent.data_dir / leftover).touch()
            os.chmod(agent.data_dir / leftover, 0o644)
        agent.start()  # inherits the umask
        fleet.wait_device(agent.device_id, "idle")
    finally:
        os.umask(previous)
    dag = {
        "nodes": [
            {
                "id": "work",
                "placement": {"labels": {"pool": name}},
                "commands": [
                    {"tool": "files.write", "arguments": {"path": "note.txt", "content": "secret argument"}},
                    shell(["cat", "note.txt"]),
                ],
            }
        ]
    }
    task = fleet.wait_task(fleet.submit(dag)["id"])
    assert task["state"] == "succeeded", task
    wal = agent.data_dir / "ledger.sqlite3-wal"
    wait_until(lambda: wal.exists() and (agent.data_dir / "ledger.sqlite3-shm").exists(), 10, "the ledger's WAL")

    found = modes(agent.data_dir, agent.workspace)
    for must in ("ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm", "audit.jsonl", "agent.lock"):
        assert must in found, sorted(found)
    wrong = {
        path: f"{mode:04o}"
        for path, mode in found.items()
        if mode != (0o700 if path in (".", "workspace") or (agent.data_dir / path).is_dir() else 0o600)
    }
    assert wrong == {}
    assert "tightened it to 0700" in agent.log()
    assert "ledger.sqlite3 (0644)" in agent.log()


def test_tightening_touches_only_the_agents_own_files_and_never_follows_a_symlink(tmp_path: Path) -> None:
    """A data dir may be pointed at a directory holding other things (`--data-dir ~`): those keep
    their modes; so does whatever a symlink at one of the agent's names points at."""
    outside = tmp_path / "outside.txt"
    outside.write_text("not the agent's")
    os.chmod(outside, 0o644)
    data = tmp_path / "data"
    (data / "bin").mkdir(parents=True)
    os.chmod(data, 0o755)
    (data / "bin" / "tool.sh").write_text("#!/bin/sh\n")
    os.chmod(data / "bin" / "tool.sh", 0o755)
    (data / "notes.txt").write_text("the owner's")
    os.chmod(data / "notes.txt", 0o644)
    (data / "audit.jsonl").symlink_to(outside)
    (data / "ledger.sqlite3").write_bytes(b"")
    os.chmod(data / "ledger.sqlite3", 0o644)
    (data / "screenshots").mkdir(mode=0o755)
    (data / "screenshots" / "a.png").write_bytes(b"x")
    os.chmod(data / "screenshots" / "a.png", 0o664)

    make_private(data)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(data) == 0o700 and mode(data / "ledger.sqlite3") == 0o600
    assert mode(data / "screenshots") == 0o700 and mode(data / "screenshots" / "a.png") == 0o600
    assert mode(outside) == 0o644  # the link's target is not the agent's to change
    assert mode(data / "notes.txt") == 0o644 and mode(data / "bin" / "tool.sh") == 0o755
