"""tests/deploy/compose_env.py reads docker-compose.yml the way Compose does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.deploy import compose_env
from tests.deploy.compose_env import InterpolationError, interpolate

VARS = {"SET": "value", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${SET}", "value"),
        ("$SET/x", "value/x"),
        ("${UNSET}", ""),
        ("${UNSET:-dflt}", "dflt"),
        ("${EMPTY:-dflt}", "dflt"),
        ("${EMPTY-dflt}", ""),
        ("${UNSET-dflt}", "dflt"),
        ("${SET:+alt}", "alt"),
        ("${EMPTY:+alt}", ""),
        ("${EMPTY+alt}", "alt"),
        ("${UNSET:-${SET}}", "value"),
        ("$${NOT_A_REFERENCE}", "${NOT_A_REFERENCE}"),
        ("cost: 5$", "cost: 5$"),
        ("a${SET}b${UNSET:-c}d", "avaluebcd"),
    ],
)
def test_interpolation_follows_compose(text: str, expected: str) -> None:
    assert interpolate(text, VARS) == expected


@pytest.mark.parametrize("text", ["${UNSET:?say what}", "${EMPTY:?say what}", "${UNSET?say what}"])
def test_a_required_variable_that_is_missing_is_an_error_with_its_message(text: str) -> None:
    with pytest.raises(InterpolationError, match="say what"):
        interpolate(text, VARS)


def test_a_required_variable_that_is_set_passes() -> None:
    assert interpolate("${SET:?x}", VARS) == "value"
    assert interpolate("${EMPTY?x}", VARS) == ""


@pytest.mark.parametrize("text", ["${", "${1ABC}", "${SET!x}"])
def test_malformed_references_are_errors(text: str) -> None:
    with pytest.raises(InterpolationError):
        interpolate(text, VARS)


def test_addresses_are_rewritten_only_where_they_are_a_url_host() -> None:
    addresses = {"postgres:5432": "127.0.0.1:15432", "redis:6379": "127.0.0.1:16379"}
    assert (
        compose_env.rewrite_addresses("postgresql+asyncpg://u:p@postgres:5432/db", addresses)
        == "postgresql+asyncpg://u:p@127.0.0.1:15432/db"
    )
    assert compose_env.rewrite_addresses("redis://redis:6379/0", addresses) == "redis://127.0.0.1:16379/0"
    assert compose_env.rewrite_addresses("http://redis:6379", addresses) == "http://127.0.0.1:16379"
    assert compose_env.rewrite_addresses("notredis:6379", addresses) == "notredis:6379"


def test_services_give_argv_and_environment_for_local_processes() -> None:
    variables = {"POSTGRES_PASSWORD": "pw", "ORRERY_SECRET_KEY": "s", "ORRERY_ADMIN_KEY": "k"}
    procs = compose_env.services(
        variables, addresses={"postgres:5432": "127.0.0.1:15432", "redis:6379": "127.0.0.1:16379"}
    )
    orch = procs["orchestrator"]
    assert orch.runs_orrery
    assert orch.local_argv() == [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "0.0.0.0", "--no-migrate"]
    assert orch.environment["ORRERY_DATABASE_URL"] == "postgresql+asyncpg://orrery:pw@127.0.0.1:15432/orrery"
    assert orch.environment["ORRERY_REDIS_URL"] == "redis://127.0.0.1:16379/0"
    assert orch.depends_on["migrate"] == "service_completed_successfully"
    assert procs["migrate"].local_argv(["orrery"]) == ["orrery", "migrate"]
    assert not procs["postgres"].runs_orrery
    assert procs["redis"].argv == ["redis-server", "--save", "", "--appendonly", "no"]
    # `$$` in the healthcheck is left to the container's shell; the postgres env is interpolated.
    assert procs["postgres"].environment["POSTGRES_PASSWORD"] == "pw"


def test_env_files_are_read_only_when_asked(tmp_path: Path) -> None:
    compose = tmp_path / "docker-compose.yml"
    compose.write_text(
        "services:\n"
        "  app:\n"
        "    image: busybox\n"
        "    command: echo hi\n"
        "    env_file: [{path: .env, required: false}]\n"
        "    environment: {FIXED: '${A}', EMPTY_LIST_OK: ''}\n"
    )
    (tmp_path / ".env").write_text("# comment\nFROM_FILE='quoted'\nFIXED=loses\nexport B=${A}\n")
    plain = compose_env.services({"A": "a"}, compose_file=compose)["app"]
    assert plain.argv == ["echo", "hi"]
    assert plain.environment == {"FIXED": "a", "EMPTY_LIST_OK": ""}
    with_files = compose_env.services({"A": "a"}, compose_file=compose, read_env_files=True)["app"]
    assert with_files.environment == {"FROM_FILE": "quoted", "FIXED": "a", "B": "a", "EMPTY_LIST_OK": ""}


def test_a_required_env_file_that_is_missing_is_an_error(tmp_path: Path) -> None:
    compose = tmp_path / "docker-compose.yml"
    compose.write_text("services:\n  app:\n    image: busybox\n    env_file: missing.env\n")
    with pytest.raises(FileNotFoundError, match=r"missing\.env"):
        compose_env.services({}, compose_file=compose, read_env_files=True)


def test_dockerfile_entrypoint_and_cmd_are_the_image_defaults(tmp_path: Path) -> None:
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM scratch\n"
        "# a comment\n"
        "COPY --chmod=0755 run.sh /usr/local/bin/run\n"
        'ENTRYPOINT ["tool"]\n'
        "CMD serve \\\n"
        "    --fast\n"
    )
    image = compose_env.Image.from_dockerfile(tmp_path / "Dockerfile", tmp_path)
    assert image.entrypoint == ["tool"]
    assert image.cmd == ["/bin/sh", "-c", "serve --fast"]
    assert image.programs == {"run": tmp_path / "run.sh"}


def test_a_multi_stage_dockerfile_gives_the_chosen_stage_with_what_it_inherits(tmp_path: Path) -> None:
    (tmp_path / "a.sh").write_text("#!/bin/sh\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM debian AS base\n"
        'CMD ["base"]\n'
        "FROM base AS agent\n"
        "COPY a.sh /usr/local/bin/a\n"
        'ENTRYPOINT ["a"]\n'
        "FROM base AS server\n"
        'ENTRYPOINT ["server"]\n'
        'CMD ["serve"]\n'
    )
    dockerfile = tmp_path / "Dockerfile"
    server = compose_env.Image.from_dockerfile(dockerfile, tmp_path)  # the last stage
    assert (server.entrypoint, server.cmd, server.programs) == (["server"], ["serve"], {})
    agent = compose_env.Image.from_dockerfile(dockerfile, tmp_path, "agent")
    assert (agent.entrypoint, agent.cmd, agent.programs) == (["a"], [], {"a": tmp_path / "a.sh"})
    base = compose_env.Image.from_dockerfile(dockerfile, tmp_path, "base")
    assert (base.entrypoint, base.cmd) == ([], ["base"])
    with pytest.raises(ValueError, match="no stage 'nope'"):
        compose_env.Image.from_dockerfile(dockerfile, tmp_path, "nope")
