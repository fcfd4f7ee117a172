"""Who has the device's screen: the model (through batches), or a person who took it over.

Two writers, one each: an operator's takeover is desired state from the orchestrator (the
device's `ControlState`, applied by the agent), the owner's own takeover at the device is the
agent's (kept in its ledger, reported to the orchestrator). While either holds, the model's
input tools are refused (`taken_over`) and a person's forwarded input is taken; each change voids
the GUI's current observation, so the model must observe afresh after a handback.
"""

from __future__ import annotations

from dataclasses import dataclass

TAKEN_OVER = "taken_over"


@dataclass
class Takeover:
    operator: bool = False  # an operator took the device over (the orchestrator's word)
    operator_by: str = ""
    owner: bool = False  # the owner took it over at the device (this agent's word)
    owner_by: str = ""

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
