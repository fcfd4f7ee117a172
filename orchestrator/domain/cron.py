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

What it costs: finding a tick walks the calendar (cronsim gives up after 50 years), so a rare
expression (`0 0 30 2 SUN#5`: 5th Sundays of February, every 28 years) costs a calendar walk per
tick. A new schedule must fire at least every 8 years, as a leap day does (`regular`: `cron_too_rare` otherwise), the
next runs shown are at most `MAX_NEXT`, and each tick found is remembered (`_after`), so showing a
schedule again walks only to its first tick. The callers run all of it off the event loop.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from functools import cache, lru_cache
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
MAX_NEXT = 50  # next runs shown at most
MAX_GAP_S = 2924 * 86400.0  # a schedule fires at least every 8 years: a leap day does (2096, then 2104)
# A new schedule is checked for a gap longer than a year from instants this far apart, over the
# calendar's whole cycle of weekdays and leap years (28 years, within a century).
_CHECK_STEP_S = 30 * 86400.0
_CHECK_SPAN_S = 28 * 365.25 * 86400.0
# Names the tz database directory holds that are not IANA zones: `localtime` is this machine's own
# zone (replicas may disagree), `Factory` a placeholder with no offset, `posixrules` a template.
NOT_IANA = frozenset({"localtime", "Factory", "posixrules"})
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
        return _after(self.fields, self.zone, instant)

    def upcoming(self, instant: float, count: int) -> list[float]:
        """The next `count` ticks after `instant` (fewer if it stops firing; at most `MAX_NEXT`)."""
        count = min(count, MAX_NEXT)
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


@lru_cache(maxsize=8192)
def _after(fields: str, zone: tzinfo, instant: float) -> float | None:
    """`Cron.after`, remembered: a schedule shown again asks for the same ticks after its first
    one (each tick's successor), and a rare one costs a calendar walk each (thread-safe: at worst
    two threads compute the same answer)."""
    it = CronSim(fields, datetime.fromtimestamp(instant, zone))
    try:
        for _ in range(_PASSED_OVER):
            tick = next(it).timestamp()
            if tick > instant:
                return tick
    except StopIteration:
        return None
    return None


def regular(cron: Cron, now: float) -> None:
    """Refuse (`cron_too_rare`) a cron that goes more than 8 years without a tick (a leap day's
    longest gap), anywhere in the calendar's 28-year cycle from `now`: each of its ticks would cost
    a long calendar walk, and a schedule that rare is more likely a mistake (`0 0 30 2 SUN#5` reads
    as February 30th) than a plan. About 340 lookups for a cron that passes, ~10 ms."""
    at = now
    while at < now + _CHECK_SPAN_S:
        tick = cron.after(at)
        if tick is None or tick - at > MAX_GAP_S:
            start = cron.local(at).date().isoformat()
            when = f"its next tick after {start} is {cron.local(tick).isoformat()}" if tick else "it stops firing"
            raise CronError(
                [
                    Problem(
                        "cron_too_rare",
                        f"cron '{cron.expression}' fires less often than every 8 years ({when}); a schedule must "
                        f"fire at least once every {MAX_GAP_S / 86400:.0f} days (a leap day does): {_FORMAT}",
                        {"field": "cron"},
                    )
                ]
            )
        at += _CHECK_STEP_S


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
    """The IANA names of the tz database (`available_timezones` also lists a few files of its
    directory that are not zones; see NOT_IANA)."""
    names = {n for n in available_timezones() if n not in NOT_IANA and not n.startswith(("posix/", "right/"))}
    return frozenset(names) | {"UTC"}


def _zone(name: str) -> tuple[tzinfo | None, Problem | None]:
    """The zone of an IANA name (as the tz database spells it), or why not."""
    if name == "UTC":
        return UTC, None  # no DST: cronsim iterates plainly
    if name in _zones():
        return ZoneInfo(name), None
    shown = name.replace("\x00", "\\u0000")
    if name in NOT_IANA:
        why = "this machine's local zone, which replicas may not share" if name == "localtime" else "not a place's zone"
        message = f"timezone '{shown}' is {why}; give an IANA time zone name (e.g. 'Europe/Paris', 'UTC')"
        return None, Problem("unknown_timezone", message, {"field": "timezone", "nearest": []})
    nearest = difflib.get_close_matches(name, sorted(_zones()), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(nearest)}?" if nearest else ""
    message = f"timezone '{shown}' is not an IANA time zone name (e.g. 'Europe/Paris', 'America/New_York', 'UTC'){hint}"
    return None, Problem("unknown_timezone", message, {"field": "timezone", "nearest": nearest})
