"""Cron expressions in an IANA time zone: parsing, and the ticks they make.

The expression is Debian cron's, evaluated by `cronsim` (Healthchecks' evaluator, which follows
Debian cron on purpose, quirks included): five fields, `minute hour day-of-month month
day-of-week`, with names (`JAN`, `MON`), ranges, lists, steps, `L`, `LW` and `nth` weekdays
(`MON#1`); when both day fields are restricted, a day matching either runs (as in cron). A sixth
field in front adds seconds (`*/10 * * * * *`), as Quartz and croniter allow. The macros
`@hourly`, `@daily` (`@midnight`), `@weekly`, `@monthly` and `@yearly` (`@annually`) stand for
their five fields.

Daylight saving time, as Debian cron does it:
- a schedule at a fixed local time (its minute and hour fields are not wildcards, `30 2 * * *`)
  runs once per matching day: a time the clock skips (spring forward) runs at the first minute
  after the gap (02:30 -> 03:00), a time the clock passes twice (fall back) at its first
  occurrence only;
- a schedule with a wildcard minute or hour (`*/15 * * * *`, `0 * * * *`), or with seconds,
  follows real time: nothing runs in a skipped hour, and a repeated hour runs again.

Ticks are instants, as epoch seconds (the engine's clock); `local` shows one in the zone.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from orchestrator.domain.problems import Problem

MAX_EXPRESSION = 200
MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FORMAT = (
    "give five fields, 'minute hour day-of-month month day-of-week' (e.g. '0 2 * * *': 02:00 every day; "
    "'*/15 9-17 * * MON-FRI': every 15 minutes in office hours), a sixth in front for seconds, or one of "
    + ", ".join(sorted(MACROS))
)
# After a skipped or repeated local hour, cron's rule can name a time at or before the instant
# asked about (a fixed-time tick already run before the clock went back); it is passed over.
# A handful is the most there can be; the bound only keeps a broken zone from looping.
_PASSED_OVER = 1000


class CronError(ValueError):
    """An expression or time zone that cannot be used: one `Problem` per bad field, each naming
    it (`field`: `timezone` or `cron`), so one answer says everything that is wrong."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems[0].message)
        self.problems = problems


@dataclass(frozen=True)
class Cron:
    """A cron expression in a time zone, ready to say when it fires."""

    expression: str  # as given (its spacing normalised)
    timezone: str
    fields: str  # the five (or six) fields the expression stands for
    zone: tzinfo

    def after(self, instant: float) -> float | None:
        """The first tick strictly after `instant`, or None if it never fires again (none in 50 years)."""
        it = CronSim(self.fields, datetime.fromtimestamp(instant, self.zone))
        try:
            for _ in range(_PASSED_OVER):
                tick = next(it).timestamp()
                if tick > instant:
                    return tick
        except StopIteration:
            return None
        return None

    def upcoming(self, instant: float, count: int) -> list[float]:
        """The next `count` ticks after `instant` (fewer if it stops firing)."""
        out: list[float] = []
        at: float | None = self.after(instant)
        while at is not None and len(out) < count:
            out.append(at)
            at = self.after(at)
        return out

    def local(self, instant: float) -> datetime:
        """`instant` in the schedule's zone (its UTC offset says which side of a DST change)."""
        return datetime.fromtimestamp(instant, self.zone)

    def explain(self) -> str:
        """The expression in words (`At 02:00 on Monday through Friday`), or the expression itself."""
        try:
            return CronSim(self.fields, datetime(2000, 1, 1)).explain()
        except Exception:  # the explainer is cronsim's extra; a gap in it must not fail a listing
            return self.fields


def parse(expression: str, timezone: str, now: float) -> Cron:
    """A usable `Cron` (it fires after `now`), or a `CronError` naming each bad field."""
    zone, bad_zone = _zone(timezone)
    fields, bad_fields = _fields(expression)
    problems = [p for p in (bad_zone, bad_fields) if p is not None]
    if problems or zone is None:
        raise CronError(problems)
    cron = Cron(" ".join(expression.split()), timezone, fields, zone)
    if cron.after(now) is None:
        raise CronError([_bad_cron(expression, "it matches no date in the next 50 years")])
    return cron


def _fields(expression: str) -> tuple[str, Problem | None]:
    """The fields `expression` stands for, or why it cannot be used."""
    text = " ".join(expression.split())
    if not text:
        return "", _bad_cron(expression, "it is empty")
    if len(text) > MAX_EXPRESSION:
        return "", _bad_cron(expression[:40] + "...", f"it is longer than {MAX_EXPRESSION} characters")
    if text.startswith("@"):
        fields = MACROS.get(text.lower())
        return (fields, None) if fields else ("", _bad_cron(expression, f"'{text}' is not a macro this server knows"))
    count = len(text.split())
    if count not in (5, 6):
        return "", _bad_cron(expression, f"it has {count} field{'s' if count != 1 else ''}")
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError as exc:
        return "", _bad_cron(expression, _reason(exc, count))
    return text, None


def _reason(exc: CronSimError, count: int) -> str:
    """cronsim says `Bad minute`; with six fields the first one is seconds, so the names stand."""
    text = str(exc) or "it cannot be read"
    if text.startswith("Bad "):
        field = text.removeprefix("Bad ")
        return f"its {field} field is not valid" + (" (six fields: seconds come first)" if count == 6 else "")
    return text[0].lower() + text[1:]


def _bad_cron(expression: str, why: str) -> Problem:
    shown = expression.replace("\x00", "\\u0000")
    return Problem("invalid_cron", f"cron '{shown}' is not valid: {why}; {_FORMAT}", {"field": "cron"})


@cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones()) | {"UTC"}


def _zone(name: str) -> tuple[tzinfo | None, Problem | None]:
    """The zone of an IANA name (as the tz database spells it), or why not."""
    if name == "UTC":
        return UTC, None  # no DST: cronsim iterates plainly
    if name in _zones():
        return ZoneInfo(name), None
    nearest = difflib.get_close_matches(name, sorted(_zones()), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(nearest)}?" if nearest else ""
    shown = name.replace("\x00", "\\u0000")
    message = f"timezone '{shown}' is not an IANA time zone name (e.g. 'Europe/Paris', 'America/New_York', 'UTC'){hint}"
    return None, Problem("unknown_timezone", message, {"field": "timezone", "nearest": nearest})
