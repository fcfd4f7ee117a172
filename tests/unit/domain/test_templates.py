"""`${nodes.X...}` references resolve with their type when whole, as text when embedded."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.domain import templates

OUTCOMES: dict[str, dict[str, Any]] = {
    "a": {"output": {"stdout": "hi\n", "items": [{"n": 1}]}, "results": [{"result": {"x": 5}}]},
    "b": {"output": 42, "results": []},
}


def lookup(node: str) -> dict[str, Any] | None:
    return OUTCOMES.get(node)


def test_a_whole_reference_keeps_its_type() -> None:
    assert templates.resolve("${nodes.b.output}", lookup) == 42
    assert templates.resolve("${nodes.a.output.items[0]}", lookup) == {"n": 1}
    assert templates.resolve("${nodes.a.results[0].result.x}", lookup) == 5


def test_an_embedded_reference_becomes_text_and_json_for_objects() -> None:
    assert templates.resolve("n=${nodes.b.output}!", lookup) == "n=42!"
    assert templates.resolve("v=${nodes.a.output.items}", lookup) == 'v=[{"n": 1}]'


def test_references_are_found_in_nested_arguments() -> None:
    args = {"argv": ["echo", "${nodes.a.output.stdout}"], "env": {"X": "${nodes.b.output}"}}
    assert templates.references(args) == {"a", "b"}
    assert templates.resolve(args, lookup) == {"argv": ["echo", "hi\n"], "env": {"X": 42}}


@pytest.mark.parametrize(
    "text", ["${nodes.c.output}", "${nodes.a.output.nope}", "${nodes.a.results[3].result}", "${nodes.b.output.x}"]
)
def test_an_unresolvable_reference_is_a_template_error(text: str) -> None:
    with pytest.raises(templates.TemplateError):
        templates.resolve(text, lookup)
