"""A command never outlives its agent: after a `kill -9` of the agent mid-command, the restarted
agent kills what the command left running before it reports the call `uncertain`, so the node's
verify probe judges a device where nothing of the node runs any more, and its retry never runs
next to the first execution (SPEC section 4: a batch runs at most once; section 5).

The command does its work in a background subshell, which the parent-death signal of the
command's own program does not reach: only the restarted agent's sweep of what its ledger
recorded (the process group) and marked (the environment) ends it.
"""

from __future__ import annotations

import itertools
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.support import Fleet, wait_until

# One execution: marks its start, then beats every 0.1 s in a background subshell, and marks its
# end and a `finished` file (what the probe reads) when its beats are done. The first execution
# is long (it must still run when the agent comes back); a later one is short.
WORK = (
    "n=100; [ -e marks ] && n=10; "
    "( echo start $$ $(date +%s.%N) >> marks; i=0; "
    "while [ $i -lt $n ]; do echo beat $$ $(date +%s.%N) >> beats; sleep 0.1; i=$((i+1)); done; "
    "echo end $$ $(date +%s.%N) >> marks; touch finished ) & wait"
)


def dag() -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "work",
                "placement": {"device": "box"},
                "commands": [
                    {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", WORK]}, "idempotent": True},
                ],
                "retry": {"max_attempts": 3, "backoff_s": 0.1},
                "verify": [{"tool": "files.read", "arguments": {"path": "finished"}}],
            }
        ],
        "edges": [],
    }


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def executions(workspace: Path) -> dict[str, dict[str, float]]:
    """Per execution (its shell's pid): when it started, beat last, and ended (if it did)."""
    runs: dict[str, dict[str, float]] = {}
    for kind, run, at in lines(workspace / "marks") + lines(workspace / "beats"):
        entry = runs.setdefault(run, {})
        if kind == "beat":
            entry["last"] = max(entry.get("last", 0.0), float(at))
        else:
            entry[kind] = float(at)
    return runs


def processes_in(workspace: Path) -> list[int]:
    """Processes whose working directory is the workspace: the command's, wherever they went."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/cwd") == str(workspace):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def at(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_a_command_killed_with_its_agent_never_runs_next_to_its_retry_and_the_probe_sees_it_dead(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path) as fleet:
        box = fleet.agent("box")
        task = fleet.submit(dag())["id"]
        wait_until(lambda: executions(box.workspace), 30, "the command to start on the device")
        (first,) = executions(box.workspace)
        box.kill()  # kill -9 of the agent, mid-command
        box.start()
        done = fleet.wait_task(task, timeout=90)
        work = fleet.node(done, "work")
        runs = executions(box.workspace)
        attempts = work["attempts"]
        # The first execution was dead before the restarted agent reported it: its last beat
        # came before its attempt ended on the server, and before anything probed the device.
        last = runs[first]["last"]
        reported = at(attempts[0]["ended_at"])
        assert last < reported, f"the first execution ran {last - reported:.2f} s past its report: {runs}"
        for probe in (at(a["started_at"]) for a in attempts if a["kind"] == "verify"):
            assert last < probe, f"the probe ran while the first execution did: {runs}, {attempts}"
        assert "end" not in runs[first], f"the first execution finished after its agent died: {runs}"
        # No two executions overlapped in time.
        spans = sorted((r["start"], r.get("end", r.get("last", r["start"]))) for r in runs.values())
        for (_, one_ends), (other_starts, _) in itertools.pairwise(spans):
            assert one_ends < other_starts, f"two executions of the node overlapped: {runs}"
        # The node ended honestly: reported uncertain, saying what became of its processes,
        # then retried (its command is idempotent) and verified.
        assert attempts[0]["error"]["code"] == "uncertain", attempts
        assert re.search(r"the agent killed the \d+ process\(es\) it had left running", attempts[0]["error"]["message"])
        assert (done["state"], work["state"]) == ("succeeded", "succeeded"), attempts
        assert sum(1 for a in attempts if a["kind"] == "tool") == 2, attempts
        assert processes_in(box.workspace) == []
        assert "killed" in box.log() and "left running by the last run" in box.log(), box.log()[-3000:]
