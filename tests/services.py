"""Throwaway PostgreSQL and Redis servers for tests (DESIGN, habit 6: real servers, never mocks).

`ORRERY_TEST_POSTGRES_URL` (a `postgresql+asyncpg://` URL whose user may create databases) and
`ORRERY_TEST_REDIS_URL` name servers to use instead. Otherwise each server is started from the
local binaries on a free loopback port in a temporary directory and stopped when the session ends.
Missing binaries skip the tests that need them, except under CI, where they fail loudly: a green
CI run must not hide a missing install step (.ci/run installs them).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy.engine import make_url

from tests.support import free_port

T = TypeVar("T")
POSTGRES_ENV = "ORRERY_TEST_POSTGRES_URL"
REDIS_ENV = "ORRERY_TEST_REDIS_URL"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
START_ATTEMPTS = 3  # a free port can be taken between choosing it and binding it
REDIS_DATABASES = 256  # a throwaway Redis hands each test a database number of its own
# Postgres refuses to run as root. As root we run it as one of these existing accounts, in order.
POSTGRES_OS_USERS = ("postgres", "nobody")


class ServiceError(RuntimeError):
    """A test server could not be started or reached."""


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> NoReturn:
    """Skip on a developer's machine; fail under CI, where the server must be there."""
    if under_ci():
        pytest.fail(f"{reason} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, even if the caller's thread has a running loop."""
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=target, name="tests.services")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def wait_for(check: Any, what: str, proc: subprocess.Popen[bytes] | None, log: Path | None) -> None:
    """Poll `check()` until true, for at most START_TIMEOUT_S; fail early if `proc` exits."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServiceError(f"{what} exited with {proc.returncode} while starting:\n{_tail(log)}")
        if check():
            return
        time.sleep(0.1)
    raise ServiceError(f"{what} was not ready after {START_TIMEOUT_S:.0f}s:\n{_tail(log)}")


def _tail(log: Path | None, lines: int = 30) -> str:
    if log is None or not log.exists():
        return "(no log)"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def stop_process(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)


# ---------------------------------------------------------------- PostgreSQL


def postgres_binary(name: str) -> str | None:
    """`name` from PATH, else from the newest Debian layout (/usr/lib/postgresql/<major>/bin)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = glob.glob(f"/usr/lib/postgresql/*/bin/{name}")
    candidates.sort(key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return candidates[-1] if candidates else None


@dataclass(frozen=True)
class RunAs:
    """Who runs the Postgres binaries: ourselves, or (as root) an unprivileged existing account."""

    user: str | None = None
    uid: int | None = None
    gid: int | None = None

    @classmethod
    def for_postgres(cls) -> RunAs:
        if os.geteuid() != 0:
            return cls()
        for name in POSTGRES_OS_USERS:
            with contextlib.suppress(KeyError):
                entry = pwd.getpwnam(name)
                return cls(name, entry.pw_uid, entry.pw_gid)
        raise ServiceError(f"running as root and none of the accounts {POSTGRES_OS_USERS} exists to run Postgres")

    def own(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def popen_kwargs(self) -> dict[str, Any]:
        """subprocess drops to the account itself (setgid, setgroups([]), setuid): no su/runuser."""
        if self.uid is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


@dataclass
class PostgresServer:
    """A throwaway cluster: trust auth, 127.0.0.1 only, no fsync (its data dies with the session)."""

    root: Path
    port: int
    run_as: RunAs
    proc: subprocess.Popen[bytes] | None = None
    binaries: tuple[str, str | None] | None = None  # postgres, pg_isready: set by `start`, for `restart`

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, argv: list[str]) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}
        done = subprocess.run(
            argv,
            cwd=self.root,
            env=env,
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=False,
            **self.run_as.popen_kwargs(),
        )
        if done.returncode != 0:
            raise ServiceError(
                f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout.decode()}{done.stderr.decode()}"
            )

    def init(self, initdb: str) -> None:
        self._run(
            [
                initdb,
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.root}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "300",  # several orchestrator replicas, each with a pool
            "log_min_messages": "warning",
        }
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# tests/services.py\n" + "".join(f"{k} = {v}\n" for k, v in settings.items()))

    def start(self, postgres: str, pg_isready: str | None) -> None:
        self.binaries = (postgres, pg_isready)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [postgres, "-D", str(self.data_dir), "-p", str(self.port)],
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"},
                start_new_session=True,
                **self.run_as.popen_kwargs(),
            )
        wait_for(lambda: self.ready(pg_isready), f"postgres on port {self.port}", self.proc, self.log_path)

    def ready(self, pg_isready: str | None) -> bool:
        if pg_isready is not None:
            argv = [pg_isready, "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-t", "1"]
            return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
        return run_async(_can_select(self.url))

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGINT)  # SIGINT is Postgres's "fast shutdown"

    def start_again(self) -> None:
        """Start after `stop`, on the same data directory and port: the same database."""
        assert self.binaries is not None, "start the server first"
        self.start(*self.binaries)

    def restart(self) -> None:
        """Fast shutdown (every client connection is cut), then start again on the same data
        directory and port: the same database, briefly unreachable."""
        self.stop()
        self.start_again()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def asyncpg_dsn(url: str) -> str:
    """`postgresql+asyncpg://...` (SQLAlchemy's form, as the orchestrator takes it) for asyncpg itself."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


async def _can_select(url: str) -> bool:
    import asyncpg

    try:
        conn = await asyncpg.connect(asyncpg_dsn(url), timeout=2)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    finally:
        await conn.close()


async def _admin(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(asyncpg_dsn(url), timeout=10)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server of `server_url`, dropped afterwards; yields its URL."""
    name = f"orrery_test_{uuid.uuid4().hex[:12]}"
    run_async(_admin(server_url, f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(server_url, name)
    finally:
        # FORCE (Postgres 13+) ends connections a test left open, e.g. a killed server's pool.
        run_async(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """The URL of a Postgres server: `ORRERY_TEST_POSTGRES_URL`, else a throwaway one."""
    given = os.environ.get(POSTGRES_ENV)
    if given:
        if not given.startswith("postgresql+asyncpg://"):
            raise ServiceError(f"{POSTGRES_ENV} must be a postgresql+asyncpg:// URL, got {given.split('://')[0]}://...")
        yield given
        return
    yield from _throwaway("Postgres", *_postgres_recipe())


@contextlib.contextmanager
def owned_postgres_server() -> Iterator[PostgresServer]:
    """A throwaway Postgres server of the caller's own, to stop and restart at will (fault tests).
    Started from the local binaries even when `ORRERY_TEST_POSTGRES_URL` names a server: a shared
    server is not ours to restart."""
    yield from _throwaway_server("Postgres", *_postgres_recipe())


def _postgres_recipe() -> tuple[Callable[[], PostgresServer], Callable[[PostgresServer], None]]:
    """How to make and start a throwaway Postgres (skips, or fails under CI, without binaries)."""
    binaries = {name: postgres_binary(name) for name in ("initdb", "postgres")}
    missing = [name for name, path in binaries.items() if path is None]
    if missing:
        unavailable(
            f"PostgreSQL server binaries not found ({', '.join(missing)}); install Debian's postgresql "
            f"package or set {POSTGRES_ENV}"
        )
    run_as = RunAs.for_postgres()

    def make() -> PostgresServer:
        # Not under pytest's basetemp (or a private TMPDIR): that is 0700 and ours, so the Postgres
        # account could not reach into it. /tmp is world-traversable; the directory itself is 0700.
        root = Path(tempfile.mkdtemp(prefix="orrery-pg-", dir="/tmp" if run_as.uid is not None else None))
        run_as.own(root)
        return PostgresServer(root, free_port(), run_as)

    def start(server: PostgresServer) -> None:
        server.init(str(binaries["initdb"]))
        server.start(str(binaries["postgres"]), postgres_binary("pg_isready"))

    return make, start


_S = TypeVar("_S", "PostgresServer", "RedisServer")


def _throwaway(what: str, make: Callable[[], _S], start: Callable[[_S], None]) -> Iterator[str]:
    """Start a server on a fresh directory and port (see `_throwaway_server`); yield its URL."""
    with contextlib.contextmanager(_throwaway_server)(what, make, start) as server:
        yield server.url


def _throwaway_server(what: str, make: Callable[[], _S], start: Callable[[_S], None]) -> Iterator[_S]:
    """Start a server on a fresh directory and port, retrying a few times (a port can be taken
    between choosing and binding it); yield it, then stop it and remove its directory."""
    last: ServiceError | None = None
    for _ in range(START_ATTEMPTS):
        server = make()
        try:
            start(server)
        except ServiceError as exc:
            last = exc
            server.stop()
            shutil.rmtree(server.root, ignore_errors=True)
            continue
        try:
            yield server
        finally:
            server.stop()
            shutil.rmtree(server.root, ignore_errors=True)
        return
    raise ServiceError(f"could not start a throwaway {what}: {last}")


# ---------------------------------------------------------------- Redis


@dataclass
class RedisServer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    binary: str | None = None  # set by `start`, for `restart`

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.root / "redis.log"

    def start(self, redis_server: str) -> None:
        self.binary = redis_server
        argv = [
            redis_server,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.root),
            "--databases", str(REDIS_DATABASES),
            "--daemonize", "no",
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for(lambda: redis_pings("127.0.0.1", self.port), f"redis on port {self.port}", self.proc, self.log_path)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, signal.SIGTERM)

    def start_again(self) -> None:
        """Start after `stop`, on the same port. Nothing is persisted (`--save ""`), so the new
        server is empty: every key, subscription and connection of the old one is gone."""
        assert self.binary is not None, "start the server first"
        self.start(self.binary)

    def restart(self) -> None:
        """Stop, then start again on the same port (see `start_again`)."""
        self.stop()
        self.start_again()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def redis_pings(host: str, port: int) -> bool:
    """One PING over a raw socket (no client library needed to tell that the server is up)."""
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """The URL of a Redis server: `ORRERY_TEST_REDIS_URL`, else a throwaway one."""
    given = os.environ.get(REDIS_ENV)
    if given:
        yield given
        return
    yield from _throwaway("Redis", *_redis_recipe())


@contextlib.contextmanager
def owned_redis_server() -> Iterator[RedisServer]:
    """A throwaway Redis server of the caller's own, to stop, restart or disturb at will (fault
    tests). Started from the local binary even when `ORRERY_TEST_REDIS_URL` names a server."""
    yield from _throwaway_server("Redis", *_redis_recipe())


def _redis_recipe() -> tuple[Callable[[], RedisServer], Callable[[RedisServer], None]]:
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable(f"redis-server not found; install Debian's redis-server package or set {REDIS_ENV}")
    return (
        lambda: RedisServer(Path(tempfile.mkdtemp(prefix="orrery-redis-")), free_port()),
        lambda server: server.start(binary),
    )


class RedisDatabases:
    """Hands out a clean database per test: a fresh number on a throwaway server (so a straggler
    from an earlier test cannot write into the next one), the configured one flushed otherwise."""

    def __init__(self, server_url: str, owned: bool) -> None:
        self.server_url = server_url
        self._numbers = itertools.cycle(range(1, REDIS_DATABASES)) if owned else None

    @classmethod
    def for_server(cls, server_url: str) -> RedisDatabases:
        """A server we started is ours to number; one named by ORRERY_TEST_REDIS_URL keeps its database."""
        return cls(server_url, owned=not os.environ.get(REDIS_ENV))

    def next_url(self) -> str:
        import redis

        url = self.server_url
        if self._numbers is not None:
            url = with_redis_db(url, next(self._numbers))
        client = redis.Redis.from_url(url)
        try:
            client.flushdb()
        finally:
            client.close()
        return url


def with_redis_db(url: str, db: int) -> str:
    """`url` naming database number `db` instead of the one it names."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))
