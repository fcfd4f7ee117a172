"""`action_id` receipts: an input is performed at most once per id (device-safety note, A).

A receipt is reserved as *uncertain* before the device is touched and only then finalised, so
a crash, timeout or cancel in the middle of an input leaves a receipt that says "this may or
may not have happened" and is never replayed. The same id with the same arguments returns the
stored outcome without new input; the same id with other arguments is `id_conflict`.

Receipts live 5 minutes (longer than an observation's 60 s, so an expired receipt can no longer
be matched by a still-valid observation) and at most 4,096 are kept. Only expired receipts are
pruned: when 4,096 live ones exist, new actions are refused with `action_limit` rather than
forgetting one that a retry might still need. Receipts are in memory: after an agent restart,
unconfirmed actions must be re-observed, never replayed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from device_agent.toolsets.gui.rules import GuiError

RETENTION_S = 300.0
CAPACITY = 4096

UNCERTAIN_MESSAGE = (
    "the input for action_id {action_id!r} may or may not have reached the device (it failed, timed "
    "out or was interrupted part-way; held buttons and modifier keys were released). It will not "
    "be replayed: call gui.observe to see what happened, then act with a new action_id if needed"
)


@dataclass
class Outcome:
    """What a call answered: success with `data`, or a failure `code` and `message` (+ `data`)."""

    ok: bool
    data: dict[str, Any] = field(default_factory=dict)
    code: str = ""
    message: str = ""


@dataclass
class Receipt:
    digest: str
    expires_at: float
    # None while reserved: the input is in flight or ended in an unknown state.
    outcome: Outcome | None = None


def uncertain(action_id: str) -> Outcome:
    """The answer for an action whose input may have been partly delivered."""
    return Outcome(
        ok=False,
        code="uncertain",
        message=UNCERTAIN_MESSAGE.format(action_id=action_id),
        data={"action_id": action_id, "input_dispatched": None, "delivery_uncertain": True, "retry_safe": False},
    )


class Receipts:
    """The receipt book of one toolset instance (one controller of one display)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, capacity: int = CAPACITY) -> None:
        self._clock = clock
        self._capacity = capacity
        self._book: dict[str, Receipt] = {}

    def __len__(self) -> int:
        return len(self._book)

    def lookup(self, action_id: str, digest: str) -> Outcome | None:
        """The stored outcome for a retry, None for a new id; raises `id_conflict` on other arguments."""
        receipt = self._book.get(action_id)
        if receipt is None or receipt.expires_at <= self._clock():
            return None
        if receipt.digest != digest:
            raise GuiError(
                "id_conflict",
                f"action_id {action_id!r} was already used for a different call in the last "
                f"{RETENTION_S / 60:g} minutes; use a new action_id for a new action (reuse an id only to "
                "retry exactly the same call)",
                action_id=action_id,
            )
        return receipt.outcome if receipt.outcome is not None else uncertain(action_id)

    def ensure_room(self) -> None:
        """Prune expired receipts; refuse with `action_limit` if every slot holds a live one."""
        if len(self._book) < self._capacity:
            return
        now = self._clock()
        for key in [k for k, r in self._book.items() if r.expires_at <= now]:
            del self._book[key]
        if len(self._book) >= self._capacity:
            oldest = min(r.expires_at for r in self._book.values())
            wait = max(1, int(oldest - now) + 1)
            raise GuiError(
                "action_limit",
                f"this device holds {self._capacity} action receipts from the last {RETENTION_S / 60:g} "
                f"minutes and forgets none early; retry in about {wait} s",
                retry_after_s=wait,
            )

    def reserve(self, action_id: str, digest: str) -> None:
        """Record the action as in flight *before* the device is touched."""
        self.ensure_room()
        self._book[action_id] = Receipt(digest=digest, expires_at=self._clock() + RETENTION_S)

    def finish(self, action_id: str, outcome: Outcome) -> None:
        """Store the final outcome of a reserved action (a retry gets exactly this)."""
        receipt = self._book.get(action_id)
        if receipt is not None:
            receipt.outcome = outcome

    def drop(self, action_id: str) -> None:
        """Forget a reservation whose input was provably never started."""
        self._book.pop(action_id, None)
