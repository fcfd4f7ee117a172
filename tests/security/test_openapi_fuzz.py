"""Schemathesis against the live OpenAPI schema of a running server: no 5xx, responses match the
schema. On SQLite and on Postgres (whose driver refuses text SQLite stores, e.g. a NUL: issue 14)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import fresh_database
from tests.support import Fleet, child_env

CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
        "unsupported_method",
        "negative_data_rejection",
    ]
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_live_api_survives_schemathesis_with_no_5xx_and_conforming_responses(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":  # named, so ORRERY_TEST_BACKEND=postgres leaves this one on SQLite
            database = f"sqlite+aiosqlite:///{tmp_path}/orrery.db"
        else:
            database = stack.enter_context(fresh_database(request.getfixturevalue("postgres_url")))
        f = stack.enter_context(Fleet(tmp_path, database_url=database))
        f.agent("fuzzed")
        cli = Path(sys.executable).parent / "schemathesis"
        result = subprocess.run(
            [
                str(cli),
                "run",
                f"{f.server.url}/openapi.json",
                "-H",
                f"Authorization: Bearer {f.server.api_key}",
                "--max-examples",
                "25",
                "--checks",
                CHECKS,
                "--seed",
                "20261129",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env=child_env(),
            check=False,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        assert "passed" in result.stdout
        assert "Traceback" not in f.server.log()
