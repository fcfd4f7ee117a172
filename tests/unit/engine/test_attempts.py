"""Results are applied only for the open attempt with that device and fence; a re-send of
recorded results is a duplicate; anything else is refused with the reason (SPEC section 4)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.engine.attempts import Applied, Attempts, Duplicate, Refused, unanswered
from orchestrator.engine.records import AttemptKind
from orchestrator.store.models import Attempt
from protocol.errors import ErrorCode
from protocol.messages import ErrorInfo, Result, ResultBatch
from tests.unit.engine.parts import attempt, device


@dataclass
class Rows:
    """The store's attempt rows, as `find_attempt` reads them."""

    rows: dict[str, Attempt] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)

    async def find_attempt(self, batch_id: str) -> Attempt | None:
        self.lookups.append(batch_id)
        return self.rows.get(batch_id)


def batch(batch_id: str, fence: int, status: str = "success") -> ResultBatch:
    ok = status == "success"
    return ResultBatch(
        batch_id=batch_id,
        fence=fence,
        results=[Result(call_id="c1", status=status, result={"ok": True} if ok else None)],  # type: ignore[arg-type]
    )


async def test_results_for_the_open_attempt_are_applied_with_their_outcome() -> None:
    attempts = Attempts(Rows())
    attempts.add(attempt("b1", "d1", 2))
    verdict = await attempts.accept(device("d1"), batch("b1", 2))
    assert isinstance(verdict, Applied) and verdict.outcome.succeeded and verdict.outcome.output == {"ok": True}
    assert verdict.outcome.commands == (0,) and verdict.attempt.batch_id == "b1"


async def test_a_stale_fence_a_foreign_batch_and_a_duplicate_are_told_apart_without_io() -> None:
    rows = Rows()
    attempts = Attempts(rows)
    att = attempt("b1", "d1", 2)
    attempts.add(att)
    attempts.close(att, with_results=True)
    assert isinstance(await attempts.accept(device("d1"), batch("b1", 2)), Duplicate)
    stale = await attempts.accept(device("d1"), batch("b1", 1))
    assert isinstance(stale, Refused) and stale.code is ErrorCode.STALE_FENCE
    foreign = await attempts.accept(device("d2"), batch("b1", 2))
    assert isinstance(foreign, Refused) and foreign.code is ErrorCode.UNKNOWN_BATCH
    assert rows.lookups == []  # recently closed: answered from memory


async def test_an_attempt_closed_long_ago_is_looked_up_in_the_store() -> None:
    rows = Rows({"old": Attempt(batch_id="old", device_id="d1", fence=3, results=None)})
    attempts = Attempts(rows, closed_kept=1)
    for n in ("b1", "b2"):
        attempts.add(attempt(n, "d1", 4))
        attempts.close(attempts.open[n], with_results=True)
    assert list(attempts.closed) == ["b2"]  # bounded memory
    ended_without_results = await attempts.accept(device("d1"), batch("old", 3))
    assert isinstance(ended_without_results, Refused) and ended_without_results.code is ErrorCode.STALE_FENCE
    unknown = await attempts.accept(device("d1"), batch("never", 1))
    assert isinstance(unknown, Refused) and unknown.code is ErrorCode.UNKNOWN_BATCH
    assert rows.lookups == ["old", "never"]


async def test_a_batch_the_device_turned_away_unrun_fails_with_its_reason_and_never_started() -> None:
    attempts = Attempts(Rows())
    attempts.add(attempt("b1", "d1", 2))
    refused = ResultBatch(
        batch_id="b1",
        fence=2,
        results=[Result(call_id="c1", status="skipped", error=ErrorInfo(code="stale_fence", message="old"))],
    )
    verdict = await attempts.accept(device("d1"), refused)
    assert isinstance(verdict, Applied)
    assert (verdict.outcome.succeeded, verdict.outcome.started, verdict.outcome.error_code) == (
        False,
        False,
        "stale_fence",
    )


def test_an_unanswered_attempt_may_have_started_only_if_it_was_sent() -> None:
    att = attempt("b1", "d1", 2)
    assert att.kind is AttemptKind.TOOL
    lost = unanswered(att, device("d1"), ErrorCode.DEVICE_LOST, "gone")
    assert (lost.started, lost.tools, lost.commands) == (False, ("sim.act",), (0,))
    att.sent = True
    assert unanswered(att, device("d1"), ErrorCode.TIMEOUT, "late").started
