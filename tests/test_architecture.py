"""Import boundaries (DESIGN, habits 1): checked on the source, so a violation fails fast."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STDLIB_IO = {"asyncio", "socket", "ssl", "select", "selectors", "subprocess", "sqlite3", "http", "urllib"}
THIRD_PARTY_IO = {
    "websockets",
    "fastapi",
    "starlette",
    "sqlalchemy",
    "redis",
    "httpx",
    "uvicorn",
    "aiosqlite",
    "asyncpg",
    "mcp",
    "openai",
    "alembic",
}
INTERNAL = {"orchestrator", "device_agent", "migrations", "orrery"}


def imports(package: str) -> dict[str, set[str]]:
    """Top-level module names imported by each file of `package` (relative path -> names)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def offenders(package: str, forbidden: set[str]) -> list[str]:
    return [
        f"{file}: {name}"
        for file, names in imports(package).items()
        for name in sorted(names)
        if name.split(".")[0] in forbidden or name in forbidden
    ]


def test_protocol_imports_no_io_and_nothing_internal() -> None:
    assert offenders("protocol", STDLIB_IO | THIRD_PARTY_IO | INTERNAL) == []


def test_device_agent_never_imports_the_orchestrator() -> None:
    assert offenders("device_agent", {"orchestrator", "migrations"}) == []


def test_the_orchestrator_never_imports_the_device_agent() -> None:
    assert offenders("orchestrator", {"device_agent"}) == []
    assert offenders("migrations", {"device_agent"}) == []


def test_the_shared_layer_imports_nothing_of_the_project() -> None:
    """orrery/ is what both sides use (logging, exits, options); only its entry point sits above them."""
    shared = {path: names for path, names in imports("orrery").items() if path != "orrery/cli.py"}
    internal = {"protocol", "orchestrator", "device_agent", "migrations"}
    assert [f"{f}: {n}" for f, names in shared.items() for n in sorted(names) if n.split(".")[0] in internal] == []


SDK_DEPENDENCIES = {"httpx2", "pydantic", "anyio"}  # all in the base install (pyproject.toml)


def test_the_sdk_imports_only_the_standard_library_and_its_http_and_model_libraries() -> None:
    """orrery/sdk/ (docs/sdk.md) runs in any program and on a device install: the standard
    library, httpx2, anyio and pydantic, and nothing of the project outside itself."""
    foreign = [
        f"{file}: {name}"
        for file, names in imports("orrery/sdk").items()
        for name in sorted(names)
        if not (
            name.split(".")[0] in sys.stdlib_module_names | SDK_DEPENDENCIES | {"__future__"}
            or name == "orrery.sdk"
            or name.startswith("orrery.sdk.")
        )
    ]
    assert foreign == []
    assert "httpx2" in imports("orrery/sdk")["orrery/sdk/client.py"]  # the check reads something


def test_import_orrery_leaves_the_sdk_for_first_use() -> None:
    """The agent and the server import `orrery.logs` at start-up: the package's `__init__` may
    import the SDK only inside functions (its lazy `__getattr__`) or for type checking."""
    tree = ast.parse((ROOT / "orrery" / "__init__.py").read_text())
    eager = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    ]
    assert [name for name in eager if name and name.startswith("orrery")] == []
    assert any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body)


def test_both_sides_use_only_the_shared_part_of_orrery() -> None:
    """`orrery.cli` imports the agent and the orchestrator: neither side may import it back."""
    for package in ("device_agent", "orchestrator", "protocol"):
        assert offenders(package, {"orrery.cli", "orrery.__main__"}) == []


def test_the_entry_point_imports_each_side_only_when_asked() -> None:
    """`orrery agent` on a device install must not import the orchestrator: orrery/cli.py imports both
    sides inside functions only, never at module level."""
    tree = ast.parse((ROOT / "orrery" / "cli.py").read_text())
    top = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in tree.body
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert {str(name).split(".")[0] for name in top} & {"orchestrator", "device_agent"} == set()


def test_domain_imports_no_store_bus_api_gateway_engine_or_io() -> None:
    layers = {f"orchestrator.{m}" for m in ("store", "bus", "api", "gateway", "engine", "planner", "app")}
    assert offenders("orchestrator/domain", layers | STDLIB_IO | THIRD_PARTY_IO) == []


def test_the_engine_does_not_reach_into_the_api_or_gateway() -> None:
    assert offenders("orchestrator/engine", {"orchestrator.api", "orchestrator.gateway", "fastapi", "starlette"}) == []


def test_the_checker_sees_imports() -> None:
    """Guard against a checker that passes because it reads nothing."""
    assert "protocol.messages" in imports("device_agent")["device_agent/agent.py"]


def _module_imports(path: Path) -> set[str]:
    """Internal modules `path` imports, as dotted names (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def import_cycles(package: str) -> list[list[str]]:
    """Strongly connected groups of more than one module among the modules of `package`."""
    modules = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted((ROOT / package).rglob("*.py"))
    }
    graph = {m: {n for n in _module_imports(p) if n in modules and n != m} for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while True:
                n = stack.pop()
                group.append(n)
                if n == m:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for m in graph:
        if m not in index:
            visit(m)
    return found


ENGINE = sorted((ROOT / "orchestrator" / "engine").glob("*.py"))


PACKAGES = ("orchestrator", "device_agent", "protocol", "orrery")


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles_anywhere(package: str) -> None:
    """No circle of imports in any package, TYPE_CHECKING imports included (issue 15)."""
    assert import_cycles(package) == []
    assert not [n for n in _module_imports(ROOT / "orchestrator" / "metrics.py") if n.startswith("orchestrator.engine")]


def test_the_cycle_finder_finds_cycles(tmp_path: Path) -> None:
    """Guard against a checker that passes because it reads nothing."""
    assert import_cycles("orchestrator/engine") == []
    assert "orchestrator.engine.records" in _module_imports(ROOT / "orchestrator" / "engine" / "core.py")


def test_no_module_reaches_into_another_objects_private_members() -> None:
    """Collaborators talk through their interfaces: `x._name` is only ever `self._name` (or
    `cls._name`), in every package of the product."""
    reaching = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert reaching == []


def test_the_engine_has_no_mixins_no_typing_only_stubs_and_no_huge_module() -> None:
    for path in ENGINE:
        tree = ast.parse(path.read_text())
        stubs = [
            n.lineno
            for n in ast.walk(tree)
            if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
        ]
        assert stubs == [], f"{path.name}: TYPE_CHECKING blocks at lines {stubs}"
        assert len(path.read_text().splitlines()) <= 600, f"{path.name} is over 600 lines"
    engine = next(
        n
        for n in ast.walk(ast.parse((ROOT / "orchestrator/engine/core.py").read_text()))
        if isinstance(n, ast.ClassDef) and n.name == "Engine"
    )
    assert engine.bases == [], "the Engine is composed of collaborators, not mixins"
