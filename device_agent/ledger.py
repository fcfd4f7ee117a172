"""The device's durable memory: batch receipts, per-command progress and the result outbox.

SPEC section 4 guarantees rest here:
- a `batch_id` is recorded (with its fence) before its first command runs, and a redelivered
  batch gets the recorded results back instead of a second run;
- results sit in the outbox until the server acknowledges them, so an agent killed with
  SIGKILL delivers them after it restarts;
- a command that was running when the agent died is reported `uncertain`, never re-run;
- a batch whose fence is older than the newest one this device accepted from this server is
  refused (stale). The high-water mark is kept per (server_id, device_id): a data dir reused
  for a new enrollment, or an orchestrator restored from a backup (another fence history), must
  not make every batch stale. Batch ids are globally unique, so de-duplication stays global;
- the ledger belongs to one device (`meta.device_id`). Another device's agent may take it over
  only once nothing of the first device's work is left to report (no outbox entry, no batch
  received or running): its results would otherwise go out under the wrong token, be refused by
  the server and never reach the device they belong to. Such an agent is refused at start.

One SQLite file in WAL mode, written synchronously from the agent's single event loop: every
write is a short transaction, so the loop is held for well under a millisecond. A one-command
batch costs three writes, each touching as few pages as it can (every page a commit touches is
written to the WAL): the receipt (one row, and the fence), the command's start (one statement on
that row) and the results (the row, the outbox, and the acknowledged outbox entries let go).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from pydantic import TypeAdapter

from device_agent.datadir import PRIVATE_DIR, PRIVATE_FILE, private_file
from orrery.checkpoints import Checkpoints
from protocol.errors import ErrorCode
from protocol.messages import CommandBatch, ErrorInfo, OwnerTakeoverState, Result

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fences (
    server_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    max_fence INTEGER NOT NULL,
    PRIMARY KEY (server_id, device_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    fence INTEGER NOT NULL,
    frame TEXT NOT NULL,
    state TEXT NOT NULL,
    received_at REAL NOT NULL,
    finished_at REAL,
    results TEXT,
    running_call TEXT
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS calls (
    batch_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    state TEXT NOT NULL,
    result TEXT,
    PRIMARY KEY (batch_id, call_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    batch_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    reason TEXT NOT NULL,
    local_only INTEGER NOT NULL,
    state TEXT NOT NULL,
    decided_by TEXT,
    decision_reason TEXT,
    deadline REAL,
    reported INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    decided_at REAL,
    UNIQUE (batch_id, call_id)
);
CREATE TABLE IF NOT EXISTS outbox (
    batch_id TEXT PRIMARY KEY,
    fence INTEGER NOT NULL,
    results TEXT NOT NULL,
    created_at REAL NOT NULL
) WITHOUT ROWID;
"""
# WITHOUT ROWID: every table but `approvals` is looked up by its primary key alone, so its rows
# live in the key's own b-tree and a write touches one b-tree instead of the table's and its key
# index's (a commit writes every page it touched to the WAL: fewer pages, a quicker commit).
# Ledgers created before keep their tables; the same statements work on both.

# The process groups the running commands started (device_agent/orphans.py): a row is written
# when a tool starts a process, and goes once it is reaped, with the next batch's results. The
# leader's start time and the boot tell the group from an unrelated one that got the same pid.
_PROCESS_SCHEMA = """
CREATE TABLE IF NOT EXISTS processes (
    pgid INTEGER NOT NULL,
    leader_start INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    PRIMARY KEY (pgid, leader_start)
) WITHOUT ROWID;
"""

KEEP_FINISHED_BATCHES = 10_000
# A batch recorded but never started, with no deadline, is given up this long after it arrived.
UNSTARTED_MAX_AGE_S = 24 * 3600.0


class LedgerError(Exception):
    """The ledger could not be read or written (disk full, read-only, I/O error).

    Never retried or worked around: an agent that cannot record what it runs cannot keep the
    at-most-once guarantee, so it stops, and recovery sorts things out when it starts again.
    """


