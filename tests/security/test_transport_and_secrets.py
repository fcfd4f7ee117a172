"""TLS on both sides, warnings for clear text, no secrets in logs or events, no paths from user strings."""

from __future__ import annotations

import os
import sqlite3
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trustme

from tests.support import ROOT, Agent, Fleet, child_env, free_port, shell, wait_until


def test_serve_speaks_https_and_wss_and_the_agent_verifies_it_with_a_ca_file(tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_pem, key_pem, ca_pem = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_pem))
    cert.private_key_pem.write_to_path(str(key_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    port = free_port()
    data = tmp_path / "server"
    log = (tmp_path / "server.log").open("ab")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            str(data),
            "--tls-cert",
            str(cert_pem),
            "--tls-key",
            str(key_pem),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=child_env(),
        cwd=ROOT,
        start_new_session=True,
    )
    url = f"https://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url, ssl.create_default_context(cafile=str(ca_pem))), 60, "the TLS server")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=5)  # an unknown CA is refused by default
        key = (data / "admin.key").read_text().strip()
        with httpx.Client(
            base_url=url,
            verify=ssl.create_default_context(cafile=str(ca_pem)),
            headers={"Authorization": f"Bearer {key}"},
        ) as c:
            trusted = c.post("/v1/devices", json={"name": "tls-ok"}).json()
            untrusted = c.post("/v1/devices", json={"name": "tls-bad"}).json()
            good = Agent(
                "tls-ok",
                trusted["id"],
                trusted["token"],
                tmp_path / "ok",
                url,
                {},
                child_env(),
                ["--ca-file", str(ca_pem)],
            ).start()
            bad = Agent("tls-bad", untrusted["id"], untrusted["token"], tmp_path / "bad", url, {}, child_env()).start()
            try:
                wait_until(lambda: c.get(f"/v1/devices/{good.device_id}").json()["state"] == "idle", 60, "wss agent")
                wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in bad.log(), 60, "the unverified agent to fail")
                assert c.get(f"/v1/devices/{bad.device_id}").json()["state"] == "enrolled"
            finally:
                good.stop()
                bad.stop()
    finally:
        os.killpg(server.pid, 15)
        server.wait(30)
        log.close()


def test_an_agent_using_plain_ws_to_a_remote_host_warns(tmp_path: Path) -> None:
    agent = Agent(
        "remote", "dev_x", "orrd_dev_x.secret", tmp_path / "a", "http://192.0.2.10:9", {}, child_env()
    ).start()
    try:
        wait_until(lambda: "unencrypted" in agent.log(), 30, "the clear-text warning")
    finally:
        agent.stop()


def test_no_secret_appears_in_logs_events_or_responses(tmp_path: Path) -> None:
    with Fleet(tmp_path) as f:
        agent = f.agent("secretive")
        with f.server.client() as c:
            created = c.post("/v1/api-keys", json={"role": "viewer"}).json()
            listed = c.get("/v1/devices").text
            task = c.post("/v1/tasks", json={"dag": {"nodes": [{"id": "n", "commands": [shell(["true"])]}]}}).json()
        httpx.get(f"{f.server.url}/v1/tasks", headers={"Authorization": f"Bearer {created['key']}x"})
        httpx.get(f"{f.server.url}/v1/tasks", headers={"Authorization": f"Bearer {agent.token}"})
        f.wait_task(task["id"])
        events = sqlite3.connect(f.server.data_dir / "orrery.db").execute("SELECT data FROM events").fetchall()
        haystacks = {
            "server log": f.server.log(),
            "agent log": agent.log(),
            "device list": listed,
            "events": repr(events),
            "audit": (agent.data_dir / "audit.jsonl").read_text(),
        }
        for secret in (agent.token, created["key"], f.server.api_key, agent.token.rsplit(".", 1)[1]):
            for where, text in haystacks.items():
                assert secret not in text, f"a secret leaked into the {where}"


def test_user_strings_never_name_a_path(tmp_path: Path) -> None:
    with Fleet(tmp_path) as f:
        f.agent("pathless")
        before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
        evil = ["../../../../tmp/orrery-pwned", "/etc/passwd", "..\\..\\windows", "a/../../b"]
        for name in evil:
            task = f.submit({"nodes": [{"id": "n", "commands": [shell(["true"])]}]}, name=name)
            assert f.wait_task(task["id"])["name"] == name
        with f.server.client() as c:
            nul_name = c.post(
                "/v1/tasks", json={"dag": {"nodes": [{"id": "n", "commands": [shell(["true"])]}]}, "name": "\x00name"}
            )
            assert nul_name.status_code == 422  # no store takes a NUL in text (issue 14)
            bad_device = c.post("/v1/devices", json={"name": "../../escape"})
            bad_node = c.post("/v1/tasks", json={"dag": {"nodes": [{"id": "../x", "commands": [shell(["true"])]}]}})
        assert bad_device.status_code == 422 and bad_node.status_code == 422
        after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
        new = set(after) - set(before)
        assert all(p.startswith(("server/", "agents/")) for p in new), new
        assert not Path("/tmp/orrery-pwned").exists()


def _ready(url: str, ca: ssl.SSLContext) -> bool:
    try:
        return httpx.get(f"{url}/readyz", verify=ca, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
