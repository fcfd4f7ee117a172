"""Shared servers for tests that only need one and do not disturb it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import RedisDatabases, fresh_database, postgres_server, redis_server
from tests.support import Fleet

# The heaviest files, with their share of a run (seconds, measured with `--durations=0` summed by
# file): run first, so that under `pytest -n 2 --dist loadfile --no-loadscope-reorder`
# (scripts/check) no worker starts a file of minutes while the other is running out of work.
# xdist's own order (most tests first) put the two-test file of the two Schemathesis runs last.
# Other files keep their order, after these; a file's tests stay together and in order.
HEAVY_FIRST: dict[str, int] = {
    "tests/security/test_openapi_fuzz.py": 143,
    "tests/security/test_openapi_fuzz_postgres.py": 143,
    "tests/integration/test_planner.py": 25,  # estimated: one server for the module
    "tests/test_bench_stores.py": 100,  # estimated: every benchmark on Postgres, most on 2 replicas
    "tests/integration/test_agent_first_contact.py": 74,
    "tests/security/test_tool_server_launch.py": 73,
    "tests/integration/test_controls.py": 73,
    "tests/integration/test_agent_reliability.py": 71,
    "tests/gui/test_atspi_agent.py": 68,
    "tests/integration/test_emergency_stop.py": 68,
    "tests/integration/test_docs_examples.py": 66,
    "tests/security/test_safety_runtime.py": 64,
    "tests/integration/test_third_party_mcp.py": 64,
    "tests/security/test_mcp_http.py": 64,
    "tests/security/test_fuzz.py": 63,
    "tests/integration/test_cli_rough_edges.py": 63,
    "tests/integration/test_browser_device.py": 59,
    "tests/web/test_approvals_page.py": 55,
    "tests/integration/test_diagnoses.py": 55,
    "tests/integration/test_cli.py": 54,
    "tests/unit/device_agent/test_agent_frame_checks.py": 44,
    "tests/web/test_dashboard.py": 41,
    "tests/deploy/test_agent_entrypoint.py": 41,
    "tests/integration/test_device_lifecycle.py": 40,
    "tests/integration/test_cli_new_endpoints.py": 39,
    "tests/unit/device_agent/test_agent_protocol.py": 39,
    "tests/gui/test_x11.py": 39,
    "tests/integration/test_observability.py": 38,
    "tests/integration/test_end_to_end.py": 37,
    "tests/integration/test_prompt_overrides.py": 37,
    "tests/security/test_transport_and_secrets.py": 35,
    "tests/integration/test_agent_data_dir.py": 35,
    "tests/security/test_device_attacks.py": 35,
    "tests/security/test_frame_fuzz.py": 35,
    "tests/integration/test_approvals.py": 34,
    "tests/integration/test_schedules.py": 33,
    "tests/integration/test_cli_dag_checks.py": 32,
    "tests/unit/device_agent/test_approval_arbiter.py": 31,
    "tests/integration/test_artifact_quotas.py": 31,
    "tests/gui/test_agent_node.py": 31,
    "tests/integration/test_fan_out_scale.py": 30,
    "tests/conformance/test_mcp_client_conformance.py": 30,  # 26 scenarios of the MCP suite, 4 at a time
    "tests/conformance/test_mcp_server_conformance.py": 40,  # 32 scenarios, 4 at a time
    "tests/web/test_device_page.py": 30,
    "tests/integration/test_verified_outcomes.py": 28,
    "tests/web/test_security_headers.py": 28,
    "tests/unit/device_agent/test_orphans.py": 27,
    "tests/web/test_safety_breach_page.py": 27,
    "tests/web/test_schedules_page.py": 26,
    "tests/unit/device_agent/test_agent_stop.py": 26,
    "tests/gui/test_emergency_stop.py": 25,
    "tests/security/test_sandbox_agent.py": 25,
    "tests/security/test_http_limits.py": 24,
    "tests/security/test_fencing.py": 24,
    "tests/integration/test_fan_out.py": 23,
    "tests/web/test_fan_out_page.py": 23,
    "tests/unit/device_agent/test_agent_refusal.py": 22,
    "tests/security/test_verify_waits_on_nobody.py": 21,
    "tests/gui/test_agent_context.py": 21,
    "tests/security/test_event_stream_attacks.py": 20,
    "tests/integration/test_cli_first_contact.py": 20,
    "tests/web/test_artifacts_page.py": 20,
    "tests/security/test_browser_confinement.py": 20,
    "tests/web/test_docs.py": 20,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heavy files first (see HEAVY_FIRST), heaviest first; a stable sort of whole files."""
    items.sort(key=lambda item: -HEAVY_FIRST.get(item.nodeid.split("::", 1)[0], 0))


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One server for a module: short hello timeout, small frames, fast heartbeats."""
    tmp: Path = tmp_path_factory.mktemp("fleet")
    with Fleet(tmp, hello_timeout_s="1", max_frame_bytes="65536", heartbeat_interval_s="1") as f:
        yield f


# ---------------------------------------------------------------- Postgres and Redis (tests/services.py)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A Postgres server for the session (`postgresql+asyncpg://`): ORRERY_TEST_POSTGRES_URL, else a
    throwaway one from the local binaries. Tests should take `postgres_db` to get a database of their own."""
    with postgres_server() as url:
        yield url


@pytest.fixture
def postgres_db(postgres_url: str) -> Iterator[str]:
    """A new, empty database for this test on the session's server (dropped afterwards); its URL."""
    with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis server for the session: ORRERY_TEST_REDIS_URL, else a throwaway one."""
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def _redis_databases(redis_url: str) -> RedisDatabases:
    return RedisDatabases.for_server(redis_url)


@pytest.fixture
def redis_db(_redis_databases: RedisDatabases) -> str:
    """A Redis URL whose database is empty at the start of this test."""
    return _redis_databases.next_url()


@pytest.fixture(scope="session", autouse=True)
def backend() -> Iterator[str]:
    """ORRERY_TEST_BACKEND=postgres: every `Fleet` of the session stores its state in Postgres."""
    import os

    if os.environ.get("ORRERY_TEST_BACKEND", "sqlite") != "postgres":
        yield "sqlite"
        return
    with postgres_server() as url:
        os.environ["ORRERY_TEST_POSTGRES_SERVER"] = url
        try:
            yield "postgres"
        finally:
            os.environ.pop("ORRERY_TEST_POSTGRES_SERVER", None)
