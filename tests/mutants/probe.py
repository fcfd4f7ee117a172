"""A pytest plugin the mutant runner loads (`-p tests.mutants.probe`) in each run it starts.

It writes, to the JSON file named by ORRERY_MUTANT_PROBE, the file every product module was
imported from, the tests that failed and the tests that were skipped. The runner uses the first
to prove that the run tested the mutated copy and not the source tree an editable install points
at, the second to name the test that caught the mutant, and the third to say why a mutant was not
caught when a catching test was skipped (one that needs a server this machine lacks, say).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

PACKAGES = ("orchestrator", "device_agent", "protocol", "orrery", "migrations")
# Prototypes in the simulator whose rules have mutants too (tests/mutants/catalogue.py, PROTOTYPES).
PROTOTYPE_MODULES = ("tests.sim.shards",)
_failed: list[str] = []
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)
    if report.skipped and report.nodeid not in _skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("ORRERY_MUTANT_PROBE")
    if not target:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # each xdist worker imports the product itself: its own file beside the controller's
        target = f"{target}.{worker}"
    modules = {
        name: str(Path(file).resolve())
        for name, module in list(sys.modules.items())
        if (name.split(".", 1)[0] in PACKAGES or name in PROTOTYPE_MODULES)
        and (file := getattr(module, "__file__", None))
    }
    Path(target).write_text(json.dumps({"modules": modules, "failed": _failed, "skipped": _skipped}))
