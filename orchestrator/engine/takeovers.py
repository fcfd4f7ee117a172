"""Takeovers in the engine: a person has a device's screen, and its agent nodes wait for them.

A device is taken over by an operator (a control, `orchestrator.domain.controls`: desired state
with one writer, this engine, reconciled with the agent like a stop) or by its owner at the
device (the agent's own word, `owner_takeover`, which the engine records). While either holds:

- the device takes no new batch (`DeviceRun.taken_over`: placement sees it busy, its queue waits);
- each agent node running on it shows `taken_over` and pauses before its next action: a step it
  asks for is held, not sent; its attempt's clock stops (`paused_since`), so the takeover does not
  count against its `timeout_s`, as a wait for approval does not;
- its agent refuses the model's input tools (`taken_over`), which covers a step already on its way.

At the handback the held step is answered without running anything (each command `skipped`, code
`taken_over`, with who had the device, for how long and their note), or, if the model was still
thinking, the first step it asks for next is: either way the note is in the model's context and it
observes afresh before it acts (its agent voided the GUI observation at both ends, so an action on
an older one is refused `stale_observation`). A model's question to a person
(`approval.ask_person`) still waiting is answered with the note. A stop ends a takeover with
everything else; an orchestrator restart keeps it (it is in the device's row).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, Protocol

from orchestrator.domain.run import TaskRun, Transition
from orchestrator.engine.attempts import Attempts
from orchestrator.engine.records import AgentStep, AttemptKind, AttemptRun, DeviceRun
from orchestrator.engine.timers import AttemptDeadline, Timers
from orchestrator.engine.times import utc
from orchestrator.engine.writer import EventType, StepWriter
from orchestrator.store.models import Attempt

log = logging.getLogger("orrery.engine")

TAKEN_OVER = "taken_over"  # the code of a step answered without running (see the module's text)
MAX_NOTE = 2000

Results = list[dict[str, Any]]
Apply = Callable[[TaskRun, list[Transition], float], None]


class Questions(Protocol):
    """What takeovers need of the approvals: a model's questions to a person on a device."""

    def answer_questions(self, device_id: str, by: str, note: str, now: float) -> None: ...

    def questions_on(self, device_id: str) -> set[str]: ...

    def waiting_for(self, batch_ids: set[str]) -> bool: ...


class Takeovers:
    def __init__(
        self,
        tasks: dict[str, TaskRun],
        attempts: Attempts,
        writer: StepWriter,
        timers: Timers,
        questions: Questions,
        apply: Apply,
    ) -> None:
        self.tasks = tasks
        self.attempts = attempts
        self.writer = writer
        self.timers = timers
        self.questions = questions
        self.apply = apply

    # ---------------------------------------------------------------- a person takes over, hands back

    def changed(self, dev: DeviceRun, taken: bool, by: str, note: str, now: float) -> None:
        """The device was taken over (`taken`) or handed back (`note`: the person's words)."""
        # A model waiting for an answer to its question reads the note as the answer: its next
        # step is not answered with it again.
        asking = set() if taken else self.questions.questions_on(dev.id)
        for att in self.attempts.on_device(dev.id):
            if att.kind is not AttemptKind.AGENT:
                continue
            if taken:
                self._pause(att, by, now)
            else:
                self._go_on(att, by, note, now, told=att.step in asking and bool(note))
        if not taken and note:
            self.questions.answer_questions(dev.id, by, note[:MAX_NOTE], now)
        log.info("device %s %s by %s", dev.id, "taken over" if taken else "handed back", by or "a person")

    def _pause(self, att: AttemptRun, by: str, now: float) -> None:
        att.handback_note = None  # a note not yet told is superseded by this takeover's
        for paused in self._clocks(att):
            if paused.paused_since is None:
                paused.paused_since = now
        run = self.tasks.get(att.task_id)
        if run is not None and run.has(unit := att.key[1]):
            self.apply(run, run.taken_over(unit, True), now)
        self.writer.event(
            EventType.NODE_TAKEOVER, att.task_id, att.node_id, now, device_id=att.device_id, taken_over=True, by=by
        )

    def _go_on(self, att: AttemptRun, by: str, note: str, now: float, told: bool = False) -> None:
        since = att.paused_since
        for paused in self._clocks(att):
            start, paused.paused_since = paused.paused_since, None
            if start is None or paused.deadline is None:
                continue
            paused.deadline += max(0.0, now - start)
            self.timers.add(paused.deadline, AttemptDeadline(paused.batch_id))
            self.writer.update(Attempt, (paused.batch_id,), deadline=utc(paused.deadline))
        held_for = max(0.0, now - since) if since is not None else 0.0
        message = handback_message(by, held_for, note)
        if att.held is not None:
            item, waiter = att.held
            att.held = None
            _answer(waiter, item, message)
        elif not told:
            att.handback_note = message
        run = self.tasks.get(att.task_id)
        if run is not None and run.has(unit := att.key[1]):
            asked = self.questions.waiting_for({att.batch_id} | ({att.step} if att.step else set()))
            self.apply(run, run.taken_over(unit, False, waiting_approval=asked), now)
        self.writer.event(
            EventType.NODE_TAKEOVER,
            att.task_id,
            att.node_id,
            now,
            device_id=att.device_id,
            taken_over=False,
            by=by,
            note=note[:MAX_NOTE],
            paused_s=round(held_for, 3),
        )

    def _clocks(self, att: AttemptRun) -> list[AttemptRun]:
        step = self.attempts.get(att.step)
        return [att] if step is None else [att, step]

    # ---------------------------------------------------------------- an agent asks for a step

    def step(
        self, parent: AttemptRun, dev: DeviceRun, item: AgentStep, waiter: asyncio.Future[Results], now: float
    ) -> bool:
        """Whether a step the agent loop asks for is taken here rather than sent: held while the
        device is taken over, or answered with the handback's note it has not been told yet."""
        if dev.taken_over:
            if parent.held is not None:
                _cancel(parent.held[1])  # a loop asks one step at a time; an older one is moot
            parent.held = (item, waiter)
            if parent.paused_since is None:  # taken over before this attempt began
                self._pause(parent, dev.taken_over_by or (dev.owner_takeover or {}).get("by", ""), now)
            return True
        if parent.handback_note is not None:
            told, parent.handback_note = parent.handback_note, None
            _answer(waiter, item, told)
            return True
        return False

    def attempt_ended(self, att: AttemptRun, _now: float) -> None:
        """An agent attempt ended (stopped, cancelled, timed out): a step it holds is dropped."""
        if att.held is not None:
            _cancel(att.held[1])
            att.held = None


def handback_message(by: str, held_for: float, note: str) -> str:
    """What the model reads of a takeover: who, how long, their note, and to observe first."""
    who = by or "a person"
    took = f"{held_for:.0f} s" if math.isfinite(held_for) else "a while"
    said = f' Their note: "{note[:MAX_NOTE]}".' if note else " They left no note."
    return (
        f"Nothing of this step ran: {who} took this device over for {took} and handed it back.{said} "
        "The screen may have changed: observe it again (e.g. gui.observe or a browser snapshot) before acting."
    )


def _answer(waiter: asyncio.Future[Results], item: AgentStep, told: str) -> None:
    if waiter.done():
        return
    waiter.set_result(
        [
            {"call_id": f"c{i + 1}", "status": "skipped", "error": {"code": TAKEN_OVER, "message": told}}
            for i, _ in enumerate(item.commands)
        ]
    )


def _cancel(waiter: asyncio.Future[Results]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.CancelledError("the agent attempt has ended"))
