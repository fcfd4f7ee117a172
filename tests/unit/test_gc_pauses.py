"""`orrery_gc_pause_seconds`: every pass of the cyclic garbage collector, by generation, timed."""

from __future__ import annotations

import gc

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.metrics import Metrics


def samples(metrics: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        if family.name == "orrery_gc_pause_seconds":
            for s in family.samples:
                out[s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()))] = s.value
    return out


def test_each_collector_pass_is_counted_under_its_generation_with_its_length() -> None:
    metrics = Metrics()
    assert samples(metrics)["orrery_gc_pause_seconds_count,generation=2"] == 0  # exposed before any pass
    stop = metrics.gc_pauses.watch()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        stop()
    seen = samples(metrics)
    assert seen["orrery_gc_pause_seconds_count,generation=2"] == 2
    assert seen["orrery_gc_pause_seconds_count,generation=0"] >= 1  # a pass may also start on its own
    assert seen["orrery_gc_pause_seconds_sum,generation=2"] > 0
    buckets = [v for k, v in seen.items() if k.startswith("orrery_gc_pause_seconds_bucket,generation=2,")]
    assert buckets == sorted(buckets) and seen["orrery_gc_pause_seconds_bucket,generation=2,le=+Inf"] == 2
    gc.collect(2)  # after stop: no longer counted, and the callback is gone
    assert samples(metrics)["orrery_gc_pause_seconds_count,generation=2"] == 2
    assert metrics.gc_pauses._on_pass not in gc.callbacks
