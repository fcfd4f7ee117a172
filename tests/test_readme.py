"""The README is a landing page whose quick start is what CI runs; the docs name no issue numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

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


def doc_pages() -> list[Path]:
    """README.md and every page of the docs site (docs/**/*.md; docs/hooks is the site's code)."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if p.relative_to(docs).parts[0] != "hooks")]


def inline_orrery_commands() -> list[str]:
    """Every `orrery ...` inline code span of README.md and docs/**/*.md (spans may wrap lines)."""
    spans: list[str] = []
    for path in doc_pages():
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
                if flag == "--help":
                    continue  # click adds it to every command, outside `params`
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


# "issue 20", "Issue 16's", "issues 3", "#12", "(#7)"; not a cron's `SUN#5` or an HTML entity.
ISSUE_REFERENCE = re.compile(r"(?i)\bissues?\s+#?\d+|(?<![\w&/#])#\d+\b")


def test_the_readme_is_a_landing_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; details belong in docs/"


def test_the_readme_and_the_docs_name_no_issue_numbers() -> None:
    """History, with its issue numbers, belongs in CHANGELOG.md; users never see our issues."""
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in doc_pages()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_REFERENCE.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_issue_pattern_catches_issue_references_and_nothing_else() -> None:
    for text in ("issue 20: a fan-out", "### Issue 16's second pass", "fixed in #12", "(#7)", "issues 3 and 4"):
        assert ISSUE_REFERENCE.search(text), text
    for text in ("`0 0 30 2 SUN#5`", "`MON#2`", "&#39;", "#/approvals", "the 20 issues", "heading ## 2"):
        assert not ISSUE_REFERENCE.search(text), text


def relative_links(text: str) -> list[str]:
    """Targets of Markdown links and images that are paths in the repository (not URLs, not anchors)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"[a-z][\w+.-]*:|#", t)]


def test_every_relative_link_of_the_readme_resolves_to_a_file() -> None:
    links = relative_links((ROOT / "README.md").read_text())
    assert links, "the README links into docs/"
    missing = [link for link in links if not (ROOT / link.split("#", 1)[0]).is_file()]
    assert not missing, missing
    assert any(link.startswith("docs/") and link.endswith(".md") for link in links), links


# ---------------------------------------------------------------- deploy/README.md

DEPLOY_README = ROOT / "deploy" / "README.md"


def published_port() -> tuple[str, str]:
    """(variable, default) of the host port `lb` publishes: `${LB_PORT:-8765}:8765`."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    (mapping,) = compose["services"]["lb"]["ports"]
    m = re.fullmatch(r"\$\{(\w+):-(\d+)\}:\d+", str(mapping))
    assert m, f"lb's port is not `${{VARIABLE:-default}}:port`: {mapping!r}"
    return m.group(1), m.group(2)


def test_the_deploy_readme_moves_the_published_port_with_the_variable_compose_reads() -> None:
    variable, default = published_port()
    text = DEPLOY_README.read_text()
    commands = "\n".join(re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S))
    set_port = re.search(r"^echo (\w+)=(\d+) >> \.env$", commands, re.M)
    assert set_port, "deploy/README.md shows how to set the published port in .env"
    name, port = set_port.groups()
    assert name == variable, f"deploy/README.md sets {name}; docker-compose.yml reads {variable}"
    assert port != default
    assert f"ORRERY_URL=http://localhost:{port}" in commands, "the CLI is pointed at the moved port"
    assert f"`{variable}` in `.env` (default {default}" in text, "the prose names the variable and its default"


def test_env_example_names_the_same_variable_and_default() -> None:
    variable, default = published_port()
    assert f"# {variable}={default}\n" in (ROOT / "deploy" / "env.example").read_text()
