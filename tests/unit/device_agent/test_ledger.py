"""The device ledger: receipts before running, recorded results on redelivery, uncertain after a crash."""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from device_agent import ledger as ledger_module
from device_agent.ledger import Approval, Ledger, LedgerOwned, Receipt, results_json
from protocol.messages import Command, CommandBatch, Result
from tests.support import wait_until

DEVICE = "dev_1"


def batch(batch_id: str, fence: int, n: int = 2, deadline: float | None = None) -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id,
        task_id="t",
        node_id="n",
        attempt=1,
        fence=fence,
        deadline=datetime.fromtimestamp(deadline, UTC) if deadline is not None else None,
        commands=[Command(call_id=f"c{i}", tool="shell.run") for i in range(1, n + 1)],
    )


def ok(call_id: str) -> Result:
    return Result(call_id=call_id, status="success", result="r", namespace="shell")


def test_a_batch_is_new_once_then_pending_then_done_with_its_results(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    b = batch("b1", 1)
    assert ledger.receive(b) is Receipt.NEW
    assert ledger.receive(b) is Receipt.PENDING
    ledger.finish_batch("b1", 1, [ok("c1"), ok("c2")])
    assert ledger.receive(b) is Receipt.DONE
    assert [r.call_id for r in ledger.results("b1") or []] == ["c1", "c2"]


def test_a_batch_older_than_the_newest_fence_is_stale(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ledger.receive(batch("b2", 5))
    assert ledger.receive(batch("b1", 4)) is Receipt.STALE
    assert ledger.max_fence == 5
    assert ledger.results("b1") is None and ledger.fence_of("b1") is None  # a refused batch leaves no trace


def test_the_fence_high_water_mark_belongs_to_one_server_and_one_device(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ledger.welcomed("srv-a")
    ledger.receive(batch("a5", 5))
    ledger.welcomed("srv-b")  # another orchestrator store: its fences have their own history
    assert ledger.max_fence == 0
    assert ledger.receive(batch("b1", 1)) is Receipt.NEW
    ledger.welcomed("srv-a")
    assert ledger.max_fence == 5
    assert ledger.receive(batch("a3", 3)) is Receipt.STALE


def test_a_data_dir_reused_by_a_new_enrollment_accepts_its_first_fences(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    old = Ledger(path, "dev_old")
    old.welcomed("srv")
    old.receive(batch("b9", 9))
    old.finish_batch("b9", 9, [ok("c1"), ok("c2")])
    old.acknowledged("b9")  # everything of the old device reached the server
    old.close()
    new = Ledger(path, "dev_new")
    assert new.rebound_from == "dev_old"
    assert (new.server_id, new.max_fence) == ("srv", 0)
    assert new.receive(batch("n1", 1)) is Receipt.NEW


@pytest.mark.parametrize("left", ["unsent results", "an unfinished batch"])
def test_another_devices_ledger_with_unreported_work_is_refused(tmp_path: Path, left: str) -> None:
    """Its results would go out under the new device's token, be refused by the server
    (`unknown_batch`) and never reach the device they belong to."""
    path = tmp_path / "data" / "ledger.sqlite3"
    old = Ledger(path, "dev_old")
    old.receive(batch("b1", 1))
    if left == "unsent results":
        old.finish_batch("b1", 1, [ok("c1"), ok("c2")])
    old.close()
    with pytest.raises(LedgerOwned) as refused:
        Ledger(path, "dev_new")
    message = str(refused.value)
    assert "\n" not in message
    assert "device dev_old" in message and "device dev_new" in message and "--data-dir" in message
    assert str(path.parent) in message
    again = Ledger(path, "dev_old")  # the owner still opens it, and its work is all there
    assert again.rebound_from is None
    assert [e.batch_id for e in again.outbox()] == (["b1"] if left == "unsent results" else [])


def test_the_last_server_and_its_mark_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    ledger.welcomed("srv-a")
    ledger.receive(batch("b7", 7))
    ledger.close()
    reopened = Ledger(path, DEVICE)
    assert (reopened.server_id, reopened.max_fence) == ("srv-a", 7)
    assert reopened.receive(batch("b6", 6)) is Receipt.STALE


def test_a_server_that_names_no_store_is_the_empty_server_id(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ledger.receive(batch("b4", 4))
    ledger.welcomed(None)
    assert (ledger.server_id, ledger.max_fence) == ("", 4)


def test_batch_ids_are_deduplicated_across_servers(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ledger.welcomed("srv-a")
    ledger.receive(batch("b1", 3, n=1))
    ledger.finish_batch("b1", 3, [ok("c1")])
    ledger.welcomed("srv-b")
    assert ledger.receive(batch("b1", 3, n=1)) is Receipt.DONE


def test_after_a_crash_the_running_command_is_uncertain_and_the_rest_skipped(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    ledger.receive(batch("b1", 1, n=3))
    ledger.start_call("b1", "c1")
    ledger.finish_call("b1", ok("c1"))
    ledger.start_call("b1", "c2")
    ledger.close()  # the process dies here
    reopened = Ledger(path, DEVICE)
    assert reopened.recover() == ["b1"]
    statuses = [r.status for r in reopened.results("b1") or []]
    assert statuses == ["success", "uncertain", "skipped"]
    assert [e.batch_id for e in reopened.outbox()] == ["b1"]


def test_after_a_restart_unstarted_batches_past_their_deadline_are_closed_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    now = time.time()
    ledger.receive(batch("late", 1, deadline=now + 60))
    ledger.receive(batch("due-later", 2, deadline=now + 3600))
    ledger.receive(batch("no-deadline", 3))
    ledger.close()  # the agent stops before starting any of them
    reopened = Ledger(path, DEVICE)
    assert reopened.recover(now=now + 61) == ["late"]
    results = reopened.results("late") or []
    assert [(r.status, r.error.code if r.error else None) for r in results] == [("skipped", "timeout")] * 2
    assert results[0].error is not None and "deadline" in results[0].error.message
    assert [e.batch_id for e in reopened.outbox()] == ["late"]  # the server will hear of it
    assert [b.batch_id for b in reopened.pending_batches()] == ["due-later", "no-deadline"]


def test_an_unstarted_batch_without_a_deadline_is_closed_after_a_day(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ledger.receive(batch("old", 1))
    assert ledger.recover(now=time.time() + 23 * 3600) == []
    assert ledger.recover(now=time.time() + 24 * 3600 + 1) == ["old"]
    assert {r.error.code for r in ledger.results("old") or [] if r.error} == {"timeout"}
    assert [e.batch_id for e in ledger.outbox()] == ["old"]


def test_closed_unstarted_batches_are_pruned_like_any_finished_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_module, "KEEP_FINISHED_BATCHES", 1)
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    now = time.time()
    ledger.receive(batch("first", 1, deadline=now - 2))
    ledger.recover(now=now)
    ledger.receive(batch("second", 2, deadline=now - 1))
    ledger.recover(now=now + 1)
    assert ledger.results("first") is None
    assert ledger.results("second") is not None


def test_results_stay_in_the_outbox_until_acknowledged_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    ledger.receive(batch("b1", 1, n=1))
    ledger.finish_batch("b1", 1, [ok("c1")])
    ledger.close()
    reopened = Ledger(path, DEVICE)
    assert [e.batch_id for e in reopened.outbox()] == ["b1"]
    reopened.acknowledged("b1")
    assert reopened.outbox() == []
    assert reopened.results("b1") is not None  # still answers a redelivery


def test_a_result_batch_too_big_for_a_frame_is_truncated_with_a_marker_not_dropped() -> None:
    from device_agent.agent import fit_to_frame
    from protocol.codec import encode
    from protocol.messages import ResultBatch

    b = batch("b1", 1, n=2)
    results = [Result(call_id="c1", status="success", result="x" * 50_000, namespace="shell"), ok("c2")]
    fitted, payload = fit_to_frame(results, b, limit=10_000)
    assert payload == results_json(fitted)
    assert len(encode(ResultBatch(batch_id="b1", fence=1, results=fitted))) <= 10_000
    assert fitted[0].result["truncated"] is True and fitted[0].result["original_bytes"] > 50_000
    assert fitted[1] == results[1]
    assert [r.call_id for r in fitted] == ["c1", "c2"]


def test_results_that_fit_are_kept_as_they_are_whether_they_fit_by_one_byte_or_miss_by_one() -> None:
    """`fit_to_frame` measures the frame as envelope plus the ledger's results JSON, without encoding
    the frame: that sum is the frame's exact size, so the limit is applied exactly as before."""
    from device_agent.agent import fit_to_frame
    from protocol.codec import encode
    from protocol.messages import ResultBatch

    b = batch("b1", 1, n=2)
    results = [Result(call_id="c1", status="success", result="é" * 300, namespace="shell"), ok("c2")]
    size = len(encode(ResultBatch(batch_id="b1", fence=1, results=results)).encode())
    exact = math.ceil(size / 0.9)  # the budget is 90 % of the limit
    while int(exact * 0.9) < size:
        exact += 1
    kept, payload = fit_to_frame(results, b, limit=exact)
    assert kept == results and payload == results_json(results)
    cut, _ = fit_to_frame(results, b, limit=exact - 2)
    assert cut[0].result["truncated"] is True


def test_an_acknowledgement_that_rides_on_a_batch_leaves_the_outbox_in_the_receipt(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite3", DEVICE)
    ledger.receive(batch("b1", 1))
    ledger.finish_batch("b1", 1, [ok("c1"), ok("c2")])
    ledger.receive(batch("b2", 1))
    ledger.finish_batch("b2", 1, [ok("c1"), ok("c2")])
    assert ledger.receive(batch("b3", 1), acknowledged=["b1"]) is Receipt.NEW
    assert [e.batch_id for e in ledger.outbox()] == ["b2"]
    assert ledger.receive(batch("b3", 1), acknowledged=["b2"]) is Receipt.PENDING  # a redelivery acks too
    assert ledger.outbox() == []
    ledger.receive(batch("b4", 1))
    ledger.finish_batch("b4", 1, [ok("c1"), ok("c2")])
    ledger.acknowledged("b4", "b3")  # several at once, one of them never in the outbox
    assert ledger.outbox() == []
    assert ledger.results("b1") is not None  # still answers a redelivery


def test_a_new_ledger_and_the_files_sqlite_makes_for_it_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    """Issue 14 item 9: SQLite creates the database 0644 less the umask, and its -wal and -shm with
    the database's mode; the ledger is created 0600 first, so all of them are born 0600."""
    previous = os.umask(0)
    try:
        ledger = Ledger(tmp_path / "new" / "ledger.sqlite3", DEVICE)
        ledger.receive(batch("b1", 1))
    finally:
        os.umask(previous)
    made = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "new").iterdir()}
    assert made == {"ledger.sqlite3": 0o600, "ledger.sqlite3-wal": 0o600, "ledger.sqlite3-shm": 0o600}
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    ledger.close()


def test_checkpoints_run_off_the_agents_loop_and_stop_with_the_ledger(tmp_path: Path) -> None:
    """A batch's commits never checkpoint (the fsyncs would stall the agent's loop); a thread of
    the ledger copies them into the database file, and closing the ledger stops it."""
    before = set(threading.enumerate())
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    (checkpointer,) = [t for t in threading.enumerate() if t not in before and t.name == "orrery-sqlite-checkpoint"]
    assert ledger.receive(batch("b1", 1)) is Receipt.NEW

    def in_database_file() -> bool:  # immutable=1 reads the database file alone, not the WAL
        with contextlib.closing(sqlite3.connect(f"file:{tmp_path / 'l.db'}?immutable=1", uri=True)) as db:
            try:
                return bool(db.execute("SELECT count(*) FROM batches WHERE batch_id = 'b1'").fetchone()[0] == 1)
            except sqlite3.OperationalError:  # not even the schema has been copied yet
                return False

    wait_until(in_database_file, 30, "the received batch to reach the database file")
    ledger.close()
    assert not checkpointer.is_alive()


def test_an_acknowledged_entry_leaves_the_outbox_with_the_next_results_and_comes_back_after_a_crash(
    tmp_path: Path,
) -> None:
    """An acknowledgement riding on a batch costs the receipt nothing: the entry is deleted in the
    batch's own `finish_batch`. Until then the outbox leaves it out; a crash before then sends it
    again (the server de-duplicates), never loses an unacknowledged one."""
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    ledger.receive(batch("b1", 1, n=1))
    ledger.finish_batch("b1", 1, [ok("c1")])
    ledger.receive(batch("b2", 2, n=1), acknowledged=["b1"])
    assert ledger.outbox() == []

    def stored() -> list[str]:
        with contextlib.closing(sqlite3.connect(path)) as db:
            return [r[0] for r in db.execute("SELECT batch_id FROM outbox ORDER BY batch_id")]

    assert stored() == ["b1"]  # still on disk: the receipt wrote one row, the batch's
    crashed = Ledger(path, DEVICE)  # what a restart after a crash here would read
    assert [e.batch_id for e in crashed.outbox()] == ["b1"]
    ledger.finish_batch("b2", 2, [ok("c1")])
    assert stored() == ["b2"]
    assert [e.batch_id for e in ledger.outbox()] == ["b2"]
    ledger.receive(batch("b3", 3, n=1), acknowledged=["b2"])
    ledger.close()  # a clean stop lets go of what was acknowledged
    assert stored() == []


def test_a_command_started_and_one_done_are_told_apart_after_a_crash(tmp_path: Path) -> None:
    """The running command is named on the batch's row; once done, its own row holds the result,
    so a crash between two commands reports the first as it ended and runs nothing again."""
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    ledger.receive(batch("b1", 1, n=2))
    ledger.start_call("b1", "c1")
    ledger.finish_call("b1", ok("c1"))
    ledger.close()  # the process dies before c2 starts
    reopened = Ledger(path, DEVICE)
    assert reopened.recover() == ["b1"]
    assert [r.status for r in reopened.results("b1") or []] == ["success", "skipped"]


def test_a_ledger_written_by_an_older_agent_is_recovered_the_same(tmp_path: Path) -> None:
    """Ledgers from before `running_call`: rowid tables, and the running command marked by a
    'started' row in `calls`. Opening one adds the column; its interrupted batch ends as before."""
    path = tmp_path / "l.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.executescript(
            """
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE fences (server_id TEXT NOT NULL, device_id TEXT NOT NULL, max_fence INTEGER NOT NULL,
                                 PRIMARY KEY (server_id, device_id));
            CREATE TABLE batches (batch_id TEXT PRIMARY KEY, fence INTEGER NOT NULL, frame TEXT NOT NULL,
                                  state TEXT NOT NULL, received_at REAL NOT NULL, finished_at REAL, results TEXT);
            CREATE TABLE calls (batch_id TEXT NOT NULL, call_id TEXT NOT NULL, state TEXT NOT NULL, result TEXT,
                                PRIMARY KEY (batch_id, call_id));
            CREATE TABLE outbox (batch_id TEXT PRIMARY KEY, fence INTEGER NOT NULL, results TEXT NOT NULL,
                                 created_at REAL NOT NULL);
            """
        )
        db.execute("INSERT INTO meta VALUES ('device_id', ?)", (DEVICE,))
        db.execute(
            "INSERT INTO batches (batch_id, fence, frame, state, received_at) VALUES ('b1', 1, ?, 'running', 1.0)",
            (batch("b1", 1, n=3).model_dump_json(),),
        )
        db.execute("INSERT INTO calls VALUES ('b1', 'c1', 'done', ?)", (ok("c1").model_dump_json(),))
        db.execute("INSERT INTO calls VALUES ('b1', 'c2', 'started', NULL)")
    ledger = Ledger(path, DEVICE)
    assert ledger.recover() == ["b1"]
    assert [r.status for r in ledger.results("b1") or []] == ["success", "uncertain", "skipped"]
    ledger.receive(batch("b2", 2, n=1))  # and it goes on working in its old tables
    ledger.start_call("b2", "c1")
    ledger.finish_batch("b2", 2, [ok("c1")])
    assert [e.batch_id for e in ledger.outbox()] == ["b1", "b2"]


def _approval(batch_id: str, call_id: str) -> Approval:
    return Approval(f"a-{call_id}", batch_id, call_id, "shell.run", {}, "needs a person", False, time.time())


def test_a_batch_waiting_for_an_approval_is_not_closed_by_recovery_until_its_command_runs(tmp_path: Path) -> None:
    """A batch stopped at an approval has nothing running: a restart leaves it to go on when it is
    delivered again. Once the approved command started, a crash makes that command `uncertain`."""
    path = tmp_path / "l.db"
    ledger = Ledger(path, DEVICE)
    ledger.receive(batch("b1", 1, n=3))
    ledger.start_call("b1", "c1")
    ledger.finish_call("b1", ok("c1"))
    ledger.ask_approval(_approval("b1", "c2"))
    ledger.close()
    waiting = Ledger(path, DEVICE)
    assert waiting.recover() == []
    assert waiting.done_calls("b1").keys() == {"c1"}
    waiting.start_call("b1", "c2")  # approved, and running when the agent dies
    waiting.close()
    crashed = Ledger(path, DEVICE)
    assert crashed.recover() == ["b1"]
    assert [r.status for r in crashed.results("b1") or []] == ["success", "uncertain", "skipped"]
