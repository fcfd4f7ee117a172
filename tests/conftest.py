"""Shared servers for tests that only need one and do not disturb it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Fleet


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One server for a module: short hello timeout, small frames, fast heartbeats."""
    tmp: Path = tmp_path_factory.mktemp("fleet")
    with Fleet(tmp, hello_timeout_s="1", max_frame_bytes="65536", heartbeat_interval_s="1") as f:
        yield f
