"""Run the rule mutants (tests/mutants/catalogue.py): `scripts/mutants --help`.

Each run happens in a fresh copy of the tree (without .git, virtualenvs or caches), so the tree
itself is never touched, not even for a moment. First the catching tests of every chosen mutant
run once on an unmutated copy and must pass; then each mutant is applied to a copy of its own and
its catching tests run there with `-x` and must fail within the time limit. Every run is checked
to have imported the product from its copy (an editable install would otherwise import the
source tree and every mutant would survive unseen).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.mutants.catalogue import FAST_TIERS, MUTANTS, TIME_LIMIT_S, Mutant

ROOT = Path(__file__).resolve().parents[2]
# Not copied: version control, virtualenvs, caches and local data; none of it is needed to test.
SKIPPED_NAMES = frozenset(
    {
        ".git",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        "node_modules",
        ".orrery",
        ".orrery-agent",
        ".orrery-demo",
        "build",
        "dist",
        "test-artifacts",
    }
)
SKIPPED_PATHS = frozenset({".ci/npm"})
BASELINE_LIMIT_S = 600.0
INTERRUPT_GRACE_S = 10.0  # after Ctrl-C, how long a timed-out run may tear its fixtures down
PYTEST = ("-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-p", "tests.mutants.probe")


# ---------------------------------------------------------------- copies


def copy_tree(source: Path, target: Path) -> None:
    """`source` without what SKIPPED_NAMES and SKIPPED_PATHS name (a few MB: well under a second)."""

    def skipped(directory: str, names: list[str]) -> set[str]:
        here = Path(directory).relative_to(source).as_posix()
        return {
            n
            for n in names
            if n in SKIPPED_NAMES
            or n.endswith((".pyc", ".egg-info"))
            or (f"{n}" if here == "." else f"{here}/{n}") in SKIPPED_PATHS
        }

    shutil.copytree(source, target, ignore=skipped, symlinks=True)


class Rotted(Exception):
    """The catalogue no longer fits the code: a snippet is gone or ambiguous."""


def occurrences(mutant: Mutant, tree: Path) -> int:
    path = tree / mutant.file
    return path.read_text().count(mutant.original) if path.is_file() else 0


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.file
    found = occurrences(mutant, tree)
    if found != 1:
        raise Rotted(f"{mutant.id}: its snippet occurs {found} times in {mutant.file}, not once")
    path.write_text(path.read_text().replace(mutant.original, mutant.replacement))


# ---------------------------------------------------------------- runs


@dataclass
class Run:
    exit: int | None  # None: killed at the time limit
    seconds: float
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    modules: dict[str, str] = field(default_factory=dict)
    output: str = ""

    def foreign_modules(self, tree: Path) -> list[str]:
        """Product modules this run imported from anywhere but `tree`."""
        root = str(tree.resolve()) + os.sep
        return sorted(f"{name} ({file})" for name, file in self.modules.items() if not file.startswith(root))


def run_pytest(tree: Path, args: Sequence[str], limit: float) -> Run:
    """`python -m pytest ARGS` from `tree`, killed (Ctrl-C, then SIGKILL) after `limit` seconds."""
    probe = tree / ".mutant-probe.json"
    env = dict(os.environ, ORRERY_MUTANT_PROBE=str(probe))
    # The run must import the copy: nothing may put the source tree ahead of the copy's own root
    # (`python -m` puts the working directory first), and nothing may add options to the command.
    env.pop("PYTHONPATH", None)
    env.pop("PYTEST_ADDOPTS", None)
    # A mutant is compiled from its own source: never bytecode cached from the unmutated code
    # (a cache keyed by a path and a one-second mtime could hold it; scripts/check keeps one).
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, *PYTEST, *args],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends everything it started
    )
    try:
        output, _ = proc.communicate(timeout=limit)
        exit_code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        exit_code = None
        os.killpg(proc.pid, signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
    seconds = time.monotonic() - started
    run = Run(exit_code, seconds, output=output)
    for found in [probe, *tree.glob(".mutant-probe.json.*")]:  # the controller's, and each xdist worker's
        if not found.is_file():
            continue  # pytest never got as far as the end of its session (killed, or failed to start)
        data: dict[str, Any] = json.loads(found.read_text())
        run.modules.update(data["modules"])
        run.failed += [n for n in data["failed"] if n not in run.failed]
        run.skipped += [n for n in data["skipped"] if n not in run.skipped]
    return run


# ---------------------------------------------------------------- verdicts


@dataclass
class Verdict:
    mutant: Mutant
    caught: bool
    note: str  # the catching test, or why the mutant counts as not caught
    seconds: float


def judge(mutant: Mutant, tree: Path, run: Run) -> Verdict:
    def verdict(caught: bool, note: str) -> Verdict:
        return Verdict(mutant, caught, note, run.seconds)

    if run.exit is None:
        return verdict(False, f"NOT CAUGHT in time: still running after {TIME_LIMIT_S:g} s")
    unproven = provenance(run, tree)
    if unproven:
        return verdict(False, f"ERROR: {unproven}")
    if run.exit == 0 and run.skipped:
        return verdict(False, f"SURVIVED: catching tests were skipped: {', '.join(run.skipped)}")
    if run.exit == 0:
        return verdict(False, "SURVIVED: every catching test passed on the mutant")
    if run.exit != 1 or not run.failed:
        return verdict(False, f"ERROR: pytest exited {run.exit} (not a test failure):\n{tail(run.output)}")
    if mutant.module not in run.modules:
        return verdict(False, f"ERROR: the catching tests never imported {mutant.module}")
    if run.seconds > TIME_LIMIT_S:
        return verdict(False, f"NOT CAUGHT in time: {run.failed[0]} failed after {run.seconds:.1f} s")
    return verdict(True, run.failed[0])


def provenance(run: Run, tree: Path) -> str | None:
    """Why `run` cannot be shown to have tested the product in `tree` (None: it can)."""
    if not run.modules:
        return f"the run reported no product modules (did the probe plugin load?):\n{tail(run.output)}"
    foreign = run.foreign_modules(tree)
    if foreign:
        return f"the run imported the product from outside its copy: {', '.join(foreign[:3])}"
    return None


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def table(verdicts: Iterable[Verdict]) -> str:
    rows = [("rule", "mutant", "catching test", "seconds", "caught")]
    for v in verdicts:
        note = v.note if v.caught else v.note.splitlines()[0]
        rows.append((v.mutant.rule, v.mutant.id, note, f"{v.seconds:.1f}", "yes" if v.caught else "NO"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# ---------------------------------------------------------------- the whole run


def chosen(ids: Sequence[str]) -> list[Mutant]:
    by_id = {m.id: m for m in MUTANTS}
    unknown = [i for i in ids if i not in by_id]
    if unknown:
        raise SystemExit(f"no mutant {', '.join(unknown)}; `scripts/mutants --list` lists them")
    return [by_id[i] for i in ids] if ids else list(MUTANTS)


def check_catalogue(mutants: Sequence[Mutant], tree: Path) -> list[str]:
    """What is wrong with these entries before anything runs (each problem one line)."""
    problems = []
    for m in mutants:
        found = occurrences(m, tree)
        if found != 1:
            problems.append(f"{m.id}: its snippet occurs {found} times in {m.file}, not once (the catalogue rotted)")
        if not m.caught_by:
            problems.append(f"{m.id}: it names no catching test")
        problems += [
            f"{m.id}: {t} is not in {' or '.join(FAST_TIERS)}" for t in m.caught_by if not t.startswith(FAST_TIERS)
        ]
    return problems


def run_all(mutants: Sequence[Mutant], jobs: int, keep: bool, say: Callable[[str], None]) -> int:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="orrery-mutants-"))
    try:
        pristine = work / "pristine"
        copy_tree(ROOT, pristine)
        problems = check_catalogue(mutants, pristine)
        if problems:
            say("\n".join(problems))
            return 2

        tests = list(dict.fromkeys(t for m in mutants for t in m.caught_by))
        say(f"baseline: {len(tests)} catching tests on the unmutated tree")
        base_tree = work / "baseline"
        copy_tree(pristine, base_tree)
        base = run_pytest(base_tree, tests, BASELINE_LIMIT_S)
        unproven = provenance(base, base_tree) if base.exit == 0 else None
        if base.exit != 0 or unproven or base.skipped:
            why = unproven or tail(base.output)
            if base.skipped and not unproven:
                why = f"skipped, so they would catch nothing: {', '.join(base.skipped)}\n{why}"
            say(f"baseline FAILED ({base.seconds:.1f} s): the catching tests must pass on the unmutated tree; {why}")
            return 1
        say(f"baseline: passed in {base.seconds:.1f} s")

        def one(mutant: Mutant) -> Verdict:
            tree = work / mutant.id
            copy_tree(pristine, tree)
            apply(mutant, tree)
            verdict = judge(mutant, tree, run_pytest(tree, ["-x", *mutant.caught_by], TIME_LIMIT_S))
            say(f"{mutant.id}: {'caught' if verdict.caught else 'NOT caught'} ({verdict.seconds:.1f} s)")
            if not verdict.caught and "\n" in verdict.note:
                say(verdict.note)
            if not keep:
                shutil.rmtree(tree, ignore_errors=True)
            return verdict

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            verdicts = list(pool.map(one, mutants))
        say("")
        say(table(verdicts))
        escaped = [v.mutant.id for v in verdicts if not v.caught]
        total = time.monotonic() - started
        if escaped:
            say(f"\n{len(escaped)} of {len(verdicts)} mutants not caught: {', '.join(escaped)} ({total:.0f} s in all)")
            return 1
        say(f"\nall {len(verdicts)} mutants caught ({total:.0f} s in all)")
        return 0
    finally:
        if keep:
            say(f"copies kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def survey(mutant: Mutant, jobs: int, say: Callable[[str], None]) -> int:
    """The whole fast tier on the mutant (no -x): every test that fails on it, to choose from."""
    work = Path(tempfile.mkdtemp(prefix="orrery-mutants-"))
    try:
        tree = work / mutant.id
        copy_tree(ROOT, tree)
        apply(mutant, tree)
        args = ["-n", str(jobs)] if jobs > 1 else []
        # The catalogue's own test fails on every mutant (its snippet is gone): it tells nothing.
        ignore = "--ignore=tests/unit/test_mutant_catalogue.py"
        run = run_pytest(tree, [*args, "--timeout", "120", ignore, *FAST_TIERS], BASELINE_LIMIT_S * 2)
        unproven = provenance(run, tree)
        if unproven:
            say(f"ERROR: {unproven}")
            return 1
        say(f"{mutant.id}: {len(run.failed)} fast tests fail on it ({run.seconds:.0f} s, pytest exit {run.exit})")
        for nodeid in run.failed:
            say(f"  {nodeid}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/mutants",
        description="Apply each rule mutant to a copy of the tree and require its fast catching tests to fail "
        f"(within {TIME_LIMIT_S:g} s each) where they pass on the unmutated tree.",
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="only these mutants (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default: 2)")
    parser.add_argument("--keep", action="store_true", help="keep the copies (their path is printed)")
    parser.add_argument(
        "--survey", action="store_true", help="run the whole fast tier on each ID and list what fails (slow)"
    )
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(line, flush=True)

    mutants = chosen(args.ids)
    if args.list:
        for m in mutants:
            say(f"{m.id}\n  rule: {m.rule}\n  file: {m.file}")
            for t in m.caught_by:
                say(f"  caught by: {t}")
        return 0
    if args.survey:
        if not args.ids:
            raise SystemExit("--survey runs the whole fast tier per mutant: name the mutants")
        return max(survey(m, args.jobs, say) for m in mutants)
    return run_all(mutants, args.jobs, args.keep, say)


if __name__ == "__main__":
    sys.exit(main())
