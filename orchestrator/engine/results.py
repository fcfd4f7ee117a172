"""Results from devices: applied when the batch is open with that fence, refused otherwise
(SPEC section 4: fencing, de-duplication). A mixin of `Engine`."""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from orchestrator.domain.run import AttemptOutcome
from orchestrator.engine.records import AttemptRun, DeviceRun
from orchestrator.store.repo import Store
from protocol.errors import ErrorCode, bounded_result_error
from protocol.messages import Error, ErrorInfo, Message, Result, ResultBatch

log = logging.getLogger("orrery.engine")


class ResultHandling:
    store: Store
    attempts: dict[str, AttemptRun]
    _closed: OrderedDict[str, tuple[str, int, bool]]

    if TYPE_CHECKING:  # provided by Engine and its other mixins (no runtime stubs: they would shadow them)

        def _set_current(self, dev: DeviceRun, batch_id: str | None) -> None: ...

        def _raise_fence(self, dev: DeviceRun, seen: int) -> None: ...

        def _end_attempt(self, att: AttemptRun, outcome: AttemptOutcome, now: float, results: Any = None) -> None: ...

        def _send(self, device_id: str, message: Message) -> bool: ...

    async def _on_results(self, dev: DeviceRun, msg: ResultBatch, now: float) -> None:
        self._raise_fence(dev, msg.fence_seen)  # a device refusing a batch as stale says why
        att = self.attempts.get(msg.batch_id)
        if att is None or att.device_id != dev.id or att.fence != msg.fence:
            await self._refuse_results(dev, msg)
            return
        results = [bounded(r) for r in msg.results]
        self._end_attempt(att, self._outcome(att, dev, results), now, results)

    async def _refuse_results(self, dev: DeviceRun, msg: ResultBatch) -> None:
        """Results for a batch that is not open on this device with this fence.

        A duplicate of results already recorded is acknowledged silently; anything else gets a
        non-fatal error frame. Either way nothing changes (SPEC section 4: fencing).
        """
        if dev.current_batch == msg.batch_id:
            self._set_current(dev, None)  # the device finished work we had already given up on
        closed = self._closed.get(msg.batch_id)
        if closed is None:
            row = await self.store.find_attempt(msg.batch_id)
            closed = (row.device_id, row.fence, row.results is not None) if row is not None else None
        if closed == (dev.id, msg.fence, True):
            return  # a re-send of results already recorded: the ack it gets is all it needs
        if closed is None or closed[0] != dev.id:
            code, text = ErrorCode.UNKNOWN_BATCH, f"batch {msg.batch_id} was not sent to this device"
        else:
            code = ErrorCode.STALE_FENCE
            text = (
                f"batch {msg.batch_id} (fence {msg.fence}) is no longer current on this device (fence "
                f"{dev.fence}); its attempt ended without these results and they are discarded"
            )
        log.warning("refused results from %s: %s", dev.id, text)
        self._send(dev.id, Error(code=code, message=text))

    def _outcome(self, att: AttemptRun, dev: DeviceRun, results: list[Result]) -> AttemptOutcome:
        by_call = {r.call_id: r for r in results}
        ordered = [by_call.get(c["call_id"]) for c in att.commands]
        ran = [(c, r) for c, r in zip(att.commands, ordered, strict=True) if r and r.status != "skipped"]
        hints = tuple(dev.hints(c["tool"]) for c, _ in ran)
        tools = tuple(str(c["tool"]) for c, _ in ran)
        indexes = tuple(i for i, r in enumerate(ordered) if r and r.status != "skipped")
        dumped = [r.model_dump(mode="json") for r in results]
        if all(r is not None and r.status == "success" for r in ordered):
            last = ordered[-1]
            return AttemptOutcome(
                True,
                output=last.result if last else None,
                results=dumped,
                tool_hints=hints,
                tools=tools,
                commands=indexes,
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
        cancelled = att.cancel_reason == "cancelled"
        return AttemptOutcome(
            False,
            results=dumped,
            error_code=code,
            error_message=message,
            started=bool(ran),
            tool_hints=hints,
            tools=tools,
            commands=indexes,
            cancelled=cancelled,
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
