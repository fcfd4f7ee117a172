"""Verified outcomes: a node's read-only `verify` commands decide whether it succeeded.

- The check: its commands succeeded; before any success edge fires, its verify commands run on
  the same device (at once: the device is still the node's). They pass: it succeeds. They fail:
  it fails `verification_failed` (never retried: its commands ran to the end).
- The probe: its attempt ended with its outcome unknown (`uncertain`, or `device_lost` after it
  may have started: the device died mid-command). Its verify commands run when a capable device
  is back (for a node pinned to a device, that device; otherwise that device or any other that
  can run it). They pass: it succeeds. They fail: its failure is real, and the usual retry rules
  decide (retried only when retry-safe; else it fails `verification_failed`).
- Either way the node is VERIFYING meanwhile, for at most probe_timeout_s of waiting for a device;
  then it ends by its original error (retry rules again). A verify attempt that cannot say (its
  device lost too, or it never started) waits for a device again within the same bound.

What is being decided is kept on the node's row (`verification`) at each change, so a restarted
engine decides it the same way (`restore`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.config import Settings
from orchestrator.domain import fanout, templates
from orchestrator.domain.model import AdminState, Liveness
from orchestrator.domain.run import AttemptOutcome, TaskRun, Transition
from orchestrator.engine.attempts import Attempts, attempt_row
from orchestrator.engine.fanouts import FanOuts
from orchestrator.engine.fleet import Fleet
from orchestrator.engine.outbox import Outbox
from orchestrator.engine.queues import Queues
from orchestrator.engine.records import AttemptKind, AttemptRun, DeviceRun, NodeKey
from orchestrator.engine.timers import AcceptDeadline, AttemptDeadline, ProbeTimeout, Timers
from orchestrator.engine.times import batch_deadline, iso
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store.models import Attempt
from protocol.errors import ErrorCode
from protocol.messages import Command

log = logging.getLogger("orrery.engine")

Apply = Callable[[TaskRun, list[Transition], float], None]
UNKNOWN = frozenset({ErrorCode.UNCERTAIN.value, ErrorCode.DEVICE_LOST.value})  # outcomes a probe decides
FAILED = "verification_failed"


@dataclass
class Pending:
    """A node being verified. `since`: when it began waiting for a device (None while its check
    runs at once); `attempt`: the outcome its attempt ended with (the success to confirm, or the
    unknown outcome and the tools it used, for the retry rules)."""

    key: NodeKey
    device_id: str  # where its attempt ran
    pinned: bool  # its verify commands must run there
    after: str  # "success" | "unknown"
    attempt: AttemptOutcome
    since: float | None = None
    batch: str | None = None  # its verify attempt in flight

    def row(self, state: str, **extra: Any) -> dict[str, Any]:
        a = self.attempt
        return {
            "state": state,
            "after": self.after,
            "device_id": self.device_id,
            "pinned": self.pinned,
            "since": iso(self.since) if self.since is not None else None,
            "error": None if a.succeeded else {"code": a.error_code, "message": a.error_message},
            "hints": [list(h) for h in a.tool_hints],
            "tools": list(a.tools),
            "commands": list(a.commands) if a.commands is not None else None,
            **extra,
        }


class Verifications:
    def __init__(
        self,
        settings: Settings,
        tasks: dict[str, TaskRun],
        writer: StepWriter,
        timers: Timers,
        queues: Queues,
        attempts: Attempts,
        fleet: Fleet,
        outbox: Outbox,
        apply: Apply,
        rng: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.rng = rng
        self.tasks = tasks
        self.writer = writer
        self.timers = timers
        self.queues = queues
        self.attempts = attempts
        self.fleet = fleet
        self.outbox = outbox
        self.apply = apply
        self.pending: dict[NodeKey, Pending] = {}

    # ---------------------------------------------------------------- an attempt ended

    def wants(self, run: TaskRun, unit: str, outcome: AttemptOutcome) -> bool:
        """Do the node's verify commands decide how this attempt ended (instead of the usual rules)?"""
        if not run.record(unit).spec.verify or (outcome.cancelled and not outcome.succeeded):
            return False
        return outcome.succeeded or (outcome.error_code in UNKNOWN and outcome.started)

    def begin(self, run: TaskRun, att: AttemptRun, outcome: AttemptOutcome, now: float) -> None:
        unit = att.key[1]
        rec = run.record(unit)
        after = "success" if outcome.succeeded else "unknown"
        p = Pending(att.key, att.device_id, rec.spec.placement.device is not None, after, outcome)
        if run.cancel_requested:  # nothing is verified for a cancelled task: never succeeded unverified
            self._cancel(run, p, now)
            return
        self.pending[p.key] = p
        self.apply(run, run.verifying(unit, outcome.output if outcome.succeeded else None, outcome.results), now)
        dev = self.fleet.devices.get(att.device_id)
        if outcome.succeeded and dev is not None and _usable(dev):
            self._open(run, p, dev, now)
        else:
            self._wait(run, p, now)

    def ended(self, run: TaskRun, att: AttemptRun, outcome: AttemptOutcome, now: float) -> None:
        """A verify attempt ended: it passed, failed, was cancelled, or could not say."""
        p = self.pending.get(att.key)
        if p is None or p.batch != att.batch_id:
            return
        p.batch = None
        if outcome.succeeded:
            self._decide(run, p, None, att.batch_id, now)
        elif outcome.cancelled or run.cancel_requested:
            self._cancel(run, p, now)
        elif (
            not outcome.started
            or outcome.error_code in UNKNOWN
            or (outcome.error_code == "timeout" and not att.accepted)
        ):
            self._wait(run, p, now)  # it could not say: wait for a device again
        else:
            self._decide(run, p, _what_failed(att, outcome), att.batch_id, now)

    # ---------------------------------------------------------------- waiting for a device

    def _wait(self, run: TaskRun, p: Pending, now: float) -> None:
        if p.since is None:
            p.since = now
        if now >= p.since + self.settings.probe_timeout_s:  # its bound passed while a check ran
            self._time_out(run, p, now)
            return
        self.timers.add(p.since + self.settings.probe_timeout_s, ProbeTimeout(p.key, p.since))
        self._store(run, p, "probing")

    def dispatch(self, now: float) -> None:
        """Give every node waiting for a device one that is back, before placement gives it other work."""
        for p in [p for p in self.pending.values() if p.batch is None]:
            run = self.tasks.get(p.key[0])
            if run is None or not run.has(p.key[1]):
                self.pending.pop(p.key, None)
                continue
            own = self.fleet.devices.get(p.device_id)
            if p.pinned and (own is None or own.admin is AdminState.REVOKED):
                self._give_up(run, p, "its device was revoked, so nothing can run its verify commands", now, "revoked")
                continue
            dev = self._device_for(run, p)
            if dev is not None:
                self._open(run, p, dev, now)

    def _device_for(self, run: TaskRun, p: Pending) -> DeviceRun | None:
        own = self.fleet.devices.get(p.device_id)
        if own is not None and _usable(own) and own.current_batch is None:
            return own
        if p.pinned:
            return None
        spec = run.record(p.key[1]).spec
        return next((d for d in self.queues.capable(spec) if _usable(d) and d.current_batch is None), None)

    def timeout(self, timer: ProbeTimeout, now: float) -> None:
        p = self.pending.get(timer.key)
        if p is None or p.since != timer.since or p.batch is not None:
            return  # decided since, or its verify attempt is running (it decides, or waits again)
        run = self.tasks.get(p.key[0])
        if run is not None:
            self._time_out(run, p, now)

    def _time_out(self, run: TaskRun, p: Pending, now: float) -> None:
        limit = self.settings.probe_timeout_s
        self._give_up(run, p, f"no device could run its verify commands within probe_timeout_s ({limit:g}s)", now)

    def _give_up(self, run: TaskRun, p: Pending, why: str, now: float, state: str = "timed_out") -> None:
        """Nothing can decide it: it ends by its attempt's own failure (or, after a success that
        could not be checked, as `uncertain`), judged by the retry rules."""
        del self.pending[p.key]
        a = p.attempt
        why = f"{why}, so its outcome is unknown"
        error, message = (a.error_code, f"{a.error_message}; {why}") if not a.succeeded else ("uncertain", why)
        self._store(run, p, state)
        self._end(run, p, _failure(a, error, message), now)

    def cancel(self, run: TaskRun, now: float) -> None:
        """The task was cancelled: nodes waiting for a device are cancelled (a running check ends
        when its device reports the cancel)."""
        for p in [p for p in self.pending.values() if p.key[0] == run.id and p.batch is None]:
            self._cancel(run, p, now)

    # ---------------------------------------------------------------- deciding

    def _open(self, run: TaskRun, p: Pending, dev: DeviceRun, now: float) -> None:
        unit = p.key[1]
        rec = run.record(unit)
        node_id, child = fanout.split_unit(unit)
        writers = [c.tool for c in rec.spec.verify if not dev.hints(c.tool)[0]]
        if writers:  # checked at submission; a re-plan's edit or a device's new catalogue may differ
            why = f"{', '.join(writers)} is not read-only on {dev.name}, and verify commands must change nothing"
            self._decide(run, p, f"its verify commands were not run: {why}", None, now)
            return
        try:
            commands = [
                Command(
                    call_id=f"v{i + 1}",
                    tool=c.tool,
                    tool_type=dev.tools.get(c.tool, {}).get("tool_type", "data_collection"),
                    arguments=templates.resolve(c.arguments, run.outcome_of),
                    timeout_s=c.timeout_s,
                )
                for i, c in enumerate(rec.spec.verify)
            ]
        except templates.TemplateError as exc:
            self._decide(run, p, f"a reference in its verify commands cannot be resolved: {exc}", None, now)
            return
        att = AttemptRun(
            self.attempts.new_batch_id(),
            run.id,
            node_id,
            max(1, rec.attempts),
            dev.id,
            self.fleet.next_fence(dev),
            commands,
            batch_deadline(now, None, commands),
            started=now,
            kind=AttemptKind.VERIFY,
            child=child,
        )
        self.attempts.add(att)
        self.fleet.set_current(dev, att.batch_id, now)
        self.writer.insert(Attempt, attempt_row(att, now, "dispatched"))
        self.writer.event(
            EventType.NODE_ATTEMPT,
            run.id,
            node_id,
            now,
            state="dispatched",
            kind=AttemptKind.VERIFY.value,
            attempt=att.n,
            batch_id=att.batch_id,
            device_id=dev.id,
        )
        if att.deadline:
            self.timers.add(att.deadline, AttemptDeadline(att.batch_id))
        self.timers.add(now + self.settings.batch_accept_timeout_s, AcceptDeadline(att.batch_id))
        self.outbox.dispatch_after_commit(att)
        p.batch = att.batch_id
        self._store(run, p, "checking", batch_id=att.batch_id)

    def _decide(self, run: TaskRun, p: Pending, failed: str | None, batch: str | None, now: float) -> None:
        """Its verify commands passed (`failed` None) or failed (what failed)."""
        self.pending.pop(p.key, None)
        rec = run.record(p.key[1])
        if failed is None:
            self._store(run, p, "passed", batch_id=batch)
            self._end(run, p, AttemptOutcome(True, output=rec.output, results=rec.results), now)
            return
        self._store(run, p, "failed", batch_id=batch, failed=failed)
        a = p.attempt
        if a.succeeded:
            message = f"its commands succeeded, but its verify commands failed: {failed}"
            self._end(run, p, _failure(a, FAILED, message), now)
            return
        message = f"{a.error_message}; its verify commands then showed it had not taken effect: {failed}"
        self._end(run, p, _failure(a, a.error_code, message, FAILED), now)

    def _cancel(self, run: TaskRun, p: Pending, now: float) -> None:
        self.pending.pop(p.key, None)
        self._store(run, p, "cancelled")
        cancelled = AttemptOutcome(
            False, error_code="cancelled", error_message="the task was cancelled", cancelled=True
        )
        self._end(run, p, cancelled, now)

    def _end(self, run: TaskRun, p: Pending, outcome: AttemptOutcome, now: float) -> None:
        """End its attempt with `outcome` by the usual rules (a retry only when retry-safe)."""
        self.apply(run, run.attempt_ended(p.key[1], outcome, now, self.rng()), now)

    def _store(self, run: TaskRun, p: Pending, state: str, **extra: Any) -> None:
        self.writer.update(*FanOuts.row(run, p.key[1]), verification=p.row(state, **extra))

    # ---------------------------------------------------------------- after a restart

    def restore(self, run: TaskRun, unit: str, stored: dict[str, Any] | None, now: float) -> None:
        """A VERIFYING node found in the store: decide it as before the restart. Its verify
        attempt, if one is open, decides; otherwise it waits for a device again (its wait still
        bounded from when it began)."""
        rec = run.record(unit)
        data = stored or {}
        error = data.get("error") or {}
        after = str(data.get("after") or "unknown")
        commands = data.get("commands")
        attempt = AttemptOutcome(
            after == "success",
            output=rec.output,
            results=rec.results,
            error_code=str(error.get("code") or "uncertain"),
            error_message=str(error.get("message") or "its outcome was not known when the orchestrator restarted"),
            started=True,
            tool_hints=tuple((bool(h[0]), bool(h[1])) for h in data.get("hints") or [(False, False)]),
            tools=tuple(str(t) for t in data.get("tools") or ()),
            commands=tuple(int(c) for c in commands) if isinstance(commands, list) else None,
        )
        device_id = str(data.get("device_id") or rec.spec.placement.device or "")
        p = Pending((run.id, unit), device_id, bool(data.get("pinned")), after, attempt)
        self.pending[p.key] = p
        open_check = next(
            (a for a in self.attempts.of_task(run.id) if a.kind is AttemptKind.VERIFY and a.key == p.key), None
        )
        since = data.get("since")
        if isinstance(since, str):
            p.since = datetime.fromisoformat(since).timestamp()
        if open_check is not None:
            p.batch = open_check.batch_id
            if p.since is not None:
                self.timers.add(p.since + self.settings.probe_timeout_s, ProbeTimeout(p.key, p.since))
            return
        self._wait(run, p, now)


