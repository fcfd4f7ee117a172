"""People in the loop on the device: a command that needs approval waits for one.

A command whose tool matches the agent's `approval_required` (and is not run `--unattended`), or
the `approval.request` tool itself, is not refused: before anything of it runs, the agent records
an approval in its ledger, sends `approval_request`, and waits.

The ledger is the approval's one arbiter: the first decision recorded there holds. Decisions
reach it from the device's owner (`orrery agent approve ID`, which writes it there; the waiting
command looks every `LOCAL_POLL_S`) and as requests from the orchestrator (`approval_decision`:
an operator's decision, the expiry, or `cancelled` when the attempt ended), and a cancel of the
batch decides `cancelled` at once. Whatever holds is reported to the orchestrator and reported
again on every new session until the server acknowledges it; only then is it recorded there. So
the orchestrator never records a decision the device did not take, and a command never runs
without an `approved` decision recorded here.

Durability: the approval is in the ledger before the request goes out, so an agent restart asks
again with the same id. With `approvals_local_only`, the orchestrator's requests to approve or
deny are not taken: only the owner at the device approves (the expiry and a cancel still end it).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from device_agent.ledger import Approval, Ledger
from protocol.errors import ErrorCode
from protocol.messages import ApprovalDecision, ApprovalRequest, Command, CommandBatch, ErrorInfo, Message, Result

log = logging.getLogger("orrery.agent")

LOCAL_POLL_S = 0.5  # how often a waiting command looks for a decision given at the device
MAX_SCREENSHOT_BYTES = 1_500_000  # a larger screenshot is left out of the request (frame limit)
REQUEST_TOOL = "approval.request"
# A model's question to a person: it waits like an approval; approved, the person's words are its answer.
ASK_TOOL = "approval.ask_person"
_OBSERVATION_ID = re.compile(r"[0-9a-f]{8,64}")


class Approvals:
    def __init__(
        self,
        ledger: Ledger,
        send: Callable[[Message], Awaitable[None]],
        screenshots: Path | None,
        local_only: bool,
    ) -> None:
        self.ledger = ledger
        self.send = send
        self.screenshots = screenshots
        self.local_only = local_only
        self._woken: dict[str, asyncio.Event] = {}
        self._waiting_batches: dict[str, str] = {}  # batch id -> the approval its command waits for
        self.in_flight: set[str] = set()  # decisions reported on this session, not acknowledged yet

    async def obtain(self, batch: CommandBatch, cmd: Command, cancelled: Callable[[], bool]) -> Approval:
        """Wait until the command's approval is decided (recording and requesting it first), and
        report the decision that holds."""
        rec = self.ledger.approval_for(batch.batch_id, cmd.call_id)
        if rec is None:
            rec = Approval(
                approval_id="apr_" + secrets.token_hex(10),
                batch_id=batch.batch_id,
                call_id=cmd.call_id,
                tool=cmd.tool,
                arguments=dict(cmd.arguments),
                reason=_reason(cmd),
                local_only=self.local_only,
                created_at=time.time(),
            )
            self.ledger.ask_approval(rec)
            log.info("approval %s asked for %s (batch %s)", rec.approval_id, cmd.tool, batch.batch_id)
        if rec.state == "pending":
            await self.send(self.request(rec))
        woken = self._woken.setdefault(rec.approval_id, asyncio.Event())
        self._waiting_batches[batch.batch_id] = rec.approval_id
        try:
            while rec.state == "pending":
                if cancelled():
                    self.ledger.decide(rec.approval_id, "cancelled", "orchestrator", "the batch was cancelled")
                else:
                    woken.clear()
                    try:
                        await asyncio.wait_for(woken.wait(), LOCAL_POLL_S)
                    except TimeoutError:
                        pass
                rec = self.ledger.approval(rec.approval_id) or rec
        finally:
            self._woken.pop(rec.approval_id, None)
            self._waiting_batches.pop(batch.batch_id, None)
        await self._report(rec, batch)
        log.info("approval %s %s by %s", rec.approval_id, rec.state, rec.decided_by or "?")
        return rec

    def wake(self, batch_id: str) -> None:
        """The batch was cancelled (or stopped): a command waiting for approval stops waiting now."""
        approval_id = self._waiting_batches.get(batch_id)
        woken = self._woken.get(approval_id or "")
        if woken is not None:
            woken.set()

    async def on_decision(self, msg: ApprovalDecision) -> None:
        """A decision the orchestrator asks of this device. The ledger takes it if nothing was
        decided first; either way the decision that holds is reported back (the orchestrator
        asks until it hears it)."""
        rec = self.ledger.approval(msg.approval_id)
        if rec is None:
            # Not an approval of this device's (or one pruned long after it was reported): the
            # orchestrator asks for `cancelled` of a request it did not keep; confirm that.
            if msg.decision == "cancelled":
                await self.send(
                    ApprovalDecision(approval_id=msg.approval_id, decision="cancelled", by=msg.by, reason=msg.reason)
                )
            return
        if rec.state == "pending":
            if rec.local_only and msg.decision in ("approved", "denied"):
                log.warning(
                    "ignored the orchestrator's decision '%s' on approval %s: this device takes approvals only "
                    "from its owner (orrery agent approve %s)",
                    msg.decision,
                    msg.approval_id,
                    msg.approval_id,
                )
                return
            self.ledger.decide(msg.approval_id, msg.decision, msg.by or "orchestrator", msg.reason)
            woken = self._woken.get(msg.approval_id)
            if woken is not None:
                woken.set()
                return  # the waiting command reports it, with the deadline it moved
            rec = self.ledger.approval(msg.approval_id) or rec
        await self._report(rec, None, again=True)

    async def _report(self, rec: Approval, batch: CommandBatch | None, again: bool = False) -> None:
        """Tell the orchestrator the decision that holds (unless it has it, or it is on its way)."""
        if rec.state == "pending" or (rec.reported and not again) or rec.approval_id in self.in_flight:
            return
        await self.send(self.report(rec, batch))

    def on_connect(self) -> list[Message]:
        """What a new session must carry: every request still pending, every decision the
        server has not acknowledged."""
        self.in_flight.clear()
        out: list[Message] = []
        for rec in self.ledger.approvals():
            if rec.state == "pending":
                out.append(self.request(rec))
            elif not rec.reported:
                out.append(self.report(rec, None))
        return out

    def acknowledged(self, approval_id: str) -> None:
        """The server acknowledged the report of `approval_id`: it is recorded there."""
        self.in_flight.discard(approval_id)
        self.ledger.reported(approval_id)

    def request(self, rec: Approval) -> ApprovalRequest:
        return ApprovalRequest(
            approval_id=rec.approval_id,
            batch_id=rec.batch_id,
            call_id=rec.call_id,
            tool=rec.tool,
            arguments=rec.arguments,
            reason=rec.reason,
            local_only=rec.local_only,
            screenshot_png_b64=self._screenshot(rec),
        )

    def report(self, rec: Approval, batch: CommandBatch | None) -> ApprovalDecision:
        """The decision that holds, with the batch's deadline moved on by the wait (if known)."""
        state = rec.state if rec.state in ("approved", "denied", "expired", "cancelled") else "denied"
        moved = deadline_of(batch, rec) if batch is not None else None
        self.in_flight.add(rec.approval_id)
        return ApprovalDecision(
            approval_id=rec.approval_id,
            decision=state,
            reason=(rec.decision_reason or "")[:2000],
            by=(rec.decided_by or "device")[:200],
            deadline=moved,
        )

    def _screenshot(self, rec: Approval) -> str | None:
        """The screenshot a GUI action was planned on: the observation its arguments name."""
        oid = rec.arguments.get("observation_id")
        if self.screenshots is None or not isinstance(oid, str) or not _OBSERVATION_ID.fullmatch(oid):
            return None
        path = self.screenshots / f"screen-{oid}.png"
        try:
            if path.stat().st_size > MAX_SCREENSHOT_BYTES:
                return None
            return base64.b64encode(path.read_bytes()).decode()
        except OSError:
            return None


