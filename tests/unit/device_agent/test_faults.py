"""ORRERY_AGENT_CRASH_AT: the crash-point test hook is parsed strictly and kills on the n-th pass."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from device_agent.faults import ENV, CrashPoints
from tests.support import ROOT


def test_unset_or_empty_means_no_crash_point() -> None:
    assert CrashPoints.from_env({}).point is None
    assert CrashPoints.from_env({ENV: " "}).point is None


def test_a_point_with_and_without_a_count() -> None:
    assert (CrashPoints.from_env({ENV: "sent"}).point, CrashPoints.from_env({ENV: "sent"}).nth) == ("sent", 1)
    assert CrashPoints.from_env({ENV: "call_done:3"}).nth == 3


@pytest.mark.parametrize("value", ["nowhere", "sent:x", "sent:0", "received:-1"])
def test_a_malformed_value_is_refused_with_the_valid_points(value: str) -> None:
    with pytest.raises(ValueError, match=ENV):
        CrashPoints.from_env({ENV: value})


def test_the_process_is_killed_on_the_nth_pass_of_its_point_only() -> None:
    script = (
        "from device_agent.faults import CrashPoints\n"
        "c = CrashPoints('call_done', 2)\n"
        "for p in ['received', 'call_done', 'sent', 'call_done', 'never']:\n"
        "    c.reach(p); print(p, flush=True)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert run.returncode == -signal.SIGKILL
    assert run.stdout.split() == ["received", "call_done", "sent"]
