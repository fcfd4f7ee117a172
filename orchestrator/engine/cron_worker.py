"""Cron arithmetic off the event loop: a calendar walk for a rare expression takes milliseconds,
and the loop serves every request and every device socket of this replica meanwhile.

A small pool of its own (not the loop's default executor) bounds how many walks run at once, so a
crowd of viewers polling schedules queues here instead of taking every thread the store, the
artifact files and the rest use.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

WORKERS = 2

_pool: ThreadPoolExecutor | None = None  # made on first use, not at import


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="orrery-cron")
    return _pool


async def off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on a worker thread. With no running loop (the simulation drives the
    engine's coroutines by hand, on a virtual clock) it runs inline: there is no loop to block."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return fn(*args, **kwargs)
    return await loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))
