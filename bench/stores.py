"""Where a benchmark's orchestrator keeps its state: `--store sqlite|postgres` and `--replicas N`.

- `sqlite` (the default): one `orrery serve` with its durable SQLite file, as before.
- `postgres`: a throwaway PostgreSQL server the benchmark starts and removes (tests/services.py's
  recipe) with a production's durability settings (`fsync`, `synchronous_commit` and
  `full_page_writes` on: every commit waits for its WAL to reach the disk), and `N` real
  `orrery serve` replicas on one database of it; with more than one replica (or `--redis`) also a
  throwaway Redis, their bus. Devices are spread over the replicas round-robin
  (`Cluster.device_url`), so followers relay their frames to the leader.

`ORRERY_BENCH_POSTGRES_SERVER` (a `postgresql+asyncpg://` URL whose user may create databases)
and `ORRERY_BENCH_REDIS_URL` name servers to use instead of throwaway ones (the benchmark then
makes, and drops, a database of its own there, and leaves the server's settings alone).

A benchmark for which a store makes no sense (no server in it) still takes the flags, says so in
its `--help`, and refuses any value but the default with one line (`refuse_store`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.cluster.replicaset import Replica
from tests.support import ROOT, Agent, Fleet, Server, child_env, free_port, stop_agents, wait_until

STORES = ("sqlite", "postgres")
POSTGRES_SERVER_ENV = "ORRERY_BENCH_POSTGRES_SERVER"
REDIS_ENV = "ORRERY_BENCH_REDIS_URL"
# What a production Postgres runs with (tests/services.py turns all three off for speed).
DURABLE_POSTGRES = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
READY_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------- options


def add_store_options(parser: argparse.ArgumentParser, replicas: bool = True) -> None:
    """`--store` and, where the benchmark can spread its devices over replicas, `--replicas`."""
    parser.add_argument(
        "--store",
        choices=STORES,
        default="sqlite",
        help="the orchestrator's store: its SQLite file, or a throwaway Postgres (synchronous_commit=on) "
        "the benchmark starts and removes (default: sqlite)",
    )
    if replicas:
        parser.add_argument(
            "--replicas",
            type=int,
            default=1,
            help="orrery serve replicas on one Postgres and one Redis (more than 1 needs --store postgres; default 1)",
        )
        parser.add_argument(
            "--redis", action="store_true", help="with --store postgres and one replica: run it with Redis all the same"
        )


def check_store_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    replicas = getattr(args, "replicas", 1)
    if replicas < 1:
        parser.error(f"--replicas: at least 1 (got {replicas})")
    if replicas > 1 and args.store != "postgres":
        parser.error("--replicas N needs --store postgres: replicas share one Postgres database and one Redis")
    if getattr(args, "redis", False) and args.store != "postgres":
        parser.error("--redis needs --store postgres")


def refuse_store(parser: argparse.ArgumentParser, why: str, store: bool = True) -> None:
    """Take `--replicas` (and, with `store`, `--store`) for a benchmark where they make no sense;
    its `--help` says why, and `check_refused` accepts only the defaults."""
    if store:
        parser.add_argument("--store", default="sqlite", help=f"only sqlite: {why}")
    parser.add_argument("--replicas", type=int, default=1, help=f"only 1: {why}")


def check_refused(parser: argparse.ArgumentParser, args: argparse.Namespace, why: str, store: bool = True) -> None:
    """One line and exit status 2 for a value other than the default (of `--store` too, with `store`)."""
    given = [f"--store {args.store}"] if store and args.store != "sqlite" else []
    given += [f"--replicas {args.replicas}"] if args.replicas != 1 else []
    if given:
        print(f"{parser.prog}: {' '.join(given)} does not apply: {why}", file=sys.stderr)
        raise SystemExit(2)


def describe(store: str, replicas: int, redis: bool = False) -> str:
    """How the orchestrator ran, for a table's title."""
    if store == "sqlite":
        return "durable SQLite, 1 process"
    bus = " + Redis" if replicas > 1 or redis else ""
    return f"Postgres (synchronous_commit=on), {replicas} replica{'s' if replicas > 1 else ''}{bus}"


# ---------------------------------------------------------------------------------- servers


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """The URL of a fresh database on a durable Postgres (see the module's docstring)."""
    from tests.services import fresh_database, owned_postgres_server, run_async

    given = os.environ.get(POSTGRES_SERVER_ENV)
    if given:
        with fresh_database(given) as url:
            yield url
        return
    with _no_pytest_skip("PostgreSQL"), owned_postgres_server() as server:
        run_async(_make_durable(server.url))
        with fresh_database(server.url) as url:
            yield url


@contextlib.contextmanager
def one_postgres(store: str) -> Iterator[None]:
    """For a benchmark that opens several Postgres databases in a run (say the round trip and
    its floor): one throwaway server for all of them rather than one each."""
    if store != "postgres" or os.environ.get(POSTGRES_SERVER_ENV):
        yield
        return
    from tests.services import owned_postgres_server, run_async

    with _no_pytest_skip("PostgreSQL"), owned_postgres_server() as server:
        run_async(_make_durable(server.url))
        os.environ[POSTGRES_SERVER_ENV] = server.url
        try:
            yield
        finally:
            os.environ.pop(POSTGRES_SERVER_ENV, None)


