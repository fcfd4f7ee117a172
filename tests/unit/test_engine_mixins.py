"""The engine's mixins declare each other's methods under TYPE_CHECKING only (a runtime stub would
shadow the real method through the MRO). mypy cannot tell when such a declaration has no real
method behind it; this test can."""

from __future__ import annotations

import ast
import inspect
from types import ModuleType

import pytest

from orchestrator.engine import devices, results, scheduling
from orchestrator.engine.core import Engine


def typing_only_methods(module: ModuleType) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            names += [f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names


@pytest.mark.parametrize("module", [devices, results, scheduling], ids=lambda m: m.__name__)
def test_every_declared_method_is_implemented_on_engine(module: ModuleType) -> None:
    declared = typing_only_methods(module)
    assert declared, f"{module.__name__} declares nothing under TYPE_CHECKING; is this test still needed?"
    missing = [name for name in declared if not callable(getattr(Engine, name, None))]
    assert missing == [], f"declared in {module.__name__} but implemented nowhere on Engine: {missing}"
