"""deploy/env.example documents every setting with its current default (SPEC section 8).

The settings classes are the source of truth: a new setting, a renamed one or a changed default
without the matching line in env.example fails here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from device_agent.config import AgentConfig
from orchestrator.config import Settings
from tests.deploy.compose_env import ROOT

ENV_EXAMPLE = ROOT / "deploy" / "env.example"
LINE = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$")
CLASSES: list[tuple[type[BaseSettings], str]] = [(Settings, "ORRERY_"), (AgentConfig, "ORRERY_AGENT_")]
# Read by docker-compose.yml or deploy/agent-entrypoint.sh, not by the settings classes.
COMPOSE_ONLY = {
    "POSTGRES_PASSWORD",
    "POSTGRES_USER",
    "POSTGRES_DB",
    "ENROLL_NAME",
    "ENROLL_TRIES",
    "ENROLL_ON_CONFLICT",
    "COMPOSE_PROJECT_NAME",
    "LB_PORT",
}


def documented() -> dict[str, list[str]]:
    """Every `NAME=value` line, commented out or not: name -> the values given for it."""
    found: dict[str, list[str]] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if m := LINE.match(line.strip()):
            found.setdefault(m.group(1), []).append(m.group(2))
    return found


def setting_names() -> dict[str, tuple[type[BaseSettings], str]]:
    return {f"{prefix}{name.upper()}": (cls, name) for cls, prefix in CLASSES for name in cls.model_fields}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for key in list(os.environ):
        if key.startswith("ORRERY_"):
            monkeypatch.delenv(key)
    yield monkeypatch


def test_every_setting_is_in_env_example() -> None:
    missing = sorted(set(setting_names()) - set(documented()))
    assert missing == [], f"add these to deploy/env.example with their default and a comment: {missing}"


def test_env_example_names_no_setting_that_does_not_exist() -> None:
    stale = sorted(set(documented()) - set(setting_names()) - COMPOSE_ONLY)
    assert stale == [], f"deploy/env.example names settings that no longer exist: {stale}"


def test_every_setting_line_has_a_comment_above_it() -> None:
    lines = ENV_EXAMPLE.read_text().splitlines()
    names = setting_names()
    for i, line in enumerate(lines):
        m = LINE.match(line.strip())
        if m and m.group(1) in names and line.startswith("#"):
            above = lines[i - 1]
            assert above.startswith("# ") and not LINE.match(above), f"{m.group(1)} needs a one-line comment above it"


def reference_values() -> dict[str, str]:
    """The commented-out reference line of each setting: `# NAME=default`."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        m = LINE.match(line.strip())
        if m and line.startswith("#"):
            values[m.group(1)] = m.group(2)
    return values


@pytest.mark.parametrize(("cls", "prefix"), CLASSES, ids=["orchestrator", "agent"])
def test_documented_defaults_are_the_real_defaults(
    cls: type[BaseSettings], prefix: str, clean_env: pytest.MonkeyPatch
) -> None:
    """Load the documented values the way a container gets them (environment variables) and
    compare with a configuration built from no environment at all. An empty value means unset."""
    values = reference_values()
    undocumented = [n for n in cls.model_fields if f"{prefix}{n.upper()}" not in values]
    assert undocumented == [], f"no '# {prefix}NAME=default' line for {undocumented}"
    defaults: dict[str, Any] = cls().model_dump()
    for name in cls.model_fields:
        value = values[f"{prefix}{name.upper()}"]
        if value == "":
            assert defaults[name] in (None, ""), f"{prefix}{name.upper()} defaults to {defaults[name]!r}, not unset"
        else:
            clean_env.setenv(f"{prefix}{name.upper()}", value)
    assert cls().model_dump() == defaults


def test_compose_secrets_are_left_blank_for_the_operator() -> None:
    lines = ENV_EXAMPLE.read_text().splitlines()
    for name in ("POSTGRES_PASSWORD", "ORRERY_SECRET_KEY", "ORRERY_ADMIN_KEY"):
        assert f"{name}=" in lines, f"{name}= (uncommented, empty) must be in the required section"
