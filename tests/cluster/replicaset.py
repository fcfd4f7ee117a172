"""Several real `orrery serve` replicas on one Postgres database and one Redis."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support import ROOT, TLS, Agent, Fleet, Server, child_env, free_port, stop_agents, wait_until


class ReplicaSet(Fleet):
    """A `Fleet` whose `server` is replica A, with more replicas in `replicas` (all sharing state)."""

    def __init__(
        self, tmp: Path, database_url: str, redis_url: str, count: int = 2, together: bool = False, **settings: str
    ) -> None:
        super().__init__(tmp)
        self.together = together  # start the replicas at once rather than one after the other
        self.admin_key = "orrk_" + secrets.token_urlsafe(32)
        self.env = child_env(
            ORRERY_DATABASE_URL=database_url,
            ORRERY_REDIS_URL=redis_url,
            ORRERY_SECRET_KEY=secrets.token_hex(32),
            ORRERY_ADMIN_KEY=self.admin_key,
            # a short lease unless the test names one (`lease_ttl_s=...`)
            **{"ORRERY_LEASE_TTL_S": "3", **{f"ORRERY_{k.upper()}": v for k, v in settings.items()}},
        )
        self.replicas = [
            Replica(
                tmp / f"replica-{name}",
                free_port(),
                {**self.env, "ORRERY_REPLICA_ID": f"replica-{name}"},
                self.admin_key,
            )
            for name in "abcdefgh"[:count]
        ]
        self.server = self.replicas[0]

    def __enter__(self) -> ReplicaSet:
        migrate = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "migrate"],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert migrate.returncode == 0, migrate.stderr
        if self.together:
            self.revive()
            return self
        for replica in self.replicas:
            replica.start()
        return self

    def revive(self) -> list[Replica]:
        """Start every replica whose process is not running, all at once; wait until each is
        ready. Returns those started."""
        down = [r for r in self.replicas if not r.alive()]
        for replica in down:
            replica.launch()
        for replica in down:
            replica.wait_ready()
        return down

    def __exit__(self, *_: object) -> None:
        stop_agents(self.agents)
        for replica in self.replicas:
            replica.stop()

    def leader(self) -> Replica:
        return wait_until(
            lambda: next((r for r in self.replicas if r.alive() and r.is_leader()), None),
            30,
            "a replica to lead the engine",
        )

    def agent_on(
        self, replica: Replica, name: str, labels: dict[str, str] | None = None, fallback: list[Replica] = ()
    ) -> Agent:  # type: ignore[assignment]
        enrolled = self.enroll(name, labels)
        extra: list[str] = []
        for other in fallback:
            extra += ["--also-server", other.url]
        agent = Agent(
            name,
            enrolled["id"],
            enrolled["token"],
            self.tmp / "agents" / name,
            replica.url,
            labels or {},
            child_env(),
            extra,
        )
        self.agents.append(agent)
        agent.start()
        self.wait_device(agent.device_id, "idle")
        return agent

    def agent_at(
        self, url: str, name: str, also: Sequence[str] = (), labels: dict[str, str] | None = None, **env: str
    ) -> Agent:
        """Enroll and start an agent that dials `url` (a replica's, or a `TcpProxy` in front of
        one) and fails over to `also` in turn; it is not waited for (see `wait_device`)."""
        enrolled = self.enroll(name, labels)
        extra = [arg for other in also for arg in ("--also-server", other)]
        agent = Agent(
            name,
            enrolled["id"],
            enrolled["token"],
            self.tmp / "agents" / name,
            url,
            labels or {},
            child_env(**env),
            extra,
        )
        self.agents.append(agent)
        return agent.start()

    def live(self) -> list[Replica]:
        """The replicas whose process is running."""
        return [r for r in self.replicas if r.alive()]


class Replica(Server):
    def __init__(self, data_dir: Path, port: int, env: dict[str, str], admin_key: str) -> None:
        super().__init__(
            data_dir,
            port,
            env,
            extra_args=["--no-migrate", "--heartbeat-interval-s", "0.5", "--heartbeat-timeout-s", "4"],
        )
        self._key = admin_key

    @property
    def api_key(self) -> str:
        return self._key

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        try:
            body: dict[str, Any] = httpx.get(f"{self.url}/readyz", timeout=5, verify=TLS).json()
            return body
        except (httpx.HTTPError, ValueError):
            return {}

    def is_leader(self) -> bool:
        return bool(self.status().get("cluster", {}).get("leader"))

    def ready(self) -> bool:
        """`/readyz` answers 200 (its database and Redis are reachable)."""
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2, verify=TLS).status_code == 200
        except httpx.HTTPError:
            return False
