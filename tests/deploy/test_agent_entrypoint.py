"""deploy/agent-entrypoint.sh against a real orchestrator: enroll once, then reuse the token."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.deploy.compose_env import ROOT
from tests.support import Fleet, child_env, wait_until

SCRIPT = ROOT / "deploy" / "agent-entrypoint.sh"
ADMIN_KEY = "orrk_entrypoint-test-admin"


def script_env(server_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    # The script runs `orrery` from PATH, as in the image: here, this interpreter's environment.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return child_env(
        PATH=path,
        ORRERY_AGENT_SERVER=server_url,
        ORRERY_AGENT_DATA_DIR=str(data_dir),
        ORRERY_AGENT_LABELS='{"role": "sample"}',
        ENROLL_NAME="sample-agent",
        **extra,
    )


def start(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(SCRIPT)], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)


def sample_devices(f: Fleet) -> list[dict[str, object]]:
    with f.server.client(ADMIN_KEY) as c:
        return [d for d in c.get("/v1/devices").json()["items"] if d["name"] == "sample-agent"]


def run_until_idle(f: Fleet, env: dict[str, str], log: Path, what: str) -> dict[str, object]:
    """Start the entrypoint, wait for the one sample device to be idle, stop it; that device."""
    proc = start(env, log)
    try:
        (device,) = wait_until(lambda: [d for d in sample_devices(f) if d["state"] == "idle"], 60, what)
    finally:
        stop(proc)
    # The stopped agent is seen gone (suspect after two 1 s heartbeats) before the next start.
    wait_until(lambda: sample_devices(f)[0]["state"] != "idle", 30, "the stopped agent to be seen gone")
    return device


def test_agent_enrolls_on_first_start_and_is_the_same_device_after_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "agent-data"
    log = tmp_path / "agent.log"
    with Fleet(tmp_path, admin_key=ADMIN_KEY, heartbeat_interval_s="1") as f:
        env = script_env(f.server.url, data_dir, ORRERY_ADMIN_KEY=ADMIN_KEY)
        proc = start(env, log)
        try:
            (device,) = wait_until(
                lambda: [d for d in sample_devices(f) if d["state"] == "idle"], 60, "sample agent idle"
            )
        finally:
            stop(proc)
        token_file = data_dir / "device.token"
        token = token_file.read_text().strip()
        assert token.startswith(f"orrd_{device['id']}.")
        assert token_file.stat().st_mode & 0o077 == 0, "the token file must be private"
        assert device["labels"] == {"role": "sample"}
        assert "enrolled device 'sample-agent'" in log.read_text()
        wait_until(
            lambda: sample_devices(f)[0]["state"] != "idle", 30, "the stopped agent to be seen gone"
        )  # suspect after 2 s

        proc = start(env, log)
        try:
            wait_until(lambda: [d for d in sample_devices(f) if d["state"] == "idle"], 60, "sample agent idle again")
        finally:
            stop(proc)
        assert [d["id"] for d in sample_devices(f)] == [device["id"]], "a restart must not enroll a second device"
        assert token_file.read_text().strip() == token
        assert log.read_text().count("enrolled device") == 1


def test_agent_without_a_token_or_an_admin_key_says_what_to_set(tmp_path: Path) -> None:
    env = script_env("http://127.0.0.1:9", tmp_path / "agent-data")
    done = subprocess.run([str(SCRIPT)], env=env, capture_output=True, timeout=30, check=False)
    assert done.returncode != 0
    assert b"ORRERY_ADMIN_KEY" in done.stderr and b"ORRERY_AGENT_TOKEN" in done.stderr


def test_agent_gives_up_enrolling_after_its_tries_with_the_last_error(tmp_path: Path) -> None:
    env = script_env("http://127.0.0.1:9", tmp_path / "agent-data", ORRERY_ADMIN_KEY=ADMIN_KEY, ENROLL_TRIES="1")
    done = subprocess.run([str(SCRIPT)], env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 1
    assert b"enrollment failed after 1 tries" in done.stderr
    assert b"unreachable" in done.stderr
    assert not (tmp_path / "agent-data" / "device.token").exists()


def test_agent_whose_volume_was_lost_takes_its_device_over_with_a_new_token(tmp_path: Path) -> None:
    """The name is enrolled but the token went with the volume: the same device, a new token, and
    the old token refused; no second device, no 60 tries of a name conflict."""
    data_dir = tmp_path / "agent-data"
    log = tmp_path / "agent.log"
    with Fleet(tmp_path, admin_key=ADMIN_KEY, heartbeat_interval_s="1") as f:
        env = script_env(f.server.url, data_dir, ORRERY_ADMIN_KEY=ADMIN_KEY, ENROLL_TRIES="3")
        device = run_until_idle(f, env, log, "sample agent idle")
        old_token = (data_dir / "device.token").read_text().strip()
        shutil.rmtree(data_dir)  # the volume is lost
        run_until_idle(f, env, log, "the device idle again")
        text = log.read_text()
        assert "is already enrolled and there is no token for it" in text
        assert "took over device 'sample-agent'" in text
        assert [d["id"] for d in sample_devices(f)] == [device["id"]], "the same device, not a second one"
        new_token = (data_dir / "device.token").read_text().strip()
        assert new_token.startswith(f"orrd_{device['id']}.") and new_token != old_token
        with f.server.client(ADMIN_KEY) as c:
            kinds = [h["state"] for h in c.get(f"/v1/devices/{device['id']}/history").json()["items"]]
        assert kinds.count("enrolled") == 1, kinds

        # The old token is refused at the handshake.
        old = subprocess.run(
            [
                sys.executable,
                "-m",
                "device_agent",
                "--server",
                f.server.url,
                "--token",
                old_token,
                "--data-dir",
                str(tmp_path / "old-agent"),
            ],
            env=child_env(),
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert old.returncode != 0
        assert b"401" in old.stderr or b"unauthorized" in old.stderr.lower(), old.stderr[-2000:]


def test_agent_told_to_fail_on_a_name_conflict_stops_at_once(tmp_path: Path) -> None:
    with Fleet(tmp_path, admin_key=ADMIN_KEY) as f:
        f.enroll("sample-agent")
        env = script_env(f.server.url, tmp_path / "agent-data", ORRERY_ADMIN_KEY=ADMIN_KEY, ENROLL_ON_CONFLICT="fail")
        done = subprocess.run([str(SCRIPT)], env=env, capture_output=True, timeout=60, check=False)
        assert done.returncode == 1
        assert b"already enrolled and there is no token for it" in done.stderr
        assert b"conflict" in done.stderr
        assert b"failed after" not in done.stderr, "a conflict is not retried"
        assert not (tmp_path / "agent-data" / "device.token").exists()
        assert len(sample_devices(f)) == 1
