"""The checks the router makes around every command that passed its own: the kill
switch flipped at run time, the safety budgets, and the audit line written before the call.

Order before a call: budgets (a tripped budget refuses actions), then the audit intent line (a
call whose line cannot be written is refused `audit_unavailable` and never runs: nothing runs
unaudited), then the call. After it: the outcome line, and the outcome counted by the budgets.
"""

from __future__ import annotations

import logging
from typing import Any

from device_agent.audit import AuditLog
from device_agent.budgets import SafetyBudgets
from device_agent.killswitch import KillSwitch
from protocol.messages import Result, ToolSpec

log = logging.getLogger("orrery.agent.guards")


class Guards:
    def __init__(
        self, audit: AuditLog, kill_switch: KillSwitch | None = None, budgets: SafetyBudgets | None = None
    ) -> None:
        self.audit = audit
        self.kill_switch = kill_switch or KillSwitch(None)
        self.budgets = budgets or SafetyBudgets()

    def kill_switch_on(self) -> bool:
        return self.kill_switch.is_on()

    def before(self, fields: dict[str, Any], spec: ToolSpec) -> tuple[str, str] | None:
        """(code, message) refusing the call, or None once its intent line is written."""
        ann = spec.annotations
        breach = self.budgets.refusal(ann.read_only, ann.destructive)
        if breach is not None:
            return "budget_exceeded", breach.refusal(spec.name)
        try:
            self.audit.record(**fields, decision="allowed", phase="intent")
        except OSError as exc:
            log.error("audit log %s cannot be written (%s): refusing %s", self.audit.path, exc, spec.name)
            return "audit_unavailable", (
                f"'{spec.name}' was refused and did not run: this device's audit log ({self.audit.path}) "
                f"cannot be written ({exc.strerror or exc}), and nothing runs on the device unaudited. "
                "The device owner must fix it (free disk space, the file's permissions or attributes); "
                "retry the command after that"
            )
        self.budgets.start(ann.destructive)
        return None

    def after(self, fields: dict[str, Any], decision: str, result: Result) -> None:
        """The outcome line (raises OSError if a call that ran cannot be recorded), then the count."""
        code = result.error.code if result.error else None
        self.budgets.outcome(result.status, code)
        if code == "audit_unavailable":
            return  # its intent line just failed; the refusal is in the ledger and the result
        try:
            self.audit.record(
                **fields,
                decision=decision,
                phase="outcome",
                status=result.status,
                error_code=code,
                duration_ms=result.duration_ms,
            )
        except OSError as exc:
            if decision == "allowed":
                raise  # the call ran and cannot be recorded: the agent stops loudly (see agent.run)
            log.error("audit log %s cannot be written (%s); %s was refused anyway", self.audit.path, exc, fields)
