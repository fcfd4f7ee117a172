"""Prometheus metrics (`GET /metrics`). One registry per server, created at start-up; label sets are
bounded (states, outcomes, error codes, purposes), never per task or per device."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
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
        self.read_engine: Callable[[], EngineGauges | None] = lambda: None
        r.register(_EngineCollector(self))

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
