"""Schemathesis against the live OpenAPI schema with Postgres as the store (its driver refuses text
SQLite stores, e.g. a NUL): test_openapi_fuzz.py's run, in a file of its own so that
`pytest -n 2 --dist loadfile` runs the two runs of minutes each on both workers at once."""

from __future__ import annotations

from pathlib import Path

from tests.security.test_openapi_fuzz import survives_schemathesis
from tests.services import fresh_database


def test_the_live_api_on_postgres_survives_schemathesis_with_no_5xx_and_conforming_responses(
    tmp_path: Path, postgres_url: str
) -> None:
    with fresh_database(postgres_url) as database:
        survives_schemathesis(tmp_path, database)
