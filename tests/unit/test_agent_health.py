"""device_agent/health.py: the agent image's health check reads the session file the agent keeps."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from device_agent import health


def test_connected_while_the_file_is_fresh_and_not_after(tmp_path: Path) -> None:
    assert health.check(tmp_path) is not None and "not connected" in (health.check(tmp_path) or "")
    health.write(tmp_path, "ws://lb:8765/v1/agent", "s_1", stale_after_s=20)
    assert health.check(tmp_path) is None
    assert "no word from the orchestrator for 21s" in (health.check(tmp_path, now=time.time() + 21) or "")
    health.clear(tmp_path)
    assert "not connected" in (health.check(tmp_path) or "")
    health.clear(tmp_path)  # clearing twice is fine


def test_an_unreadable_file_is_unhealthy_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / health.FILE).write_text("{not json")
    assert "unreadable" in (health.check(tmp_path) or "")
    (tmp_path / health.FILE).write_text('{"at": "soon"}')
    assert "unreadable" in (health.check(tmp_path) or "")


def test_the_command_exits_0_when_connected_and_1_with_the_reason_when_not(tmp_path: Path) -> None:
    def run() -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "device_agent.health", str(tmp_path)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    down = run()
    assert down.returncode == 1 and "not connected" in down.stderr
    health.write(tmp_path, "ws://x/v1/agent", "s_1", stale_after_s=20)
    up = run()
    assert up.returncode == 0 and up.stdout.strip() == "connected"
