"""Where a round trip's time goes: a chain of no-op nodes on a real `orrery serve` and a real
`orrery agent` (as `bench/rtt.py` runs them, with the task's event stream followed), with
timestamp probes loaded into both processes (bench/probe/sitecustomize.py). The probes note
CLOCK_MONOTONIC, which both processes share, on entry to and exit from each step of the path;
this prints the p50 of each step over the chain, in the order a node goes round.

The probes cost a few microseconds each, so the total here is a little above `bench/rtt.py`'s.

With `--store postgres` the server runs on a throwaway durable Postgres (bench/stores.py), and
the group commit step is a Postgres transaction. One replica only: the probes follow one server
process's steps in order.

    python bench/rtt_timeline.py [--nodes 1000] [--store sqlite|postgres]
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stores import STORES, check_refused, cluster, labels, refuse_store
from tests.support import ROOT

# The steps of one round, in order: (from note, to note, what happens between them).
STEPS = [
    ("A.frame_out<", "S.frame_in>", "hop: agent to server"),
    ("S.frame_in>", "S.frame_in<", "server: result frame decoded, handed to the engine"),
    ("S.frame_in<", "S.step>", "server: engine wakes"),
    ("S.step>", "S.commit>", "server: results applied, next node placed, attempt opened"),
    ("S.commit>", "S.commit<", "server: group commit"),
    ("S.commit<", "S.frame_out>", "server: effects up to the frame"),
    ("S.frame_out>", "S.frame_out<", "server: frame written to the socket"),
    ("S.frame_out<", "A.frame_in<", "hop: server to agent"),
    ("A.frame_in<", "A.receipt>", "agent: frame decoded and checked"),
    ("A.receipt>", "A.receipt<", "agent: receipt committed"),
    ("A.receipt<", "A.call_started>", "agent: executor wakes"),
    ("A.call_started>", "A.call_started<", "agent: command start committed"),
    ("A.call_started<", "A.call>", "agent: to the router"),
    ("A.call>", "A.call<", "agent: the call (checks, audit lines, the tool, its result)"),
    ("A.call<", "A.results_stored>", "agent: results shaped for the frame"),
    ("A.results_stored>", "A.results_stored<", "agent: results committed"),
    ("A.results_stored<", "A.frame_out>", "agent: result frame built"),
    ("A.frame_out>", "A.frame_out<", "agent: frame written to the socket"),  # ends the round
]
SEQUENCE = [a for a, _, _ in STEPS]


def rounds(notes: list[tuple[int, str]]) -> list[dict[str, int]]:
    """Walk the notes of both processes in time order and cut them into rounds, each note
    taken when it is the next one the round expects (heartbeats and the like are skipped).
    A round starts with the agent's previous result frame written and ends as it writes the next."""
    out: list[dict[str, int]] = []
    current: dict[str, int] = {}
    for t, label in notes:
        if label != SEQUENCE[len(current)]:
            continue
        current[label] = t
        if len(current) == len(SEQUENCE):
            out.append(current)
            current = {}
    return out


ONE_REPLICA = "the probes follow one server process's steps in order (a relayed frame crosses two)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--store", choices=STORES, default="sqlite", help="the orchestrator's store (bench/stores.py)")
    refuse_store(parser, ONE_REPLICA, store=False)
    args = parser.parse_args()
    check_refused(parser, args, ONE_REPLICA, store=False)
    with tempfile.TemporaryDirectory() as noted:
        prefix = f"{noted}/notes"
        os.environ["BENCH_TIMELINE"] = prefix
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "bench" / "probe"), os.environ.get("PYTHONPATH", "")])
        with cluster(args.store) as fleet:
            fleet.agent("bench")
            ids = [f"n{i}" for i in range(args.nodes)]
            dag = {
                "nodes": [{"id": n, "commands": [{"tool": "system.echo", "arguments": {"text": "x"}}]} for n in ids],
                "edges": [{"from": a, "to": b} for a, b in itertools.pairwise(ids)],
            }
            task = fleet.wait_task(fleet.submit(dag)["id"], timeout=600)
            assert task["state"] == "succeeded", task["state"]
        notes = []
        for path in glob.glob(f"{prefix}.*"):
            for line in Path(path).read_text().splitlines():
                t, label = line.split(" ", 1)
                notes.append((int(t), label))
    notes.sort()
    done = rounds(notes)
    done = done[len(done) // 10 :]  # the first rounds warm caches
    if not done:
        raise SystemExit("no complete round was noted: are the probes loaded?")
    print(f"\none round of a chained no-op node on {args.store}, p50 over {len(done)} rounds (µs)\n")
    total = 0.0
    table = {}
    for i, (a, b, what) in enumerate(STEPS):
        if i < len(STEPS) - 1:
            spans = [(r[b] - r[a]) / 1000 for r in done]
        else:  # the frame written: the next round starts
            spans = [(r2[b] - r1[a]) / 1000 for r1, r2 in itertools.pairwise(done)]
        p50 = statistics.median(spans)
        total += p50
        table[what] = p50
        print(f"  {what:62} {p50:8.1f}")
    cycle = [(r2[SEQUENCE[0]] - r1[SEQUENCE[0]]) / 1000 for r1, r2 in itertools.pairwise(done)]
    print(f"\n  {'sum of the steps':62} {total:8.1f}")
    print(f"  {'one round, measured (p50)':62} {statistics.median(cycle):8.1f}")
    print(json.dumps({"steps_us": table, "round_p50_us": statistics.median(cycle), **labels(args)}))


if __name__ == "__main__":
    main()