def _reason(cmd: Command) -> str:
    if cmd.tool == REQUEST_TOOL:
        return str(cmd.arguments.get("reason", ""))[:2000]
    if cmd.tool == ASK_TOOL:
        return str(cmd.arguments.get("question", ""))[:2000]
    return f"{cmd.tool} is on this device's approval_required list"


def deadline_of(batch: CommandBatch, rec: Approval | None) -> datetime | None:
    """The batch's deadline, moved on by the time a command waited for its approval: a decision,
    wherever it was made, gives the command its whole timeout (the server moves its own deadline
    by its own measure of the wait, and takes the later of the two)."""
    if batch.deadline is None or rec is None:
        return batch.deadline
    moved = batch.deadline + timedelta(seconds=rec.waited_s)
    if rec.deadline is not None:  # moved by an older orchestrator
        moved = max(moved, datetime.fromtimestamp(rec.deadline, UTC))
    return moved


def answered(cmd: Command, rec: Approval) -> Result:
    """The result of a model's question to a person (`ASK_TOOL`) once someone answered it: their
    words (the decision's reason: a reply, or the note they handed the device back with)."""
    return Result(
        call_id=cmd.call_id,
        status="success",
        result={"answer": rec.decision_reason or "", "by": rec.decided_by or "a person"},
        namespace=cmd.tool.split(".", 1)[0],
    )


def refused(cmd: Command, rec: Approval) -> Result | None:
    """The result of a command whose approval was not given (None if it was approved). The
    command never ran; the result is a `failure`, so the node is not placed again for it."""
    if rec.state == "approved":
        return None
    why = f": {rec.decision_reason}" if rec.decision_reason else ""
    if rec.state == "expired":
        code, message = (
            ErrorCode.APPROVAL_TIMEOUT,
            f"not run: nobody approved {cmd.tool} (approval {rec.approval_id}) within the orchestrator's "
            "approval_timeout_s; submit it again when someone can decide",
        )
    elif rec.state == "cancelled":
        code, message = ErrorCode.CANCELLED, f"not run: the batch was cancelled while {cmd.tool} waited for approval"
    else:
        code, message = (
            ErrorCode.APPROVAL_DENIED,
            f"not run: {rec.decided_by or 'a person'} denied {cmd.tool} (approval {rec.approval_id}){why}; "
            "do not do this step; choose another way or ask what is wanted",
        )
    return Result(
        call_id=cmd.call_id,
        status="failure",
        error=ErrorInfo(code=code, message=message),
        namespace=cmd.tool.split(".", 1)[0],
    )