class LedgerOwned(Exception):
    """The ledger holds another device's work that is not yet reported: this device may not use it."""


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _durable(method: Callable[Concatenate[Ledger, _P], _T]) -> Callable[Concatenate[Ledger, _P], _T]:
    """Turn a storage failure inside `method` into a `LedgerError` naming the ledger and the step."""

    @functools.wraps(method)
    def wrapper(self: Ledger, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(self, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            raise LedgerError(f"the ledger {self.path} failed in {method.__name__}: {exc}") from exc

    return wrapper


def _make_private(path: Path) -> None:
    """Create the ledger file 0600 before SQLite opens it (SQLite would create it 0644 less the
    umask), and tighten it and its companions if they exist wider. SQLite creates the `-wal`,
    `-shm` and `-journal` files with the database file's mode, so they are born 0600 too."""
    try:
        os.close(private_file(path))
        for suffix in ("-wal", "-shm", "-journal"):
            companion = path.with_name(path.name + suffix)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_IMODE(companion.lstat().st_mode) != PRIVATE_FILE and not companion.is_symlink():
                    os.chmod(companion, PRIVATE_FILE)
    except OSError as exc:
        raise LedgerError(f"the ledger {path} cannot be made private (0600): {exc}") from exc


OWNER_TAKEOVER_KEY = "owner_takeover"  # the meta row `orrery agent takeover` and `handback` write


class Receipt(StrEnum):
    NEW = "new"  # recorded now: run it
    PENDING = "pending"  # recorded earlier, not finished: it is queued or running
    DONE = "done"  # finished earlier: send the recorded results again
    STALE = "stale"  # older than a fence already seen: refuse


@dataclass(frozen=True)
class AppliedControl:
    """The device's controls as this agent last applied them: the generation is the server's
    (`server_id`'s), so a ledger welcomed by another orchestrator starts again from its word."""

    server_id: str
    gen: int
    stopped: bool
    reason: str
    taken_over: bool = False  # an operator's takeover (see `device_agent.takeover`)
    takeover_by: str = ""


@dataclass(frozen=True)
class OutboxEntry:
    batch_id: str
    fence: int
    results: list[Result]


@dataclass(frozen=True)
class ProcessRecord:
    """A process group a command started: its id, its leader's start time (clock ticks after
    boot, 0 if unknown) and the boot, and the batch and call it belongs to."""

    pgid: int
    leader_start: int
    boot_id: str
    batch_id: str
    call_id: str


class Ledger:
    """The ledger of one agent, whose device is `device_id` (the token's device)."""

    def __init__(self, path: Path, device_id: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        self.path = path
        self.device_id = device_id
        _make_private(path)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode survives a killed process (not a power cut) at a fraction of FULL's
        # cost; checkpoints run on a thread of their own, not inside a batch's commit
        # (`orrery.checkpoints`).
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        self._checkpoints = Checkpoints(path)
        self._db.executescript(_SCHEMA)
        self._db.executescript(_PROCESS_SCHEMA)
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(batches)")}
        if "running_call" not in columns:  # a ledger from before `running_call`
            self._db.execute("ALTER TABLE batches ADD COLUMN running_call TEXT")
        self.rebound_from: str | None = None
        try:
            self._bind_device()
        except BaseException:
            self._checkpoints.close()
            self._db.close()
            raise
        # An older ledger kept one 'max_fence' for the whole data dir, bound to no server or
        # device; it is not carried over (it is what made re-enrolled devices refuse every batch).
        row = self._db.execute("SELECT value FROM meta WHERE key='server_id'").fetchone()
        self._server_id: str = row[0] if row else ""
        self._max_fence = self._load_fence()
        self._approval_batches: set[str] | None = None  # loaded on first use (`has_approval`)
        # Outbox entries the server acknowledged on a frame that brought a batch: they leave the
        # outbox in the next transaction that writes it anyway (see `receive`), and meanwhile
        # `outbox()` leaves them out.
        self._let_go: set[str] = set()
        # Process groups reaped by now: their rows go with the next `finish_batch` (see `process_reaped`).
        self._reaped: set[tuple[int, int]] = set()

    def _bind_device(self) -> None:
        """The ledger belongs to one device; another device may take it over only when nothing of
        the first one's work is still to be reported (its results would go out under the wrong
        device, be refused by the server as `unknown_batch`, and never reach the first device)."""
        row = self._db.execute("SELECT value FROM meta WHERE key='device_id'").fetchone()
        if row is not None and row[0] != self.device_id:
            owner = str(row[0])
            (unsent,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
            (unfinished,) = self._db.execute(
                "SELECT COUNT(*) FROM batches WHERE state IN ('received', 'running')"
            ).fetchone()
            if unsent or unfinished:
                raise LedgerOwned(
                    f"the data dir {self.path.parent} holds the ledger of device {owner}, with "
                    f"{unsent + unfinished} batch(es) not yet reported to the orchestrator, but this agent is "
                    f"device {self.device_id}: give it its own --data-dir (or none: the default is "
                    f"./.orrery-agent/<device id>), or run device {owner}'s agent here first"
                )
            self.rebound_from = owner
        if row is None or row[0] != self.device_id:
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('device_id', ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (self.device_id,),
            )

    def close(self) -> None:
        if self._let_go:
            with contextlib.suppress(sqlite3.Error, OSError):  # best effort: a resend is de-duplicated
                self.acknowledged()
        self._checkpoints.close()
        try:
            self._db.close()
        except sqlite3.Error:
            pass  # closing a ledger that already failed: the failure was reported where it happened

    # ------------------------------------------------------------------ fences

    @property
    def server_id(self) -> str:
        """The orchestrator this ledger was last welcomed by ("" if it never said who it is)."""
        return self._server_id

    @property
    def max_fence(self) -> int:
        """The highest fence accepted for this device from `server_id`: `hello.fence_seen`."""
        return self._max_fence

    @_durable
    def welcomed(self, server_id: str | None) -> None:
        """A `welcome` named the orchestrator's store: fences from now on are compared with its history."""
        server = server_id or ""
        if server == self._server_id:
            return
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES ('server_id', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (server,),
        )
        self._server_id = server
        self._max_fence = self._load_fence()

    def _load_fence(self) -> int:
        row = self._db.execute(
            "SELECT max_fence FROM fences WHERE server_id=? AND device_id=?", (self._server_id, self.device_id)
        ).fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------ controls

    @_durable
    def control(self) -> AppliedControl:
        """The device's controls as the last one applied left them (`protocol.messages.ControlState`)."""
        row = self._db.execute("SELECT value FROM meta WHERE key='control'").fetchone()
        if row is not None:
            data = json.loads(row[0])
            return AppliedControl(
                str(data.get("server", "")),
                int(data.get("gen", 0)),
                bool(data.get("stopped")),
                str(data.get("reason", "")),
                bool(data.get("taken_over")),
                str(data.get("takeover_by", "")),
            )
        # A ledger from before control generations kept only the stop.
        old = self._db.execute("SELECT value FROM meta WHERE key='stop'").fetchone()
        stopped = old is not None and bool(old[0])
        return AppliedControl(self._server_id, 0, stopped, str(old[0])[1:] if stopped else "")

    @_durable
    def set_control(self, applied: AppliedControl) -> None:
        """Keep the controls across agent restarts: stored before the agent acts on them."""
        value = json.dumps(
            {
                "server": applied.server_id,
                "gen": applied.gen,
                "stopped": applied.stopped,
                "reason": applied.reason,
                "taken_over": applied.taken_over,
                "takeover_by": applied.takeover_by,
            }
        )
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES ('control', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (value,),
        )

    @_durable
    def owner_takeover(self) -> OwnerTakeoverState | None:
        """The owner's takeover at the device (`orrery agent takeover`), as it last wrote it."""
        row = self._db.execute(f"SELECT value FROM meta WHERE key='{OWNER_TAKEOVER_KEY}'").fetchone()
        return OwnerTakeoverState.model_validate_json(row[0]) if row is not None else None

    # ------------------------------------------------------------------ batches

    @_durable
    def receive(self, batch: CommandBatch, acknowledged: Iterable[str] = (), frame: str | None = None) -> Receipt:
        """Record a delivered batch before anything of it runs.

        `frame`: the batch's frame as it arrived (stored for recovery; else it is encoded again).
        `acknowledged`: outbox entries the frame that brought the batch acknowledged (its `ack`).
        They are not deleted here but in the batch's own `finish_batch` (or the next write of the
        outbox), whose transaction writes the outbox's pages anyway: the receipt, which stands
        between the frame and the command, stays one b-tree insert. Letting them go later is
        always safe: until then `outbox()` leaves them out, and after a restart they are sent
        again and the server de-duplicates them."""
        with self._tx():
            row = self._db.execute("SELECT state FROM batches WHERE batch_id=?", (batch.batch_id,)).fetchone()
            if row is not None:
                receipt = Receipt.DONE if row[0] == "done" else Receipt.PENDING
            elif batch.fence < self.max_fence:
                receipt = Receipt.STALE
            else:
                receipt = Receipt.NEW
                self._db.execute(
                    "INSERT INTO batches (batch_id, fence, frame, state, received_at) VALUES (?,?,?,?,?)",
                    (batch.batch_id, batch.fence, frame or batch.model_dump_json(), "received", time.time()),
                )
                if batch.fence > self._max_fence:
                    self._db.execute(
                        "INSERT INTO fences (server_id, device_id, max_fence) VALUES (?,?,?) "
                        "ON CONFLICT(server_id, device_id) DO UPDATE SET max_fence=excluded.max_fence",
                        (self._server_id, self.device_id, batch.fence),
                    )
        if receipt is Receipt.NEW:
            self._max_fence = max(self._max_fence, batch.fence)  # only once the transaction committed
        self._let_go.update(acknowledged)
        return receipt

    @_durable
    def pending_batches(self) -> list[CommandBatch]:
        """Batches recorded but not started, oldest first (run again only if redelivered)."""
        rows = self._db.execute("SELECT frame FROM batches WHERE state='received' ORDER BY received_at").fetchall()
        return [CommandBatch.model_validate_json(r[0]) for r in rows]

    @_durable
    def start_call(self, batch_id: str, call_id: str) -> None:
        """The command is about to run: a crash from now on reports it `uncertain` (`recover`).
        One statement, on the batch's own row: the command's row is written when it is done."""
        self._db.execute(
            "UPDATE batches SET state='running', running_call=? WHERE batch_id=? AND state!='done'",
            (call_id, batch_id),
        )

    @_durable
    def finish_call(self, batch_id: str, result: Result) -> None:
        """A command of a batch with more to run is done: its result is kept (a restart, or an
        approval's wait, does not run it again)."""
        self._db.execute(
            "INSERT OR REPLACE INTO calls (batch_id, call_id, state, result) VALUES (?,?,'done',?)",
            (batch_id, result.call_id, result.model_dump_json()),
        )

    @_durable
    def finish_batch(self, batch_id: str, fence: int, results: list[Result], payload: str | None = None) -> None:
        """Results become final and enter the outbox in one transaction, which also lets go of
        the acknowledged outbox entries (see `receive`).

        `payload`: `results_json(results)` when the caller already has it (the agent measures the
        result frame with it), so the results are serialised once."""
        if payload is None:
            payload = results_json(results)
        now = time.time()
        let_go = list(self._let_go)
        reaped = list(self._reaped)
        with self._tx():
            self._db.execute(
                "UPDATE batches SET state='done', finished_at=?, results=?, running_call=NULL WHERE batch_id=?",
                (now, payload, batch_id),
            )
            self._db.execute(
                "INSERT OR REPLACE INTO outbox (batch_id, fence, results, created_at) VALUES (?,?,?,?)",
                (batch_id, fence, payload, now),
            )
            self._db.execute("DELETE FROM calls WHERE batch_id=?", (batch_id,))
            self._forget(let_go)
            self._forget_processes(reaped)
        self._let_go.difference_update(let_go)
        self._reaped.difference_update(reaped)

    @_durable
    def done_calls(self, batch_id: str) -> dict[str, Result]:
        """Results of the commands of a batch that finished before it stopped to wait for an
        approval (and the agent restarted): they are not run again."""
        rows = self._db.execute(
            "SELECT call_id, result FROM calls WHERE batch_id=? AND state='done' AND result IS NOT NULL", (batch_id,)
        ).fetchall()
        return {r[0]: Result.model_validate_json(r[1]) for r in rows}

    # ------------------------------------------------------------------ approvals

    @_durable
    def approval_for(self, batch_id: str, call_id: str) -> Approval | None:
        row = self._db.execute(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE batch_id=? AND call_id=?", (batch_id, call_id)
        ).fetchone()
        return approval_from_row(row) if row else None

    @_durable
    def approval(self, approval_id: str) -> Approval | None:
        row = self._db.execute(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE approval_id=?", (approval_id,)
        ).fetchone()
        return approval_from_row(row) if row else None

    @_durable
    def has_approval(self, batch_id: str) -> bool:
        """Whether a command of the batch asked for an approval (kept in memory: asked per batch
        on the hot path, and only this agent adds approvals)."""
        if self._approval_batches is None:
            rows = self._db.execute("SELECT DISTINCT batch_id FROM approvals").fetchall()
            self._approval_batches = {r[0] for r in rows}
        return batch_id in self._approval_batches

    @_durable
    def approvals(self, state: str | None = None) -> list[Approval]:
        where, params = ("WHERE state=?", (state,)) if state else ("", ())
        rows = self._db.execute(
            f"SELECT {APPROVAL_COLUMNS} FROM approvals {where} ORDER BY created_at", params
        ).fetchall()
        return [approval_from_row(r) for r in rows]

    @_durable
    def ask_approval(self, approval: Approval) -> None:
        """Record that a command waits for an approval, before the request goes out: a restart
        asks again with the same id, and nothing of the command has run."""
        with self._tx():
            self._db.execute(
                "INSERT INTO approvals (approval_id, batch_id, call_id, tool, arguments, reason, local_only, state, "
                "created_at) VALUES (?,?,?,?,?,?,?,'pending',?)",
                (
                    approval.approval_id,
                    approval.batch_id,
                    approval.call_id,
                    approval.tool,
                    json.dumps(approval.arguments),
                    approval.reason,
                    int(approval.local_only),
                    approval.created_at,
                ),
            )
            self._db.execute(
                "INSERT OR REPLACE INTO calls (batch_id, call_id, state) VALUES (?,?,'approval')",
                (approval.batch_id, approval.call_id),
            )
        if self._approval_batches is not None:
            self._approval_batches.add(approval.batch_id)

    @_durable
    def decide(self, approval_id: str, state: str, by: str, reason: str = "") -> bool:
        """Record a decision on a pending approval; False if it was not pending (decided already).
        The ledger is the approval's one arbiter: the first decision recorded here holds, whoever
        made it (this agent, the owner's `orrery agent approve`, a request from the server)."""
        cur = self._db.execute(
            "UPDATE approvals SET state=?, decided_by=?, decision_reason=?, decided_at=?, reported=0 "
            "WHERE approval_id=? AND state='pending'",
            (state, by, reason, time.time(), approval_id),
        )
        return cur.rowcount == 1

    @_durable
    def reported(self, approval_id: str) -> None:
        """The server acknowledged the decision that holds: it is recorded there."""
        self._db.execute("UPDATE approvals SET reported=1 WHERE approval_id=? AND state != 'pending'", (approval_id,))

    @_durable
    def results(self, batch_id: str) -> list[Result] | None:
        row = self._db.execute("SELECT results FROM batches WHERE batch_id=? AND state='done'", (batch_id,)).fetchone()
        return _results(row[0]) if row else None

    @_durable
    def fence_of(self, batch_id: str) -> int | None:
        row = self._db.execute("SELECT fence FROM batches WHERE batch_id=?", (batch_id,)).fetchone()
        return int(row[0]) if row else None

    # ------------------------------------------------------------------ outbox

    @_durable
    def outbox(self) -> list[OutboxEntry]:
        """Results not yet acknowledged by the server, oldest first."""
        rows = self._db.execute("SELECT batch_id, fence, results FROM outbox ORDER BY created_at").fetchall()
        return [OutboxEntry(r[0], int(r[1]), _results(r[2])) for r in rows if r[0] not in self._let_go]

    @_durable
    def acknowledged(self, *batch_ids: str) -> None:
        """The server acknowledged these result batches: they are durable there, let them go here
        (with any acknowledged earlier and not let go yet, see `receive`)."""
        let_go = [*self._let_go, *batch_ids]
        if len(let_go) == 1:
            self._forget(let_go)
        elif let_go:
            with self._tx():
                self._forget(let_go)
        self._let_go.clear()

    def _forget(self, batch_ids: Iterable[str]) -> None:
        for batch_id in batch_ids:
            self._db.execute("DELETE FROM outbox WHERE batch_id=?", (batch_id,))

    # ------------------------------------------------------------------ processes the commands started

    @functools.cached_property
    def identity(self) -> str:
        """A random id this ledger keeps for life: the mark on what its agent's commands start
        (device_agent/orphans.py), which tells them from another agent's on the same machine."""
        return self._identity()

    @_durable
    def _identity(self) -> str:
        row = self._db.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()
        if row is not None:
            return str(row[0])
        made = secrets.token_hex(8)
        self._db.execute("INSERT INTO meta (key, value) VALUES ('ledger_id', ?)", (made,))
        return made

    @_durable
    def record_process(self, record: ProcessRecord) -> None:
        """A tool started a process group: kept before the command can do much, so that the
        next agent can kill it if this one dies first. One statement, one small row."""
        self._db.execute(
            "INSERT OR REPLACE INTO processes (pgid, leader_start, boot_id, batch_id, call_id) VALUES (?,?,?,?,?)",
            (record.pgid, record.leader_start, record.boot_id, record.batch_id, record.call_id),
        )

    def process_reaped(self, pgid: int, leader_start: int) -> None:
        """The group's leader was reaped (its group killed, if it outlived it): its row goes with
        the next `finish_batch`, which writes anyway. Meanwhile a restart finds the row, and the
        leader's identity tells that it is gone (device_agent/orphans.py)."""
        self._reaped.add((pgid, leader_start))

    @_durable
    def processes(self) -> list[ProcessRecord]:
        """The process groups recorded and not yet let go: what the last run may have left running."""
        rows = self._db.execute("SELECT pgid, leader_start, boot_id, batch_id, call_id FROM processes").fetchall()
        return [ProcessRecord(int(r[0]), int(r[1]), r[2], r[3], r[4]) for r in rows]

    @_durable
    def clear_processes(self) -> None:
        """Every recorded group is dealt with (killed, or found gone)."""
        self._db.execute("DELETE FROM processes")
        self._reaped.clear()

    def _forget_processes(self, groups: Iterable[tuple[int, int]]) -> None:
        for pgid, leader_start in groups:
            self._db.execute("DELETE FROM processes WHERE pgid=? AND leader_start=?", (pgid, leader_start))

    # ------------------------------------------------------------------ recovery

    @_durable
    def recover(self, now: float | None = None, notes: Mapping[tuple[str, str], str] | None = None) -> list[str]:
        """After a crash or a stop, close what the last run left open; returns the batch ids closed.

        A batch that was running: commands that finished keep their results, the one that was
        running is `uncertain`, the rest are `skipped`. A batch delivered but never started
        whose deadline has passed (or, with no deadline, that arrived over 24 h ago) is closed
        with every command `skipped` (`timeout`). Either way the results go to the outbox, so
        the server hears of them. An unstarted batch not yet due stays, and runs only if the
        server delivers it again.

        `notes`, by (batch id, call id): what became of the processes an `uncertain` command left
        running (device_agent/orphans.py), said in its result.
        """
        now = time.time() if now is None else now
        closed = []
        rows = self._db.execute(
            "SELECT batch_id, fence, frame, running_call FROM batches WHERE state='running'"
        ).fetchall()
        for batch_id, fence, frame, running_call in rows:
            batch = CommandBatch.model_validate_json(frame)
            calls = {
                c: (s, r)
                for c, s, r in self._db.execute(
                    "SELECT call_id, state, result FROM calls WHERE batch_id=?", (batch_id,)
                ).fetchall()
            }
            # The command that was running: the batch row names it until it is done (a ledger
            # written by an older agent marked it with a 'started' row of its own).
            running = {c for c, (state, _) in calls.items() if state == "started"}
            if running_call is not None and calls.get(running_call, ("", None))[0] != "done":
                running.add(running_call)
            if not running and any(state == "approval" for state, _ in calls.values()):
                continue  # waiting for a person's approval: nothing is running, it goes on when redelivered
            results: list[Result] = []
            for cmd in batch.commands:
                state, raw = calls.get(cmd.call_id, (None, None))
                if state == "done" and raw:
                    results.append(Result.model_validate_json(raw))
                elif cmd.call_id in running:
                    results.append(uncertain(cmd.call_id, cmd.tool, (notes or {}).get((batch_id, cmd.call_id), "")))
                else:
                    results.append(skipped(cmd.call_id, cmd.tool, "an earlier command did not finish"))
            self.finish_batch(batch_id, int(fence), results)
            closed.append(batch_id)
        unstarted = self._db.execute(
            "SELECT batch_id, fence, frame, received_at FROM batches WHERE state='received'"
        ).fetchall()
        waiting = {r[0] for r in self._db.execute("SELECT DISTINCT batch_id FROM approvals").fetchall()}
        for batch_id, fence, frame, received_at in unstarted:
            if batch_id in waiting:
                continue  # its deadline waits with it (an approval moves the deadline on)
            batch = CommandBatch.model_validate_json(frame)
            if batch.deadline is not None and batch.deadline.timestamp() <= now:
                self.finish_batch(batch_id, int(fence), deadline_passed(batch))
            elif batch.deadline is None and now - float(received_at) >= UNSTARTED_MAX_AGE_S:
                why = (
                    f"not run: the batch arrived {(now - float(received_at)) / 3600:.0f} h ago and never "
                    "started (the agent stopped first); with no deadline it is given up after 24 h"
                )
                self.finish_batch(batch_id, int(fence), none_ran(batch, ErrorCode.TIMEOUT, why))
            else:
                continue
            closed.append(batch_id)
        self._prune()
        return closed

    def _prune(self) -> None:
        # A decision the server has not acknowledged is kept, whatever became of its batch: it is
        # reported until the server records it (the store must hold what the device decided).
        self._db.execute(
            "DELETE FROM approvals WHERE batch_id IN (SELECT batch_id FROM batches WHERE state='done') "
            "AND state != 'pending' AND reported = 1"
        )
        self._approval_batches = None  # read again on next use
        self._db.execute(
            "DELETE FROM batches WHERE state='done' AND batch_id NOT IN "
            "(SELECT batch_id FROM batches WHERE state='done' ORDER BY finished_at DESC LIMIT ?)",
            (KEEP_FINISHED_BATCHES,),
        )

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)


@dataclass(frozen=True)
class Approval:
    """A command waiting for (or given) a person's approval, as this device recorded it."""

    approval_id: str
    batch_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    reason: str
    local_only: bool
    created_at: float
    state: str = "pending"  # pending, approved, denied, expired, cancelled
    decided_by: str | None = None
    decision_reason: str | None = None
    deadline: float | None = None  # unused since the agent measures the wait itself (older ledgers)
    # The decision that holds has been acknowledged by the server (it is recorded there): until
    # then it is reported again on every new session, whoever made it.
    reported: bool = False
    decided_at: float | None = None  # this device's clock

    @property
    def waited_s(self) -> float:
        """How long the command waited for its decision (0 while it waits)."""
        if self.decided_at is None:
            return 0.0
        return max(0.0, self.decided_at - self.created_at)


APPROVAL_COLUMNS = (
    "approval_id, batch_id, call_id, tool, arguments, reason, local_only, created_at, state, decided_by, "
    "decision_reason, deadline, reported, decided_at"
)


def approval_from_row(row: tuple[Any, ...]) -> Approval:
    return Approval(
        row[0],
        row[1],
        row[2],
        row[3],
        json.loads(row[4]),
        row[5],
        bool(row[6]),
        float(row[7]),
        row[8],
        row[9],
        row[10],
        row[11],
        bool(row[12]),
        float(row[13]) if row[13] is not None else None,
    )


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


_RESULTS: TypeAdapter[list[Result]] = TypeAdapter(list[Result])


def results_json(results: list[Result]) -> str:
    """Results as the JSON array the ledger stores (compact; the same fields a frame carries)."""
    return _RESULTS.dump_json(results).decode()


def _results(raw: str) -> list[Result]:
    data: list[dict[str, Any]] = json.loads(raw)
    return [Result.model_validate(r) for r in data]


def namespace_of(tool: str) -> str:
    return tool.split(".", 1)[0]


def skipped(call_id: str, tool: str, why: str, code: str = "skipped") -> Result:
    return Result(
        call_id=call_id,
        status="skipped",
        namespace=namespace_of(tool),
        error=ErrorInfo(code=code, message=why),
    )


def none_ran(batch: CommandBatch, code: str, why: str) -> list[Result]:
    """Every command of `batch` `skipped` with `code`: the batch was refused or dropped unstarted."""
    return [skipped(cmd.call_id, cmd.tool, why, code) for cmd in batch.commands]


def deadline_passed(batch: CommandBatch) -> list[Result]:
    """The results of a batch whose deadline passed before it started: nothing ran."""
    when = batch.deadline.isoformat() if batch.deadline else "?"
    why = f"not run: the batch's deadline ({when}) passed before it started on the device, so none of its commands ran"
    return none_ran(batch, ErrorCode.TIMEOUT, why)


def uncertain(call_id: str, tool: str, note: str = "") -> Result:
    return Result(
        call_id=call_id,
        status="uncertain",
        namespace=namespace_of(tool),
        error=ErrorInfo(
            code="uncertain",
            message="the agent stopped while this command was running, so it may or may not have "
            "taken effect; check the device's state before running it again" + (f" ({note})" if note else ""),
        ),
    )
