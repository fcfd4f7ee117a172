"""Schemathesis against the live OpenAPI schema of a running server: no 5xx, responses match the
schema. On SQLite and on Postgres (whose driver refuses text SQLite stores, e.g. a NUL: issue 14)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_the_live_api_survives_schemathesis_with_no_5xx_and_conforming_responses(tmp_path: Path) -> None:
    # The store is named, so ORRERY_TEST_BACKEND=postgres leaves this one on SQLite.
    survives_schemathesis(tmp_path, f"sqlite+aiosqlite:///{tmp_path}/orrery.db")


def survives_schemathesis(tmp_path: Path, database: str) -> None:
    """The run on a server whose store is `database`. The Postgres run is in a file of its own
    (test_openapi_fuzz_postgres.py): each run takes minutes, and `--dist loadfile` keeps a file's
    tests on one worker, so the two runs go to both workers at once."""
    with Fleet(tmp_path, database_url=database) as f:
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
