"""Prompt templates from a deployment's directory: same name replaces, missing falls back, broken is
a clear error naming the file (at start-up for syntax, at render time for the rest)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.config import Settings
from orchestrator.planner import prompts

AGENT = {"device": {"name": "d1", "platform": "linux"}, "instruction": "press it", "max_steps": 3, "tools": "T"}


@pytest.fixture(autouse=True)
def builtin_after() -> Iterator[None]:
    yield
    prompts.configure(None)


def test_the_built_in_agent_templates_carry_a_worked_example() -> None:
    vision = prompts.render("agent_system_vision.j2", **AGENT)
    assert "A worked example" in vision and "gui.observe" in vision and "Verify" in vision and "finish" in vision
    text = prompts.render("agent_system_text.j2", **AGENT)
    assert "A worked example" in text and "gui.observe" not in text


def test_a_file_of_the_same_name_replaces_the_template_and_the_rest_fall_back(tmp_path: Path) -> None:
    (tmp_path / "agent_common.j2").write_text("HOUSE RULES for {{ device.name }}: {{ instruction }}")
    (tmp_path / "example_plan.json").write_text(
        '{"request": "own request", "plan": {"nodes": [{"id": "own-example"}]}}'
    )
    assert prompts.check_dir(tmp_path) == ["agent_common.j2", "example_plan.json"]
    prompts.configure(tmp_path)
    vision = prompts.render("agent_system_vision.j2", **AGENT)  # built in, including the override
    assert vision.startswith("HOUSE RULES for d1: press it") and "A worked example" in vision
    assert prompts.example_plan()["plan"] == {"nodes": [{"id": "own-example"}]}
    assert "own-example" in prompts.render("plan_system.j2", example=prompts.example_plan())
    prompts.configure(None)
    assert "HOUSE RULES" not in prompts.render("agent_system_vision.j2", **AGENT)


def test_a_template_that_does_not_parse_is_refused_at_start_up_with_its_name(tmp_path: Path) -> None:
    (tmp_path / "plan_user.j2").write_text("fine {{ request }}")
    (tmp_path / "agent_common.j2").write_text("line one\n{% if device %}never closed")
    with pytest.raises(prompts.PromptError) as caught:
        prompts.configure(tmp_path)
    assert "agent_common.j2 line 2" in caught.value.message and "plan_user.j2" not in caught.value.message
    with pytest.raises(ValidationError) as invalid:
        Settings(prompts_dir=tmp_path)
    assert "agent_common.j2" in str(invalid.value)
    with pytest.raises(ValidationError, match="does not exist"):
        Settings(prompts_dir=tmp_path / "missing")
    (tmp_path / "agent_common.j2").unlink()
    (tmp_path / "example_plan.json").write_text("{not json")
    with pytest.raises(prompts.PromptError, match=r"example_plan\.json is not valid JSON"):
        prompts.check_dir(tmp_path)


def test_a_template_that_fails_to_render_is_a_prompt_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "agent_common.j2").write_text("{{ no_such_variable }}")
    prompts.configure(tmp_path)
    with pytest.raises(prompts.PromptError) as caught:
        prompts.render("agent_system_text.j2", **AGENT)
    assert caught.value.code == "prompt_error"
    assert "agent_common.j2" in caught.value.message or "agent_system_text.j2" in caught.value.message
    assert "no_such_variable" in caught.value.message and "ORRERY_PROMPTS_DIR" in caught.value.message
