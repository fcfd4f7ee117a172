"""Prompt templates live as files in `prompts/`; this module renders them (Jinja2, strict).

A deployment can supply its own (`ORRERY_PROMPTS_DIR`): a file there with the name of a built-in
template (or `example_plan.json`) replaces it, includes too; any template it does not have falls
back to the built-in one. The directory is checked at start-up (`check_dir`: every template in it
must parse, the example plan must be JSON), and a template that fails to render later is a
`PromptError` the caller turns into a failed plan or agent node, never a server error.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, StrictUndefined, TemplateError

FOLDER = Path(__file__).parent / "prompts"
EXAMPLE_PLAN = "example_plan.json"

_override: Path | None = None


class PromptError(Exception):
    """A prompt template (built-in or overridden) is broken; `message` says which and how."""

    code = "prompt_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def builtin_names() -> list[str]:
    return sorted(p.name for p in FOLDER.iterdir() if p.suffix in (".j2", ".json"))


def check_dir(folder: Path) -> list[str]:
    """Validate an override directory; the names it overrides. Raises PromptError (with every
    problem found) when it is not a directory, a template does not parse or the example is not JSON."""
    if not folder.is_dir():
        raise PromptError(f"prompts directory {str(folder)!r} does not exist or is not a directory")
    problems: list[str] = []
    env = _new_env(folder)
    overridden = []
    for path in sorted(folder.iterdir()):
        if path.name == EXAMPLE_PLAN:
            try:
                json.loads(path.read_text())
            except (ValueError, OSError) as exc:
                problems.append(f"{path.name} is not valid JSON ({exc})")
            overridden.append(path.name)
        elif path.suffix == ".j2":
            try:
                env.parse(path.read_text())
            except TemplateError as exc:
                line = getattr(exc, "lineno", None)
                problems.append(f"{path.name}{f' line {line}' if line else ''}: {exc}")
            except OSError as exc:
                problems.append(f"{path.name} cannot be read ({exc})")
            overridden.append(path.name)
    if problems:
        raise PromptError(
            f"the prompt templates in {str(folder)!r} are broken: " + "; ".join(problems) + ". Fix them, or "
            "remove the files to use the built-in templates"
        )
    return overridden


def configure(folder: Path | None) -> None:
    """Use the templates of `folder` before the built-in ones (None: the built-in ones only)."""
    global _override
    if folder is not None:
        check_dir(folder)
    _override = folder
    _env.cache_clear()
    example_plan.cache_clear()


def _new_env(folder: Path | None) -> Environment:
    loaders = [FileSystemLoader(folder)] if folder is not None else []
    return Environment(
        loader=ChoiceLoader([*loaders, FileSystemLoader(FOLDER)]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        autoescape=False,  # prompts are plain text for a model, not HTML
    )


@cache
def _env() -> Environment:
    return _new_env(_override)


def render(name: str, **context: Any) -> str:
    try:
        return _env().get_template(name).render(**context).strip()
    except TemplateError as exc:
        where = f"in {str(_override)!r} (ORRERY_PROMPTS_DIR) or built in" if _override else "built in"
        raise PromptError(
            f"the prompt template {name} ({where}) failed to render: {type(exc).__name__}: {exc}; "
            f"fix the template (it may use only the variables the built-in {name} uses)"
        ) from exc


@cache
def example_plan() -> dict[str, Any]:
    path = _override / EXAMPLE_PLAN if _override is not None else None
    if path is None or not path.is_file():
        path = FOLDER / EXAMPLE_PLAN
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise PromptError(f"the example plan {str(path)!r} cannot be read as JSON: {exc}") from exc
    return data