def _usable(dev: DeviceRun) -> bool:
    """May run verify commands: connected and not revoked. Read-only, they settle work the device
    already did, so a draining, cordoned or stopped device runs them too (its agent still runs
    read-only tools)."""
    return dev.liveness is Liveness.ONLINE and dev.admin is not AdminState.REVOKED


def _failure(a: AttemptOutcome, code: str, message: str, final: str = "") -> AttemptOutcome:
    """A failed end of the node's attempt, judged by the tools its attempt used (retry rules)."""
    return AttemptOutcome(
        False,
        results=a.results,
        error_code=code,
        error_message=message,
        started=True,
        tool_hints=a.tool_hints,
        tools=a.tools,
        commands=a.commands,
        final_code=final,
    )


def _what_failed(att: AttemptRun, outcome: AttemptOutcome) -> str:
    """The first verify command that did not pass, with what it said."""
    by_call = {r.get("call_id"): r for r in outcome.results}
    for i, command in enumerate(att.commands):
        r = by_call.get(command.call_id)
        if r is not None and r.get("status") == "success":
            continue
        error = (r or {}).get("error") or {}
        said = error.get("message") or outcome.error_message or "no result"
        return f"verify command {i} ({command.tool}) {error.get('code') or outcome.error_code or 'failed'}: {said}"
    return outcome.error_message or "a verify command failed"
