"""Domain errors with stable codes; the API maps them to problem+json (SPEC section 3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a submission, precise enough to act on."""

    code: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, **self.extra}


class DomainError(Exception):
    """A request the domain refuses. `problems` lists every reason, first one names the code."""

    status = 422

    def __init__(self, problems: list[Problem]) -> None:
        assert problems
        super().__init__(problems[0].message)
        self.problems = problems

    @property
    def code(self) -> str:
        return self.problems[0].code
