"""Who has the device's screen: the model (through batches), or a person who took it over.

Two writers, one each: an operator's takeover is desired state from the orchestrator (the
device's `ControlState`, applied by the agent), the owner's own takeover at the device is the
agent's (kept in its ledger, reported to the orchestrator). While either holds, the model's
input tools are refused (`taken_over`) and a person's forwarded input is taken; each change voids
the GUI's current observation, so the model must observe afresh after a handback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("orrery.agent")

TAKEN_OVER = "taken_over"
# The model's input tools: refused while a person has the screen (read-only ones still run).
INPUT_NAMESPACES = ("gui", "browser")


@dataclass
class Takeover:
    operator: bool = False  # an operator took the device over (the orchestrator's word)
    operator_by: str = ""
    owner: bool = False  # the owner took it over at the device (this agent's word)
    owner_by: str = ""
    # Called whenever who has the screen changes (the gui toolset voids its observation).
    _hooks: list[Callable[[], None]] = field(default_factory=list)

    def on_change(self, hook: Callable[[], None]) -> None:
        self._hooks.append(hook)

    def set(self, operator: bool | None = None, owner: bool | None = None, by: str = "") -> bool:
        """Change one side (the other keeps its state); True if anything changed. Every change
        voids the GUI's current observation, so the model must observe afresh."""
        before = (self.operator, self.owner)
        if operator is not None:
            self.operator, self.operator_by = operator, (by if operator else "")
        if owner is not None:
            self.owner, self.owner_by = owner, (by if owner else "")
        if (self.operator, self.owner) == before:
            return False
        for hook in self._hooks:
            try:
                hook()
            except Exception as exc:
                log.warning("a toolset failed to note the takeover (%s: %s)", type(exc).__name__, exc)
        return True

    def refuses(self, tool: str, read_only: bool) -> bool:
        """Whether a model's call of `tool` is refused now (an input tool, while a person has it)."""
        return self.active and not read_only and tool.partition(".")[0] in INPUT_NAMESPACES

    @property
    def active(self) -> bool:
        return self.operator or self.owner

    @property
    def by(self) -> str:
        return self.operator_by if self.operator else self.owner_by

    def refusal(self) -> str:
        """Why a model's input is refused now (the `taken_over` error's message)."""
        who = self.by or ("an operator" if self.operator else "the device's owner")
        return (
            f"a person ({who}) has taken this device over: input from tasks is refused until they hand it "
            "back; after that, observe the screen again before acting"
        )
