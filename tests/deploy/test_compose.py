"""docker-compose.yml: valid Compose, scalable orchestrator, the start order SPEC section 7 needs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from device_agent.config import AgentConfig
from orchestrator.config import Settings
from tests.deploy import compose_env
from tests.services import unavailable

ROOT = compose_env.ROOT
SCHEMA = ROOT / "tests" / "data" / "compose-spec.json"
REQUIRED = {"POSTGRES_PASSWORD": "pw", "ORRERY_SECRET_KEY": "secret", "ORRERY_ADMIN_KEY": "orrk_admin"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return compose_env.load()


@pytest.fixture(scope="module")
def procs() -> dict[str, compose_env.ServiceProcess]:
    return compose_env.services(REQUIRED)


def test_compose_file_is_valid_against_the_compose_spec_schema(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose), key=lambda e: list(e.path))
    assert [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors] == []


def test_compose_file_is_still_valid_after_interpolation(compose: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA.read_text())
    interpolated = compose_env._interpolate_tree(compose, REQUIRED)
    jsonschema.validate(interpolated, schema, cls=jsonschema.Draft7Validator)


def test_compose_v1_29_accepts_the_file_as_it_is(tmp_path: Path) -> None:
    """Compose v1.29 (Debian's `docker-compose`) validates with its own schema, which is older than
    the Compose Specification: no top-level `name`, `env_file` entries only as paths. Its
    `config` needs no Docker engine. v2 is covered by the Compose Specification schema above."""
    binary = shutil.which("docker-compose")
    if binary is None:
        unavailable("docker-compose (Compose v1.29) is not installed (apt: docker-compose)")
    (tmp_path / ".env").write_text("".join(f"{k}={v}\n" for k, v in REQUIRED.items()))
    done = subprocess.run(
        [binary, "--project-directory", str(tmp_path), "-f", str(ROOT / "docker-compose.yml"), "config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)
    assert set(rendered["services"]) == {"postgres", "redis", "migrate", "orchestrator", "lb", "agent"}
    assert rendered["services"]["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert rendered["services"]["orchestrator"]["environment"]["ORRERY_ADMIN_KEY"] == REQUIRED["ORRERY_ADMIN_KEY"]


def test_it_has_the_services_of_spec_section_7(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "migrate", "orchestrator", "lb", "agent"}
    assert compose["services"]["postgres"]["image"] == "postgres:15"
    assert compose["services"]["redis"]["image"] == "redis:7"


def test_postgres_and_redis_have_healthchecks(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]["healthcheck"]["test"]
    redis = compose["services"]["redis"]["healthcheck"]["test"]
    assert "pg_isready" in " ".join(pg)
    assert redis == ["CMD", "redis-cli", "ping"]


def test_migrate_runs_once_after_postgres_is_healthy(compose: dict[str, Any], procs: dict[str, Any]) -> None:
    svc = compose["services"]["migrate"]
    assert svc["restart"] == "no"  # quoted: a bare `no` would be YAML false
    assert svc["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert procs["migrate"].argv == ["orrery", "migrate"]


def test_orchestrator_is_scalable(compose: dict[str, Any]) -> None:
    svc = compose["services"]["orchestrator"]
    assert "container_name" not in svc
    assert "ports" not in svc, "a fixed host port would stop `--scale orchestrator=3`"
    assert "scale" not in svc and "replicas" not in svc.get("deploy", {})


def test_orchestrator_waits_for_the_migration_and_its_dependencies(compose: dict[str, Any]) -> None:
    assert compose["services"]["orchestrator"]["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"},
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
    }


def test_orchestrator_serves_on_all_interfaces_without_migrating(procs: dict[str, Any]) -> None:
    assert procs["orchestrator"].argv == ["orrery", "serve", "--host", "0.0.0.0", "--no-migrate"]


def test_orchestrator_healthcheck_probes_readyz(compose: dict[str, Any]) -> None:
    """The image's HEALTHCHECK, which the service keeps (it defines none of its own)."""
    assert "healthcheck" not in compose["services"]["orchestrator"]
    build = compose["services"]["orchestrator"]["build"]
    image = compose_env.Image.from_dockerfile(ROOT / build["dockerfile"], ROOT, build["target"])
    assert image.healthcheck[0] == "python"
    assert "/readyz" in " ".join(image.healthcheck)
    agent = compose["services"]["agent"]["build"]
    assert compose_env.Image.from_dockerfile(ROOT / agent["dockerfile"], ROOT, agent["target"]).healthcheck == [
        "orrery-agent-entrypoint",
        "--healthy",
    ]


def test_every_replica_gets_the_shared_secrets_and_production_stores(procs: dict[str, Any]) -> None:
    env = procs["orchestrator"].environment
    assert env["ORRERY_SECRET_KEY"] == "secret"
    assert env["ORRERY_ADMIN_KEY"] == "orrk_admin"
    assert env["ORRERY_DATABASE_URL"] == "postgresql+asyncpg://orrery:pw@postgres:5432/orrery"
    assert env["ORRERY_REDIS_URL"] == "redis://redis:6379/0"
    assert procs["migrate"].environment["ORRERY_DATABASE_URL"] == env["ORRERY_DATABASE_URL"]


def test_compose_refuses_to_start_without_the_secrets() -> None:
    for missing in REQUIRED:
        variables = {k: v for k, v in REQUIRED.items() if k != missing}
        with pytest.raises(compose_env.InterpolationError, match=missing):
            compose_env.services(variables)


def test_every_orrery_variable_in_the_compose_file_is_a_real_setting(procs: dict[str, Any]) -> None:
    known = {f"ORRERY_{n.upper()}" for n in Settings.model_fields}
    known |= {f"ORRERY_AGENT_{n.upper()}" for n in AgentConfig.model_fields}
    used = {k for p in procs.values() for k in p.environment if k.startswith("ORRERY_")}
    assert used - known == set()


def test_load_balancer_publishes_8765_with_the_repo_nginx_conf(compose: dict[str, Any]) -> None:
    lb = compose["services"]["lb"]
    assert lb["image"].startswith("nginx")
    # 8765 on the host unless LB_PORT in .env says otherwise
    assert compose_env._interpolate_tree(lb["ports"], REQUIRED) == ["8765:8765"]
    assert compose_env._interpolate_tree(lb["ports"], {**REQUIRED, "LB_PORT": "18765"}) == ["18765:8765"]
    source = lb["volumes"][0].split(":")[0]
    assert (ROOT / source).resolve() == ROOT / "deploy" / "nginx.conf"


def test_sample_agent_enrolls_through_the_load_balancer_and_keeps_its_token(
    compose: dict[str, Any], procs: dict[str, Any]
) -> None:
    svc = compose["services"]["agent"]
    agent = procs["agent"]
    assert agent.argv == ["orrery-agent-entrypoint"]
    assert agent.local_argv() == [str(ROOT / "deploy" / "agent-entrypoint.sh")]
    assert agent.environment["ORRERY_AGENT_SERVER"] == "http://lb:8765"
    assert agent.environment["ORRERY_ADMIN_KEY"] == "orrk_admin"
    assert "agent-data:/var/lib/orrery-agent" in svc["volumes"]
    assert "agent-data" in compose["volumes"]


def test_orrery_services_build_the_repo_dockerfile(compose: dict[str, Any]) -> None:
    for name in ("migrate", "orchestrator", "agent"):
        build = compose["services"][name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == ROOT / "deploy" / "Dockerfile"


def test_dockerfile_runs_as_a_non_root_user_with_orrery_as_entrypoint() -> None:
    dockerfile = ROOT / "deploy" / "Dockerfile"
    text = dockerfile.read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    stages = [line.split()[-1] for line in text.splitlines() if line.startswith("FROM ")]
    assert stages == ["base", "agent", "orrery"]  # the default image (the last stage) is the server's
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert len(users) == 2 and all(u.split(":")[0] not in ("root", "0") for u in users)  # one per image
    server = compose_env.Image.from_dockerfile(dockerfile, ROOT)
    assert server.entrypoint == ["orrery"] and server.cmd == ["serve", "--host", "0.0.0.0"]
    assert server == compose_env.Image.from_dockerfile(dockerfile, ROOT, "orrery")
    agent = compose_env.Image.from_dockerfile(dockerfile, ROOT, "agent")
    assert agent.entrypoint == ["orrery-agent-entrypoint"]
    assert agent.programs == {"orrery-agent-entrypoint": ROOT / "deploy" / "agent-entrypoint.sh"}


def test_files_the_dockerfile_copies_exist() -> None:
    for instruction in compose_env._instructions((ROOT / "deploy" / "Dockerfile").read_text()):
        if instruction.startswith("COPY "):
            sources = [w for w in instruction.split()[1:-1] if not w.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), source


def test_agent_entrypoint_is_executable() -> None:
    script = ROOT / "deploy" / "agent-entrypoint.sh"
    assert script.stat().st_mode & 0o111
    assert script.read_text().startswith("#!/bin/sh\n")


def test_schema_copy_is_attributed() -> None:
    readme = (SCHEMA.parent / "README.md").read_text()
    assert "compose-spec.json" in readme and "Apache License 2.0" in readme
    assert Path(SCHEMA).exists()
