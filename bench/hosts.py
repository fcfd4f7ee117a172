"""Child processes that host simulated devices, each a share of them on its own event loop, so the
benchmark's process (which submits, kills, restarts and measures) is never starved by them. Each
answers commands over a pipe; `time.time()` and `time.monotonic()` there and here share a clock."""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any


class HostPool:
    """One spawned process per share: `target(*share, pipe)` serves commands until "stop"."""

    def __init__(self, target: Callable[..., None], shares: Sequence[tuple[Any, ...]]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for share in shares:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=target, args=(*share, theirs), daemon=True)
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)

    def ask(self, command: str) -> list[Any]:
        """Every host's answer to `command`, in host order."""
        for pipe in self.pipes:
            pipe.send(command)
        return [pipe.recv() for pipe in self.pipes]

    def connected(self) -> int:
        return sum(self.ask("connected"))

    def close(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self.ask("stop")
        for proc in self.procs:
            proc.join(30)
