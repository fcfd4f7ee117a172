"""Import boundaries (DESIGN, habits 1): checked on the source, so a violation fails fast."""

from __future__ import annotations

import ast
from pathlib import Path

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
