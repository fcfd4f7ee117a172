"""How the suite itself runs: every skip says why, and the heaviest files go first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import HEAVY_FIRST
from tests.support import ROOT, child_env


def pytest_run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=child_env(),
        timeout=120,
        check=False,
    )


def test_a_skip_prints_its_reason_and_the_last_line_counts_it(tmp_path: Path) -> None:
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "def test_runs():\n    pass\n\n"
        "def test_skipped():\n    pytest.skip('no such server here')\n\n"
        "@pytest.mark.xfail(reason='a known defect', strict=True)\n"
        "def test_known():\n    assert False\n"
    )
    # The project's own configuration (pyproject.toml), on a file of our own.
    run = pytest_run("-c", str(ROOT / "pyproject.toml"), "--rootdir", ".", "test_skips.py", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SKIPPED [1] test_skips.py:7: no such server here" in run.stdout, run.stdout
    assert "XFAIL test_skips.py::test_known - a known defect" in run.stdout, run.stdout
    assert "1 passed, 1 skipped, 1 xfailed" in run.stdout.splitlines()[-1], run.stdout


def test_the_heaviest_files_are_collected_first_heaviest_first_and_each_still_exists() -> None:
    missing = [name for name in HEAVY_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"HEAVY_FIRST names files that are gone: {missing}"
    run = pytest_run("--collect-only", "-q", "tests/security", "tests/web")
    assert run.returncode == 0, run.stdout + run.stderr
    files = list(dict.fromkeys(line.split("::")[0] for line in run.stdout.splitlines() if "::" in line))
    heavy = [f for f in files if f in HEAVY_FIRST]
    assert files[: len(heavy)] == heavy, files  # every heavy file before any other
    assert [HEAVY_FIRST[f] for f in heavy] == sorted((HEAVY_FIRST[f] for f in heavy), reverse=True)
    assert files[:2] == ["tests/security/test_openapi_fuzz.py", "tests/security/test_openapi_fuzz_postgres.py"]
