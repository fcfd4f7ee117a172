"""Timestamp probes for `bench/rtt_timeline.py`, loaded into the server and agent processes it
starts (this folder is put first on their PYTHONPATH, so Python imports this module at start).

With BENCH_TIMELINE=<path prefix> set, a few methods on the round trip's path are wrapped to
note a CLOCK_MONOTONIC timestamp (shared by every process on the machine) on entry and on exit;
each process writes its notes to `<prefix>.<pid>` every second. Nothing here is part of the
product; without the variable this module does nothing.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import inspect
import os
import signal
import sys
import threading
import time
from typing import Any

PREFIX = os.environ.get("BENCH_TIMELINE")

# module -> (class, method, label): the steps of a round trip, server (S.) and agent (A.)
PROBES: dict[str, list[tuple[str, str, str]]] = {
    "orchestrator.gateway.websocket": [
        ("GatewayWebSocketProtocol", "send_receive_event_to_app", "S.frame_in"),
        ("GatewayWebSocketProtocol", "write_text", "S.frame_out"),
    ],
    "orchestrator.engine.core": [("Engine", "step", "S.step")],
    "orchestrator.engine.writer": [("StepWriter", "_write", "S.commit")],
    "device_agent.transport": [("Transport", "recv", "A.frame_in"), ("Transport", "send", "A.frame_out")],
    "device_agent.ledger": [
        ("Ledger", "receive", "A.receipt"),
        ("Ledger", "start_call", "A.call_started"),
        ("Ledger", "finish_batch", "A.results_stored"),
    ],
    "device_agent.router": [("Router", "call", "A.call")],
}


def _install() -> None:
    notes: list[tuple[int, str]] = []
    clock = time.monotonic_ns

    def dump() -> None:
        with open(f"{PREFIX}.{os.getpid()}", "w") as out:
            out.writelines(f"{t} {label}\n" for t, label in list(notes))

    def keep_dumping() -> None:
        while True:
            time.sleep(1.0)
            dump()

    def wrap(cls: Any, name: str, label: str) -> None:
        fn = getattr(cls, name)
        enter, leave = f"{label}>", f"{label}<"
        if inspect.iscoroutinefunction(fn):

            async def probe(*args: Any, **kwargs: Any) -> Any:
                notes.append((clock(), enter))
                try:
                    return await fn(*args, **kwargs)
                finally:
                    notes.append((clock(), leave))
        else:

            def probe(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                notes.append((clock(), enter))
                try:
                    return fn(*args, **kwargs)
                finally:
                    notes.append((clock(), leave))

        setattr(cls, name, functools.wraps(fn)(probe))

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in PROBES:
                return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            assert spec is not None and spec.loader is not None
            load = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                load(module)
                for cls, method, label in PROBES[name]:
                    wrap(getattr(module, cls), method, label)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())
    threading.Thread(target=keep_dumping, name="bench-timeline", daemon=True).start()
    atexit.register(dump)  # the last second's notes too (a short run has no other)
    # uvicorn ends a SIGTERM'd server by raising the signal again, with its default action: the
    # process dies there and atexit never runs. Dump first.
    raise_signal = signal.raise_signal

    def dump_and_raise(sig: int) -> None:
        dump()
        raise_signal(sig)

    signal.raise_signal = dump_and_raise


if PREFIX:
    _install()
