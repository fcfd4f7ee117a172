"""A real agent keeps its session file (device_agent/health.py) while connected, and removes it
when the session ends: what the agent image's HEALTHCHECK reads."""

from __future__ import annotations

from pathlib import Path

from device_agent import health
from tests.support import Fleet, wait_until


def test_the_agent_keeps_its_session_file_only_while_connected(tmp_path: Path) -> None:
    with Fleet(tmp_path, heartbeat_interval_s="0.5") as f:
        agent = f.agent("h1")
        data_dir = agent.data_dir
        wait_until(lambda: health.check(data_dir) is None, 60, "the agent to report itself connected")
        first = (data_dir / health.FILE).stat().st_mtime_ns
        wait_until(lambda: (data_dir / health.FILE).stat().st_mtime_ns > first, 30, "a heartbeat to refresh it")

        f.server.stop()  # the orchestrator goes away; the agent stays up, reconnecting
        wait_until(lambda: not (data_dir / health.FILE).exists(), 60, "the session file to be removed")
        assert agent.proc is not None and agent.proc.poll() is None
        assert "not connected" in (health.check(data_dir) or "")

        f.server.start()
        wait_until(lambda: health.check(data_dir) is None, 60, "the agent connected again")
