"""One replica in this process: an engine, a gateway and the Redis cluster that binds them, wired
as `orrery serve` wires them (orchestrator/app.py), for tests that reach inside a replica."""

from __future__ import annotations

from typing import Any

from orchestrator.bus.local import LocalBus
from orchestrator.cluster.replicas import RedisCluster
from orchestrator.config import Settings
from orchestrator.engine.core import Engine
from orchestrator.gateway.hub import Gateway
from orchestrator.security import Hasher
from orchestrator.store.repo import Store


def replica(settings: Settings, store: Store, redis: Any) -> tuple[Engine, Gateway, RedisCluster]:
    """Wired, not started: start the gateway, then the cluster (which starts the engine)."""
    engine = Engine(settings, store, LocalBus())
    gateway = Gateway(settings, store, Hasher(b"k" * 32), engine.metrics)
    cluster = RedisCluster(settings, store, engine, gateway, redis)
    gateway.bind(cluster)
    engine.links = cluster
    return engine, gateway, cluster
