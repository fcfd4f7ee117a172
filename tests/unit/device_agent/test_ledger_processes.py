"""The ledger's records of the process groups running commands started, kept so that the next
agent can kill what a dead one left running (device_agent/orphans.py)."""

from __future__ import annotations

from pathlib import Path

from device_agent.ledger import Ledger, ProcessRecord
from protocol.messages import Command, CommandBatch, Result

DEVICE = "dev_1"


def batch(batch_id: str) -> CommandBatch:
    return CommandBatch(
        batch_id=batch_id,
        task_id="t",
        node_id="n",
        attempt=1,
        fence=1,
        commands=[Command(call_id="c1", tool="shell.run")],
    )


def test_a_recorded_process_group_is_kept_until_the_batch_after_its_reaping_finishes(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    one = ProcessRecord(4242, 17, "boot", "b1", "c1")
    two = ProcessRecord(4343, 18, "boot", "b1", "c2")
    ledger.record_process(one)
    ledger.record_process(two)
    ledger.close()
    ledger = Ledger(tmp_path / "l.db", DEVICE)  # durable: a restart finds them
    assert sorted(ledger.processes(), key=lambda r: r.pgid) == [one, two]
    ledger.process_reaped(4242, 17)
    assert len(ledger.processes()) == 2  # no write of its own: it goes with the batch's results
    ledger.receive(batch("b1"))
    ledger.finish_batch("b1", 1, [Result(call_id="c1", status="success", namespace="shell")])
    assert ledger.processes() == [two]
    ledger.clear_processes()
    assert ledger.processes() == []


def test_the_ledger_keeps_its_identity_for_life(tmp_path: Path) -> None:
    first = Ledger(tmp_path / "l.db", DEVICE).identity
    assert len(first) == 16
    assert Ledger(tmp_path / "l.db", DEVICE).identity == first
    assert Ledger(tmp_path / "other.db", DEVICE).identity != first


def test_the_uncertain_result_says_what_became_of_the_processes_its_command_left(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    ledger.receive(batch("b1"))
    ledger.start_call("b1", "c1")
    ledger.close()
    ledger = Ledger(tmp_path / "l.db", DEVICE)
    assert ledger.recover(notes={("b1", "c1"): "pid 7 (sleep) could not be killed"}) == ["b1"]
    (result,) = ledger.results("b1") or []
    assert result.status == "uncertain" and result.error is not None
    assert result.error.message.endswith("(pid 7 (sleep) could not be killed)")
