"""Apply the schema with Alembic (`orrery migrate`, and `orrery serve` at start-up)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations


def alembic_config(url: str) -> Config:
    here = Path(migrations.__file__).parent
    cfg = Config(str(here / "alembic.ini"))
    cfg.set_main_option("script_location", str(here))
    cfg.set_main_option("version_locations", str(here / "versions"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


async def upgrade_async(url: str) -> None:
    """Alembic's env runs its own event loop, so it gets a thread of its own."""
    await asyncio.to_thread(upgrade, url)
