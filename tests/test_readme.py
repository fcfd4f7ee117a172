"""The README's quick start is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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


def inline_orrery_commands() -> list[str]:
    """Every `orrery ...` inline code span of README.md and docs/*.md (spans may wrap lines)."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    spans: list[str] = []
    for path in texts:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
        spans += [" ".join(m.split()) for m in re.findall(r"`(orrery[^`]*)`", text)]
    return spans


def test_every_orrery_command_and_option_the_docs_name_exists() -> None:
    """Inline mentions (`orrery tasks rerun`, `orrery demo --keep`, ...) name real commands and
    options; the fenced sh blocks are run for real by tests/integration/test_docs_examples.py."""
    from orrery.cli import command

    root = command()
    missing = []
    for span in inline_orrery_commands():
        commands: list[Any] = [root]  # typer's own click types
        for word in span.split()[1:]:
            if word == "..." or word.isupper() or not re.fullmatch(r"[a-z][\w|-]*|--[\w-]+", word):
                if word.startswith("--"):
                    continue
                break
            if word.startswith("--"):
                flag = word
                if not any(flag in p.opts for c in commands for p in c.params):
                    missing.append(f"{span}: {flag}")
                continue
            groups = [c for c in commands if hasattr(c, "commands")]
            if not groups:
                continue  # an argument (a device name, KEY=VALUE, ...)
            found = [g.commands.get(name) for g in groups for name in word.split("|")]
            if not all(found):
                missing.append(f"{span}: {word}")
                break
            commands = [c for c in found if c is not None]
    assert not missing, missing