async def _make_durable(url: str) -> None:
    import asyncpg

    from tests.services import asyncpg_dsn

    conn = await asyncpg.connect(asyncpg_dsn(url), timeout=10)
    try:
        for name, value in DURABLE_POSTGRES.items():
            await conn.execute(f"ALTER SYSTEM SET {name} = {value}")  # one statement each: not in a transaction
        await conn.execute("SELECT pg_reload_conf()")
        # A reload is asynchronous: wait until a new session sees every setting.
        for _ in range(100):
            probe = await asyncpg.connect(asyncpg_dsn(url), timeout=10)
            try:
                seen = {name: await probe.fetchval(f"SHOW {name}") for name in DURABLE_POSTGRES}
            finally:
                await probe.close()
            if seen == DURABLE_POSTGRES:
                return
            await _sleep(0.05)
        raise SystemExit(f"Postgres did not take the durable settings: {seen}")
    finally:
        await conn.close()


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    from tests.services import owned_redis_server

    given = os.environ.get(REDIS_ENV)
    if given:
        yield given
        return
    with _no_pytest_skip("Redis"), owned_redis_server() as server:
        yield server.url


@contextlib.contextmanager
def _no_pytest_skip(what: str) -> Iterator[None]:
    """tests/services.py skips a test when a server binary is missing; a benchmark says so and stops."""
    import pytest

    try:
        yield
    except pytest.skip.Exception as exc:
        raise SystemExit(f"cannot start a throwaway {what}: {exc.msg}") from None


# ---------------------------------------------------------------------------------- the cluster


class Cluster(Fleet):
    """A `Fleet` on either store: `server` is the first replica (the one the benchmark talks to),
    `servers` all of them. On SQLite it is exactly `Fleet`."""

    def __init__(
        self,
        tmp: Path,
        store: str = "sqlite",
        replicas: int = 1,
        database_url: str | None = None,
        redis: str | None = None,
        **settings: str,
    ) -> None:
        super().__init__(tmp, **settings)
        self.store = store
        self.redis = redis
        self.servers: list[Server] = [self.server]
        if store == "sqlite":
            assert replicas == 1, "replicas need Postgres"
            return
        assert database_url is not None
        admin_key = "orrk_" + secrets.token_urlsafe(32)
        extra = {"ORRERY_REDIS_URL": redis} if redis else {}
        self.env = child_env(
            ORRERY_DATABASE_URL=database_url,
            ORRERY_SECRET_KEY=secrets.token_hex(32),
            ORRERY_ADMIN_KEY=admin_key,
            **extra,
            **{f"ORRERY_{k.upper()}": v for k, v in settings.items()},
        )
        self.servers = []
        for i in range(replicas):
            replica = Replica(tmp / f"replica-{i}", free_port(), {**self.env, "ORRERY_REPLICA_ID": f"r{i}"}, admin_key)
            replica.extra_args = ["--no-migrate"]  # the benchmark's settings, not the cluster tests' fast ones
            self.servers.append(replica)
        self.server = self.servers[0]

    @property
    def replicas(self) -> int:
        return len(self.servers)

    def __enter__(self) -> Cluster:
        if self.store == "sqlite":
            super().__enter__()
            return self
        migrate = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "migrate"],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
            check=False,
        )
        if migrate.returncode != 0:
            raise SystemExit(f"orrery migrate failed on Postgres:\n{migrate.stderr}")
        for server in self.servers:
            server.launch()
        for server in self.servers:
            server.wait_ready(READY_TIMEOUT_S)
        if self.replicas > 1:
            self.leader()  # one of them leads before any work is sent
        return self

    def __exit__(self, *_: object) -> None:
        if self.store == "sqlite":
            super().__exit__()
            return
        stop_agents(self.agents)
        for server in self.servers:
            server.stop()

    def device_url(self, i: int) -> str:
        """Where device `i` connects: the replicas in turn."""
        return self.servers[i % len(self.servers)].url

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.servers if s.proc is not None]

    def leader(self, timeout: float = 60) -> Server:
        """The replica that runs the engine (with one replica, that one)."""
        if len(self.servers) == 1:
            return self.server
        return wait_until(
            lambda: next(
                (s for s in self.servers if isinstance(s, Replica) and s.alive() and s.is_leader()),
                None,
            ),
            timeout,
            "a replica to lead the engine",
            interval=0.02,
        )

    def follower(self) -> Server:
        """A replica that does not lead (with one replica, that one): where a device's frames
        take the relay hop to the leader."""
        leader = self.leader()
        return next((s for s in self.servers if s is not leader), leader)

    def agent_at(self, url: str, name: str, labels: dict[str, str] | None = None) -> Agent:
        """A real `orrery agent` connected to the replica at `url`, waited for until idle."""
        enrolled = self.enroll(name, labels)
        agent = Agent(
            name, enrolled["id"], enrolled["token"], self.tmp / "agents" / name, url, labels or {}, child_env()
        )
        self.agents.append(agent)
        agent.start()
        self.wait_device(agent.device_id, "idle")
        return agent

    def use(self, server: Server) -> None:
        """Talk to `server` from now on (the one talked to so far was killed)."""
        self.server = server


@contextlib.contextmanager
def cluster(store: str = "sqlite", replicas: int = 1, redis: bool = False, **settings: str) -> Iterator[Cluster]:
    """A running `Cluster` in a temporary directory, with its Postgres and Redis if it needs
    them; all of it stopped and removed afterwards."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="orrery-bench-")))
        database_url = bus = None
        if store == "postgres":
            database_url = stack.enter_context(postgres_database())
            if replicas > 1 or redis:
                bus = stack.enter_context(redis_url())
        yield stack.enter_context(Cluster(tmp, store, replicas, database_url, bus, **settings))


def from_args(args: argparse.Namespace, **settings: str) -> contextlib.AbstractContextManager[Cluster]:
    return cluster(args.store, getattr(args, "replicas", 1), getattr(args, "redis", False), **settings)


def labels(args: argparse.Namespace) -> dict[str, Any]:
    """The keys every benchmark's JSON line gains."""
    return {"store": args.store, "replicas": getattr(args, "replicas", 1)}
