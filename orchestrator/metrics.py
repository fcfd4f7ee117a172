"""Prometheus metrics (`GET /metrics`). One registry per server, created at start-up; label sets are
bounded (states, outcomes, error codes, purposes), never per task or per device."""

from __future__ import annotations

import bisect
import gc
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class EngineGauges:
    """What the engine holds at scrape time: devices by state, nodes by state, queue depth."""

    devices: Tally[str]
    nodes: Tally[str]
    queue_depth: int


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.schedule_to_start = Histogram(
            "orrery_schedule_to_start_seconds",
            "From a node becoming ready to its batch being dispatched",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.command_roundtrip = Histogram(
            "orrery_batch_roundtrip_seconds",
            "From dispatching a batch to its results being applied",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.heartbeat_lag = Histogram(
            "orrery_heartbeat_lag_seconds",
            "How late a device's frame arrived beyond its heartbeat interval",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batches = Counter(
            "orrery_batches_total", "Batches ended, by outcome (succeeded or an error code)", ["outcome"], registry=r
        )
        self.node_transitions = Counter(
            "orrery_node_transitions_total", "Node state changes, by new state", ["state"], registry=r
        )
        self.llm_calls = Counter(
            "orrery_llm_calls_total", "Model calls, by purpose and outcome", ["purpose", "outcome"], registry=r
        )
        self.llm_tokens = Counter(
            "orrery_llm_tokens_total", "Model tokens, by purpose and kind", ["purpose", "kind"], registry=r
        )
        self.websockets = Gauge(
            "orrery_websocket_connections_open", "Device WebSockets open on this replica", registry=r
        )
        self.websocket_opens = Counter("orrery_websocket_accepted_total", "Device WebSockets accepted", registry=r)
        self.errors = Counter(
            "orrery_errors_total",
            "Errors answered, by stable code (API problems and protocol errors)",
            ["code"],
            registry=r,
        )
        # what schedules' ticks became (a queued tick counts again when it is decided)
        self.schedule_ticks = Counter(
            "orrery_schedule_ticks_total",
            "Schedule ticks, by outcome (created, queued, skipped, missed, failed)",
            ["outcome"],
            registry=r,
        )
        # breaches of a device's safety budgets reported by its agent (each cordons it)
        self.safety_breaches = Counter(
            "orrery_safety_breaches_total",
            "Safety budgets devices reported breached (each cordons the device), by budget",
            ["budget"],
            registry=r,
        )
        self.read_engine: Callable[[], EngineGauges | None] = lambda: None
        r.register(_EngineCollector(self))
        self.gc_pauses = GcPauses()
        r.register(self.gc_pauses)
        self.stop_gc_watch: Callable[[], None] = lambda: None  # set by whoever starts the watch

    def watch(self, read: Callable[[], EngineGauges | None]) -> None:
        """Read the engine's gauges with `read` at scrape time (None: not ready, none shown)."""
        self.read_engine = read


class _EngineCollector(Collector):
    """Gauges read from the engine at scrape time: devices by state, nodes by state, queue depth."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauges = self.metrics.read_engine()
        devices = GaugeMetricFamily("orrery_devices", "Devices by state", labels=["state"])
        nodes = GaugeMetricFamily("orrery_nodes", "Nodes of unfinished tasks by state", labels=["state"])
        queue = GaugeMetricFamily("orrery_queue_depth", "Nodes waiting for a device (ready or queued)")
        if gauges is not None:
            for state, n in gauges.devices.items():
                devices.add_metric([state], n)
            for state, n in gauges.nodes.items():
                nodes.add_metric([state], n)
            queue.add_metric([], gauges.queue_depth)
        yield devices
        yield nodes
        yield queue


class GcPauses(Collector):
    """`orrery_gc_pause_seconds`: how long each pass of Python's cyclic garbage collector held the
    process, by generation. A pass stops the event loop, and with it every heartbeat answer and
    dispatch, for its whole length; at 10,000 device connections a young pass takes tens of
    milliseconds and an older one about a second (`bench/devices.py`), which is what the tail of
    `orrery_heartbeat_lag_seconds` shows. Counted in plain ints from `gc.callbacks` (no lock is
    taken inside a collection) and turned into a histogram at scrape time; `watch` starts counting,
    its return value stops."""

    def __init__(self) -> None:
        self._buckets = [[0] * (len(LATENCY_BUCKETS) + 1) for _ in range(3)]
        self._sums = [0.0, 0.0, 0.0]
        self._started = 0.0

    def watch(self) -> Callable[[], None]:
        gc.callbacks.append(self._on_pass)

        def stop() -> None:
            if self._on_pass in gc.callbacks:
                gc.callbacks.remove(self._on_pass)

        return stop

    def _on_pass(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = min(int(info.get("generation", 2)), 2)
        took = time.perf_counter() - self._started
        self._buckets[generation][bisect.bisect_left(LATENCY_BUCKETS, took)] += 1
        self._sums[generation] += took

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "orrery_gc_pause_seconds",
            "Garbage-collector passes, by generation, and how long each held the process",
            labels=["generation"],
        )
        for generation in range(3):
            counts, total, buckets = self._buckets[generation], 0, []
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                total += n
                buckets.append((str(bound) if bound != float("inf") else "+Inf", total))
            family.add_metric([str(generation)], buckets, self._sums[generation])
        yield family
