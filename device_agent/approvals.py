"""People in the loop on the device (issue 18): a command that needs approval waits for one.

A command whose tool matches the agent's `approval_required` (and is not run `--unattended`), or
the `approval.request` tool itself, is not refused: before anything of it runs, the agent records
an approval in its ledger, sends `approval_request`, and waits. The decision comes from the
orchestrator (`approval_decision`, from `POST /v1/approvals/{id}/approve|deny` or the expiry of
`approval_timeout_s`), or from the device's owner at the device (`orrery agent approve ID`, which
writes the decision into the ledger; the agent looks every `LOCAL_POLL_S` and tells the server).

Durability: the approval is in the ledger before the request goes out, so an agent restart asks
again with the same id and the server answers with the decision it may already have given; an
orchestrator restart keeps its own row. Nothing runs without an `approved` decision recorded in
the ledger. With `approvals_local_only`, decisions from the orchestrator other than expiry or a
cancel are ignored: only the owner at the device approves.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from device_agent.ledger import Approval, Ledger
from protocol.errors import ErrorCode
from protocol.messages import ApprovalDecision, ApprovalRequest, Command, CommandBatch, ErrorInfo, Message, Result

log = logging.getLogger("orrery.agent")

LOCAL_POLL_S = 0.5  # how often a waiting command looks for a decision given at the device
MAX_SCREENSHOT_BYTES = 1_500_000  # a larger screenshot is left out of the request (frame limit)
REQUEST_TOOL = "approval.request"
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

    async def obtain(self, batch: CommandBatch, cmd: Command, cancelled: Callable[[], bool]) -> Approval:
        """Wait until the command's approval is decided (recording and requesting it first)."""
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
        if not rec.reported:
            await self.send(self.report(rec))
            self.ledger.reported(rec.approval_id)
        log.info("approval %s %s by %s", rec.approval_id, rec.state, rec.decided_by or "?")
        return rec

    def on_decision(self, msg: ApprovalDecision) -> None:
        """The orchestrator's decision (or its answer to a request it had decided already)."""
        rec = self.ledger.approval(msg.approval_id)
        if rec is None or rec.state != "pending":
            return
        if rec.local_only and msg.decision in ("approved", "denied"):
            log.warning(
                "ignored the orchestrator's decision '%s' on approval %s: this device takes approvals only "
                "from its owner (orrery agent approve %s)",
                msg.decision,
                msg.approval_id,
                msg.approval_id,
            )
            return
        deadline = msg.deadline.timestamp() if msg.deadline else None
        self.ledger.decide(msg.approval_id, msg.decision, msg.by or "orchestrator", msg.reason, deadline)
        woken = self._woken.get(msg.approval_id)
        if woken is not None:
            woken.set()

    def on_connect(self) -> list[Message]:
        """What a new session must carry: every request still pending, every decision given at
        the device that the server has not heard of."""
        out: list[Message] = []
        for rec in self.ledger.approvals():
            if rec.state == "pending":
                out.append(self.request(rec))
            elif not rec.reported:
                out.append(self.report(rec))
        return out

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

    @staticmethod
    def report(rec: Approval) -> ApprovalDecision:
        state = rec.state if rec.state in ("approved", "denied", "expired", "cancelled") else "denied"
        return ApprovalDecision(
            approval_id=rec.approval_id,
            decision=state,
            reason=rec.decision_reason or "",
            by=rec.decided_by or "device",
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
    return f"{cmd.tool} is on this device's approval_required list"


def deadline_of(batch: CommandBatch, rec: Approval | None) -> datetime | None:
    """The batch's deadline, moved on by an approval's wait if one was decided."""
    if rec is not None and rec.deadline is not None:
        moved = datetime.fromtimestamp(rec.deadline, UTC)
        if batch.deadline is None or moved > batch.deadline:
            return moved
    return batch.deadline


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
