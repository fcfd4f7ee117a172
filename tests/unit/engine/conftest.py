"""The in-process engine harness (harness.py) as a fixture: a migrated SQLite store, a virtual clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.unit.engine.harness import Harness


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = await (await asyncio.to_thread(Harness, tmp_path)).open()
    try:
        yield harness
    finally:
        await harness.close()
