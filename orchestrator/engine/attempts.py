"""Open attempts, their fences, and the recently closed ones: whether a device's results are
applied (the batch is open on that device with that fence), acknowledged as a duplicate, or
refused (SPEC section 4: fencing, de-duplication), and the AttemptOutcome they amount to."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.domain.run import AttemptOutcome
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceRun
from orchestrator.engine.times import utc
from orchestrator.ids import new_id
from orchestrator.store.models import Attempt
from protocol.errors import ErrorCode, bounded_result_error
from protocol.messages import ErrorInfo, Result, ResultBatch

CLOSED_KEPT = 10_000  # closed attempts remembered for de-duplication without a store lookup


class AttemptLookup(Protocol):
    async def find_attempt(self, batch_id: str) -> Attempt | None: ...


@dataclass(frozen=True)
class Applied:
    """Results for the open attempt `attempt`: end it with `outcome`."""

    attempt: AttemptRun
    outcome: AttemptOutcome
    results: list[Result]


@dataclass(frozen=True)
class Duplicate:
    """A re-send of results already recorded: the ack it gets is all it needs."""


@dataclass(frozen=True)
class Refused:
    """Results for a batch that is not open on this device with this fence (an error frame)."""

    code: ErrorCode
    message: str


Acceptance = Applied | Duplicate | Refused


class Attempts:
    def __init__(
        self, store: AttemptLookup, closed_kept: int = CLOSED_KEPT, ids: Callable[[str], str] = new_id
    ) -> None:
        self.store = store
        self.ids = ids  # batch ids (a simulation makes them from its seed)
        self.open: dict[str, AttemptRun] = {}  # by batch id
        # Recently closed: batch -> (device, fence, ended with device results): dedup without I/O.
        self.closed: OrderedDict[str, tuple[str, int, bool]] = OrderedDict()
        self.closed_kept = closed_kept

    def new_batch_id(self) -> str:
        return self.ids("b")

    def get(self, batch_id: str | None) -> AttemptRun | None:
        return self.open.get(batch_id or "")

    def add(self, att: AttemptRun) -> None:
        self.open[att.batch_id] = att

    def on_device(self, device_id: str) -> list[AttemptRun]:
        return [a for a in self.open.values() if a.device_id == device_id]

    def of_task(self, task_id: str) -> list[AttemptRun]:
        return [a for a in self.open.values() if a.task_id == task_id]

    def drop(self, att: AttemptRun) -> None:
        """Forget an open attempt without remembering it as closed (an agent's step batch)."""
        self.open.pop(att.batch_id, None)

    def close(self, att: AttemptRun, with_results: bool) -> None:
        self.open.pop(att.batch_id, None)
        self.closed[att.batch_id] = (att.device_id, att.fence, with_results)
        if len(self.closed) > self.closed_kept:
            self.closed.popitem(last=False)

    # ---------------------------------------------------------------- results

    async def accept(self, dev: DeviceRun, msg: ResultBatch) -> Acceptance:
        att = self.open.get(msg.batch_id)
        if att is not None and att.device_id == dev.id and att.fence == msg.fence:
            results = [bounded(r) for r in msg.results]
            return Applied(att, outcome(att, dev, results), results)
        closed = self.closed.get(msg.batch_id)
        if closed is None:
            row = await self.store.find_attempt(msg.batch_id)
            closed = (row.device_id, row.fence, row.results is not None) if row is not None else None
        if closed == (dev.id, msg.fence, True):
            return Duplicate()
        if closed is None or closed[0] != dev.id:
            return Refused(ErrorCode.UNKNOWN_BATCH, f"batch {msg.batch_id} was not sent to this device")
        return Refused(
            ErrorCode.STALE_FENCE,
            f"batch {msg.batch_id} (fence {msg.fence}) is no longer current on this device (fence "
            f"{dev.fence}); its attempt ended without these results and they are discarded",
        )


def attempt_row(att: AttemptRun, now: float, status: str) -> dict[str, Any]:
    """The stored row of a new attempt (or an agent attempt's step batch)."""
    return {
        "batch_id": att.batch_id,
        "parent_batch_id": att.parent,
        "kind": att.kind.value,
        "task_id": att.task_id,
        "node_id": att.node_id,
        "n": att.n,
        "device_id": att.device_id,
        "fence": att.fence,
        "commands": [c.model_dump(mode="json") for c in att.commands],
        "status": status,
        "deadline": utc(att.deadline) if att.deadline else None,
        "started_at": utc(now),
    }


def ended_row(outcome: AttemptOutcome, now: float, results: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The stored values of an attempt that ended with `outcome`."""
    return {
        "status": "succeeded" if outcome.succeeded else "failed",
        "ended_at": utc(now),
        "results": results,
        "error": None if outcome.succeeded else {"code": outcome.error_code, "message": outcome.error_message},
    }


def unanswered(att: AttemptRun, dev: DeviceRun | None, code: str, message: str) -> AttemptOutcome:
    """An attempt the device gave no results for (lost, timed out): whether it may run again
    depends on whether it may have started, and on the tools it would have run."""
    hints = tuple(dev.hints(c.tool) for c in att.commands) if dev else ()
    return AttemptOutcome(
        succeeded=False,
        error_code=code,
        error_message=message,
        started=att.sent,
        tool_hints=hints,
        tools=tuple(c.tool for c in att.commands) if dev else (),
        commands=tuple(range(len(hints))) if att.kind is AttemptKind.TOOL else None,
    )


def agent_outcome(
    att: AttemptRun,
    hints: Callable[[str], tuple[bool, bool]] | None,
    succeeded: bool,
    output: Any,
    code: str,
    message: str,
) -> AttemptOutcome:
    """How an agent attempt ended (its loop finished, or the engine stopped it)."""
    return AttemptOutcome(
        succeeded,
        output=output,
        error_code=code,
        error_message=message,
        started=bool(att.tools_used),
        tool_hints=tuple(hints(t) for t in att.tools_used) if hints else (),
        tools=tuple(att.tools_used) if hints else (),
        cancelled=att.cancel_reason == "cancelled",
    )


def outcome(att: AttemptRun, dev: DeviceRun, results: list[Result]) -> AttemptOutcome:
    by_call = {r.call_id: r for r in results}
    ordered = [by_call.get(c.call_id) for c in att.commands]
    # The commands that ran (a result not `skipped`): their tools' hints, names and indexes. One
    # plain loop: every attempt's results pass here, and generator expressions cost more.
    hints: list[tuple[bool, bool]] = []
    tools: list[str] = []
    indexes: list[int] = []
    succeeded = True
    for i, (command, r) in enumerate(zip(att.commands, ordered, strict=True)):
        if r is None or r.status != "success":
            succeeded = False
        if r is not None and r.status != "skipped":
            hints.append(dev.hints(command.tool))
            tools.append(command.tool)
            indexes.append(i)
    ran = bool(indexes)
    dumped = [r.model_dump(mode="json") for r in results]
    if succeeded:
        last = ordered[-1]
        return AttemptOutcome(
            True,
            output=last.result if last else None,
            results=dumped,
            tool_hints=tuple(hints),
            tools=tuple(tools),
            commands=tuple(indexes),
        )
    bad = next((r for r in ordered if r is not None and r.status in ("failure", "uncertain")), None)
    refused = next((r for r in ordered if r is not None and r.error is not None), None) if not ran else None
    if bad is None and refused is not None and refused.error is not None and att.cancel_reason is None:
        # Nothing ran: the device turned the batch away (a stale fence, a deadline already
        # past) and says why in the skipped results.
        code, message = refused.error.code, refused.error.message
    elif bad is None:
        code, message = ErrorCode.CANCELLED.value, "the batch was stopped before its commands ran"
        if att.cancel_reason is None:
            code, message = ErrorCode.TOOL_ERROR.value, "the device returned no result for some commands"
    elif bad.status == "uncertain":
        code = ErrorCode.UNCERTAIN.value
        message = bad.error.message if bad.error else "the command may or may not have run"
    else:
        code = bad.error.code if bad.error else ErrorCode.TOOL_ERROR.value
        message = bad.error.message if bad.error else "the command failed"
    if att.cancel_reason == "timeout":
        code, message = ErrorCode.TIMEOUT.value, f"the attempt ran past its timeout_s; {message}"
    return AttemptOutcome(
        False,
        results=dumped,
        error_code=code,
        error_message=message,
        started=ran,
        tool_hints=tuple(hints),
        tools=tuple(tools),
        commands=tuple(indexes),
        cancelled=att.cancel_reason == "cancelled",
    )


def bounded(result: Result) -> Result:
    """The result with its error code one the orchestrator knows (else `device_error`, the
    device's own code quoted in the message): a device's codes become node error codes and
    metric labels, so they must come from a closed set."""
    if result.error is None:
        return result
    code, message = bounded_result_error(result.error.code, result.error.message)
    if (code, message) == (result.error.code, result.error.message):
        return result
    return result.model_copy(update={"error": ErrorInfo(code=code, message=message)})
