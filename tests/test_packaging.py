"""What an install brings: the base dependencies are a device's (agent, protocol, the `orrery` entry
point), the `server` extra the orchestrator's, and every distribution the code imports is declared
in the list of the install that runs it. Read from the source and pyproject.toml, matched against
the distributions installed here (the test environment has both lists)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, requires
from importlib.metadata import packages_distributions as _packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

from tests.support import child_env

ROOT = Path(__file__).resolve().parent.parent
OWN = {"orrery", "protocol", "device_agent", "orchestrator", "migrations"}
DEVICE_SIDE = ("orrery", "protocol", "device_agent")
SERVER_SIDE = ("orchestrator", "migrations")
# What the split is for: none of these may reach a device install.
HEAVY = {"fastapi", "sqlalchemy", "asyncpg", "aiosqlite", "alembic", "openai", "redis"}


@cache
def packages_distributions() -> dict[str, list[str]]:
    return dict(_packages_distributions())


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(requirements: list[str]) -> set[str]:
    return {canonical(Requirement(r).name) for r in requirements}


@cache
def project() -> dict[str, list[str]]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {"base": meta["dependencies"], **meta["optional-dependencies"]}


def imported_modules(package: str) -> dict[str, set[str]]:
    """Third-party top-level modules imported anywhere in `package` -> the files importing them."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in OWN and top not in sys.stdlib_module_names and top != "__future__":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def distributions(module: str) -> set[str]:
    return {canonical(d) for d in packages_distributions().get(module, [])}


def undeclared(packages: tuple[str, ...], allowed: set[str]) -> list[str]:
    problems = []
    for package in packages:
        for module, files in sorted(imported_modules(package).items()):
            dists = distributions(module)
            if not dists:
                problems.append(f"{module}: no installed distribution provides it ({sorted(files)[0]})")
            elif not dists & allowed:
                problems.append(f"{module} ({', '.join(sorted(dists))}): imported by {sorted(files)[0]}, not declared")
    return problems


def test_the_device_side_imports_only_the_base_dependencies() -> None:
    assert undeclared(DEVICE_SIDE, declared(project()["base"])) == []


def test_the_orchestrator_imports_only_the_base_and_server_dependencies() -> None:
    assert undeclared(SERVER_SIDE, declared(project()["base"]) | declared(project()["server"])) == []


def test_the_checker_reads_imports_and_finds_an_undeclared_one() -> None:
    """Guard against a checker that passes because it reads nothing or maps nothing."""
    assert "device_agent/mcp_client.py" in imported_modules("device_agent")["httpx2"]
    assert "fastapi" in imported_modules("orchestrator")
    assert undeclared(("device_agent",), declared(project()["base"]) - {"httpx2"})[0].startswith("httpx2 (httpx2)")


def test_the_server_dependencies_are_an_extra_and_the_tests_install_it() -> None:
    base, server = declared(project()["base"]), declared(project()["server"])
    assert {canonical(d) for d in HEAVY} <= server
    assert not {canonical(d) for d in HEAVY} & base
    assert "orrery" in declared(project()["test"])
    assert any(Requirement(r).extras == {"server"} for r in project()["test"] if Requirement(r).name == "orrery")


def closure(requirements: list[str]) -> set[str]:
    """Every distribution installing `requirements` brings here (this platform, no extras)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in requires(name) or []]
        except PackageNotFoundError:
            continue
    return seen


def device_install_lacks() -> set[str]:
    """Top-level modules of the server extra that a base install does not bring."""
    missing = closure(project()["server"]) - closure(project()["base"])
    return {module for module, dists in packages_distributions().items() if {canonical(d) for d in dists} & missing}


# Runs `orrery` (orrery.cli.main) as on a device install: the server extra's modules refuse to import.
DEVICE_INSTALL = """
import importlib.abc, sys
LACKS = set(sys.argv.pop(1).split(","))
class DeviceInstall(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in LACKS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, DeviceInstall())
if sys.argv[1:2] == ["--import-all"]:
    import pkgutil, device_agent, protocol, orrery
    for package in (device_agent, protocol, orrery):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.name.endswith("__main__"):
                __import__(info.name)
    print(sorted(m for m in sys.modules if m.split(".")[0] in LACKS | {"orchestrator"}))
    raise SystemExit(0)
from orrery.cli import main
main(sys.argv[1:])
"""


def as_device(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    lacks = device_install_lacks()
    return subprocess.run(
        [sys.executable, "-c", DEVICE_INSTALL, ",".join(sorted(lacks)), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
        env=child_env(COLUMNS="100"),
    )


def test_a_device_install_lacks_the_heavy_server_dependencies() -> None:
    lacks = device_install_lacks()
    assert {"fastapi", "sqlalchemy", "asyncpg", "aiosqlite", "alembic", "openai", "redis"} <= lacks
    assert not lacks & {"websockets", "pydantic", "mcp", "typer", "rich"}


def test_every_agent_module_imports_without_the_server_extra() -> None:
    done = as_device("--import-all")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # nothing of the server extra, nothing of the orchestrator


def test_orrery_agent_runs_without_the_server_extra(tmp_path: Path) -> None:
    helped = as_device("agent", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "Usage: orrery agent [OPTIONS]" in helped.stdout
    checked = as_device("agent", "--check", "--toolset", "system", "--data-dir", str(tmp_path / "agent"))
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["ready"] is True


def test_a_server_command_without_the_server_extra_names_the_extra() -> None:
    for command in (["serve"], ["demo"], ["devices", "list"], ["migrate"]):
        done = as_device(*command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
        assert "pip install 'orrery[server]'" in lines[0]


def test_orrery_help_without_the_server_extra_points_at_the_agent() -> None:
    done = as_device("--help")
    assert done.returncode == 0, done.stderr
    assert "orrery agent --help" in done.stdout and "pip install 'orrery[server]'" in done.stdout


def test_an_orchestrator_command_starts_without_the_agent_s_modules() -> None:
    """A third of the CLI's start-up is the agent's command: a run naming an orchestrator command
    leaves it out, while help still lists it."""
    probe = (
        "import sys\nfrom orrery.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('AGENT' if 'device_agent.cli' in sys.modules else 'NO-AGENT', file=sys.stderr)\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", probe, *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
            env=child_env(COLUMNS="100"),
        )

    listed = run("tasks", "list", "--server", "http://127.0.0.1:9")
    assert listed.stderr.strip().splitlines()[-1] == "NO-AGENT", listed.stderr
    assert "cannot reach the orchestrator" in listed.stderr
    helped = run("--help")
    assert helped.stderr.strip().splitlines()[-1] == "AGENT" and "agent" in helped.stdout


def test_the_distribution_ships_every_package_of_the_source_tree() -> None:
    """`pip install .` (not editable, as the images and users install it) carries each directory
    of ours that is a package: a subpackage left out of `packages.find` imports here, from the
    tree, and fails only in a real install."""
    from setuptools import find_packages

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = set(find_packages(str(ROOT), include=config["include"]))
    ours = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in sorted(OWN)
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert "orrery.sdk" in ours  # the walk reads the tree
    assert ours - shipped == set(), f"packages missing from the distribution: {sorted(ours - shipped)}"
