"""The rule mutant catalogue (tests/mutants/catalogue.py) still fits the code, checked without
running any mutant: each snippet occurs exactly once where it says, the mutated file still
compiles, and each catching test exists in the fast tiers. `scripts/mutants` runs the mutants."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.mutants.catalogue import FAST_TIERS, MUTANTS, PROTOTYPES, Mutant
from tests.mutants.probe import PACKAGES, PROTOTYPE_MODULES

ROOT = Path(__file__).resolve().parents[2]


def test_mutant_ids_are_unique_and_short() -> None:
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", i) and len(i) <= 40 for i in ids), ids


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_the_snippet_occurs_exactly_once_and_the_mutant_still_compiles(mutant: Mutant) -> None:
    path = ROOT / mutant.file
    assert mutant.file.split("/", 1)[0] in PACKAGES or mutant.file in PROTOTYPES, f"{mutant.file} is not in the product"
    source = path.read_text()
    assert source.count(mutant.original) == 1, f"the snippet of {mutant.id} is not in {mutant.file} exactly once"
    assert mutant.replacement != mutant.original
    compile(source.replace(mutant.original, mutant.replacement), str(path), "exec")  # a bug, not a syntax error


def defined(path: Path, names: list[str]) -> bool:
    """Whether `path` defines the test `names` names: a function, or a class and its method."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for i, name in enumerate(names):
        found = [n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
        match = next((n for n in found if n.name == name), None)
        if match is None or (i < len(names) - 1) != isinstance(match, ast.ClassDef):
            return False
        scope = match.body
    return True


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_every_catching_test_exists_in_the_fast_tiers(mutant: Mutant) -> None:
    assert mutant.caught_by, f"{mutant.id} names no catching test"
    for nodeid in mutant.caught_by:
        assert nodeid.startswith(FAST_TIERS), f"{nodeid} is not in {' or '.join(FAST_TIERS)}"
        file, *names = re.sub(r"\[.*\]$", "", nodeid).split("::")
        assert names and (ROOT / file).is_file(), f"{nodeid} names no test file and test"
        assert defined(ROOT / file, names), f"{file} has no test {'::'.join(names)}"


def test_every_prototype_is_probed() -> None:
    """A prototype's mutants are judged by the modules the probe records: it must record each."""
    assert sorted(p.removesuffix(".py").replace("/", ".") for p in PROTOTYPES) == sorted(PROTOTYPE_MODULES)
