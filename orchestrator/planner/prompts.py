"""Prompt templates live as files in `prompts/`; this module renders them (Jinja2, strict)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

FOLDER = Path(__file__).parent / "prompts"


@cache
def _env() -> Environment:
    return Environment(
        loader=FileSystemLoader(FOLDER),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,  # prompts are plain text for a model, not HTML
    )


def render(name: str, **context: Any) -> str:
    return _env().get_template(name).render(**context).strip()


@cache
def example_plan() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FOLDER / "example_plan.json").read_text())
    return data
