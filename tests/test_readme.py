"""The README's quick start is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the quick start has a sh block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_the_quick_start_has_exactly_two_commands_demo_then_tests() -> None:
    demo, tests = quick_start_commands()
    assert demo.endswith("orrery demo")
    assert tests.endswith("scripts/check")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    _demo, tests = quick_start_commands()
    # CI may quieten pip; otherwise the command is the same.
    assert tests.replace("pip install -q", "pip install") in ci.replace("pip install -q", "pip install")
