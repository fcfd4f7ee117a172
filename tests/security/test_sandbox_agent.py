"""The sandbox end to end: real orchestrator, real agents, real bwrap; start-up refusals; `--check`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT, Agent, Fleet, child_env, run_cli, shell

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

DENY_RM = '["rm"]'


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Agent, Agent]]:
    with Fleet(tmp_path_factory.mktemp("sandbox")) as f:
        boxed = f.agent("boxed", {"pool": "boxed"}, ORRERY_AGENT_SANDBOX="bwrap", ORRERY_AGENT_SHELL_DENY=DENY_RM)
        unboxed = f.agent("unboxed", {"pool": "unboxed"}, ORRERY_AGENT_SHELL_DENY=DENY_RM)
        yield f, boxed, unboxed


@pytest.fixture
def outside() -> Iterator[Path]:
    """Outside every workspace, and visible in the sandbox (its /tmp is private, /var/tmp is not)."""
    path = Path(tempfile.mkdtemp(prefix="orrery-sandbox-agent-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_sh_c_rm_is_stopped_by_the_sandbox_and_not_by_the_deny_list(
    env: tuple[Fleet, Agent, Agent], outside: Path
) -> None:
    f, _, _ = env
    for pool in ("boxed", "unboxed"):
        (outside / f"{pool}.txt").write_text("keep me\n")
    nodes: list[dict[str, Any]] = [
        {
            "id": pool,
            "placement": {"labels": {"pool": pool}},
            "commands": [shell(["sh", "-c", f"rm {outside / pool}.txt"])],
        }
        for pool in ("boxed", "unboxed")
    ]
    task = f.wait_task(f.submit({"nodes": nodes})["id"])

    boxed = f.node(task, "boxed")
    assert boxed["state"] == "failed" and boxed["error"]["code"] == "tool_error"
    assert "Read-only file system" in json.dumps(boxed)
    assert (outside / "boxed.txt").read_text() == "keep me\n"

    unboxed = f.node(task, "unboxed")
    assert unboxed["state"] == "succeeded"  # shell_deny = ["rm"] is only a guardrail
    assert not (outside / "unboxed.txt").exists()


def test_the_device_reports_its_sandbox_in_its_policy(env: tuple[Fleet, Agent, Agent]) -> None:
    f, boxed, unboxed = env
    assert f.device(boxed.device_id)["info"]["policy"]["sandbox"] == {
        "kind": "bwrap",
        "network": False,
        "limits": {"memory_mb": 2048, "cpu_s": 3600, "max_processes": 256, "file_size_mb": 1024},
    }
    assert f.device(unboxed.device_id)["info"]["policy"]["sandbox"] == {"kind": "none"}


# ---------------------------------------------------------------- refusing to start


def start_agent(tmp_path: Path, prefix: list[str] | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """An agent with the sandbox on; it must exit before it ever tries the (closed) server port."""
    argv = [*(prefix or []), sys.executable, "-m", "device_agent", "--server", "http://127.0.0.1:9"]
    argv += ["--token", "orrd_dev_sandbox.secret", "--data-dir", str(tmp_path / "agent"), "--sandbox", "bwrap"]
    return subprocess.run(
        argv, capture_output=True, text=True, env=child_env(**env), cwd=ROOT, timeout=120, check=False
    )


def test_the_agent_refuses_to_start_without_bwrap(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    done = start_agent(tmp_path, PATH=str(tmp_path / "bin"))
    assert done.returncode == 2  # bad settings: restarting does not help
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "bubblewrap is not installed" in lines[0], lines
    assert not (tmp_path / "agent" / "ledger.sqlite3").exists()  # refused before anything ran


def test_the_agent_refuses_to_start_where_namespaces_are_refused(tmp_path: Path) -> None:
    help_text = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, check=False).stdout
    if "--disable-userns" not in help_text:
        pytest.skip("this bwrap cannot forbid nested user namespaces (--disable-userns needs 0.8)")
    # The agent runs inside a user namespace that may not create more, as in a locked-down container.
    outer = ["bwrap", "--unshare-user", "--disable-userns", "--dev-bind", "/", "/", "--"]
    done = start_agent(tmp_path, prefix=outer)
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "the sandbox cannot start here" in lines[0], lines
    assert "sandbox = 'none'" in lines[0]


# ---------------------------------------------------------------- orrery agent --check


def check(tmp_path: Path, *args: str, **env: str) -> tuple[int, dict[str, Any], str]:
    done = run_cli(None, "agent", "--check", "--data-dir", str(tmp_path / "agent"), *args, timeout=120, **env)
    return done.returncode, json.loads(done.stdout), done.stderr


def test_check_reports_a_working_sandbox(tmp_path: Path) -> None:
    code, report, _ = check(tmp_path, "--sandbox", "bwrap", "--sandbox-network")
    assert code == 0 and report["ready"] is True
    assert report["sandbox"]["kind"] == "bwrap" and report["sandbox"]["ready"] is True
    assert report["sandbox"]["network"] is True
    assert "not a security boundary" in report["toolsets"]["shell"]["note"]


def test_check_says_the_deny_list_is_a_guardrail_and_recommends_the_sandbox(tmp_path: Path) -> None:
    code, report, stderr = check(tmp_path)
    assert code == 0 and report["sandbox"] == {"kind": "none", "ready": True, "reason": None}
    warning = report["toolsets"]["shell"]["warning"]
    assert "not a security boundary" in warning and "sandbox = 'bwrap'" in warning
    assert "not a security boundary" in stderr


def test_check_fails_when_the_sandbox_cannot_run(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    code, report, stderr = check(tmp_path, "--sandbox", "bwrap", PATH=str(tmp_path / "bin"))
    assert code == 1 and report["ready"] is False
    assert report["sandbox"]["ready"] is False and "bubblewrap is not installed" in report["sandbox"]["reason"]
    assert report["toolsets"]["shell"]["ready"] is False
    assert "bubblewrap is not installed" in stderr


def test_a_bad_sandbox_setting_is_one_line_and_status_2(tmp_path: Path) -> None:
    done = run_cli(None, "agent", "--check", "--sandbox", "firejail", timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "bad agent setting sandbox: Input should be 'none' or 'bwrap' (got 'firejail')"
    ]


def test_a_bad_setting_next_to_secrets_never_echoes_them(tmp_path: Path) -> None:
    """A mistake in an MCP server entry or the token is named, but its value (a bearer token, a
    password in a URL, a header) is not printed."""
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\ntoken = "orrd_s3cret-token"\n\n[[agent.mcp_servers]]\nnamespace = "tickets"\n'
        'url = "https://alice:hunter2-pw@mcp.example/tickets"\nbearer_token = "tok-hunter3"\n'
        'headers = { X-Key = "hdr-hunter4" }\nsurprise = 1\n'
    )
    done = run_cli(None, "agent", "--check", "--config", str(config), timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines and all(line.startswith("bad agent setting mcp_servers") for line in lines), lines
    for secret in ("s3cret", "hunter2", "tok-hunter3", "hdr-hunter4"):
        assert secret not in done.stderr + done.stdout
