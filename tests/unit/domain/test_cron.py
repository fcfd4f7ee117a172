"""Cron expressions in time zones (issue 20): what is accepted, what is refused and why, and when
a schedule fires, across daylight saving time in both directions."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from orchestrator.domain import cron
from orchestrator.domain.cron import CronError

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()


def ticks(expression: str, zone: str, start: datetime, count: int) -> list[str]:
    """The next `count` ticks after `start`, in the zone, as ISO 8601 with their offset."""
    c = cron.parse(expression, zone, NOW)
    return [c.local(t).isoformat() for t in c.upcoming(start.timestamp(), count)]


def refused(expression: str, zone: str = "UTC") -> list[tuple[str, str]]:
    with pytest.raises(CronError) as caught:
        cron.parse(expression, zone, NOW)
    return [(p.code, p.extra["field"]) for p in caught.value.problems]


# ---------------------------------------------------------------- what is accepted


def test_five_fields_names_ranges_steps_and_macros_are_cron_expressions() -> None:
    at = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # a Monday
    assert ticks("0 2 * * *", "UTC", at, 2) == ["2026-06-02T02:00:00+00:00", "2026-06-03T02:00:00+00:00"]
    assert ticks("*/20 9-17 * * MON-FRI", "UTC", at, 3) == [
        "2026-06-01T12:20:00+00:00",
        "2026-06-01T12:40:00+00:00",
        "2026-06-01T13:00:00+00:00",
    ]
    assert ticks("0 9 * * mon#1", "UTC", at, 1) == ["2026-07-06T09:00:00+00:00"]  # the first Monday
    assert ticks("0 0 L * *", "UTC", at, 1) == ["2026-06-30T00:00:00+00:00"]  # the last day of the month
    assert ticks("@daily", "UTC", at, 1) == ["2026-06-02T00:00:00+00:00"]
    assert ticks("@HOURLY", "UTC", at, 1) == ["2026-06-01T13:00:00+00:00"]
    assert ticks("*/15 * * * * *", "UTC", at, 2) == ["2026-06-01T12:00:15+00:00", "2026-06-01T12:00:30+00:00"]


def test_a_tick_is_always_strictly_after_the_instant_asked_about() -> None:
    c = cron.parse("* * * * *", "UTC", NOW)
    assert c.after(NOW) == NOW + 60
    assert c.after(NOW - 0.5) == NOW
    assert c.expression == "* * * * *"


def test_the_expression_is_explained_in_words() -> None:
    assert cron.parse("0 2 * * 1-5", "Europe/Paris", NOW).explain() == "At 02:00 on Monday through Friday"
    assert cron.parse("@daily", "UTC", NOW).explain() == "At 00:00 every day"


# ---------------------------------------------------------------- what is refused


def test_a_bad_expression_is_refused_naming_the_cron_field_and_the_fix() -> None:
    assert refused("61 * * * *") == [("invalid_cron", "cron")]
    assert refused("* * *") == [("invalid_cron", "cron")]
    assert refused("0 0 * * * * *") == [("invalid_cron", "cron")]  # seven fields
    assert refused("@reboot") == [("invalid_cron", "cron")]
    assert refused("") == [("invalid_cron", "cron")]
    assert refused("0 0 31 2 *") == [("invalid_cron", "cron")]  # a date no February has
    with pytest.raises(CronError) as caught:
        cron.parse("61 * * * *", "UTC", NOW)
    message = caught.value.problems[0].message
    assert "minute field is not valid" in message and "'0 2 * * *'" in message and "@daily" in message


def test_an_unknown_time_zone_is_refused_with_the_nearest_names() -> None:
    assert refused("0 2 * * *", "Europe/Pari") == [("unknown_timezone", "timezone")]
    with pytest.raises(CronError) as caught:
        cron.parse("0 2 * * *", "Europe/Pari", NOW)
    assert "Europe/Paris" in caught.value.problems[0].extra["nearest"]
    assert refused("0 2 * * *", "../../etc/passwd") == [("unknown_timezone", "timezone")]
    assert refused("0 2 * * *", "utc") == [("unknown_timezone", "timezone")]


def test_both_a_bad_zone_and_a_bad_expression_are_named_in_one_answer() -> None:
    assert refused("99 * * * *", "Mars/Olympus") == [("unknown_timezone", "timezone"), ("invalid_cron", "cron")]


# ---------------------------------------------------------------- daylight saving time


def test_a_fixed_time_the_clock_skips_runs_right_after_the_gap() -> None:
    """America/New_York springs forward at 02:00 on 2026-03-08: 02:30 does not happen that day."""
    at = datetime(2026, 3, 6, 12, 0, tzinfo=UTC)
    assert ticks("30 2 * * *", "America/New_York", at, 3) == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",  # the first minute after the gap
        "2026-03-09T02:30:00-04:00",
    ]


def test_a_fixed_time_the_clock_passes_twice_runs_once() -> None:
    """Europe/Paris falls back at 03:00 on 2026-10-25: 02:30 happens twice, and runs the first time."""
    at = datetime(2026, 10, 23, 12, 0, tzinfo=UTC)
    assert ticks("30 2 * * *", "Europe/Paris", at, 3) == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]


def test_an_hourly_schedule_runs_every_real_hour_across_both_changes() -> None:
    """Wildcard hours follow elapsed time: one tick fewer in spring, one more in autumn."""
    spring = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # Paris: 02:00 CET -> 03:00 CEST at 01:00 UTC
    assert ticks("0 * * * *", "Europe/Paris", spring, 3) == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T04:00:00+02:00",
        "2026-03-29T05:00:00+02:00",
    ]
    autumn = datetime(2026, 10, 24, 23, 30, tzinfo=UTC)  # Paris: 03:00 CEST -> 02:00 CET at 01:00 UTC
    assert ticks("0 * * * *", "Europe/Paris", autumn, 3) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the repeated hour runs again
        "2026-10-25T03:00:00+01:00",
    ]


def test_after_the_first_pass_of_a_repeated_hour_a_fixed_time_is_not_run_again() -> None:
    """Asked during the second 01:15 (EST, after 01:30 EDT ran): the next run is tomorrow's.
    Cron's rule alone would name today's 01:30 again, an instant already past."""
    second_pass = datetime(2026, 11, 1, 1, 15, fold=1, tzinfo=ZoneInfo("America/New_York"))
    assert ticks("30 1 * * *", "America/New_York", second_pass, 1) == ["2026-11-02T01:30:00-05:00"]


def test_southern_hemisphere_zones_change_the_other_way_round() -> None:
    """Australia/Sydney springs forward on 2026-10-04 at 02:00 (to 03:00, +11:00)."""
    at = datetime(2026, 10, 2, 12, 0, tzinfo=UTC)
    assert ticks("30 2 * * *", "Australia/Sydney", at, 2) == ["2026-10-03T02:30:00+10:00", "2026-10-04T03:00:00+11:00"]


# ---------------------------------------------------------------- what it costs


def too_rare(expression: str, zone: str = "UTC") -> list[tuple[str, str]]:
    with pytest.raises(CronError) as caught:
        cron.regular(cron.parse(expression, zone, NOW), NOW)
    return [(p.code, p.extra["field"]) for p in caught.value.problems]


def test_a_cron_that_fires_less_often_than_a_leap_day_is_refused_as_too_rare() -> None:
    # Feb 30th or a 5th Sunday of February (day fields restricted both: either day runs): every 28 years.
    assert too_rare("0 0 30 2 SUN#5") == [("cron_too_rare", "cron")]
    # Every second of one day, then nothing for 28 years: the gap after that day is found too.
    assert too_rare("* * * 2 MON#5") == [("cron_too_rare", "cron")]
    with pytest.raises(CronError) as caught:
        cron.regular(cron.parse("0 0 30 2 SUN#5", "UTC", NOW), NOW)
    message = caught.value.problems[0].message
    assert "less often than every 8 years" in message and "2060-02-29T00:00:00+00:00" in message
    # A leap day (every 4 years, 8 across 2100), once a year (a zone's offset change) and more often pass.
    for expression, zone in [
        ("0 0 29 2 *", "Europe/Paris"),
        ("0 12 29 2 *", "UTC"),
        ("@yearly", "UTC"),
        ("0 0 1 1 *", "Europe/Paris"),
        ("0 0 31 12 *", "Australia/Sydney"),
        ("0 9 * * MON#1", "Asia/Tokyo"),
        ("30 2 * * *", "America/New_York"),
        ("*/10 * * * * *", "UTC"),
    ]:
        cron.regular(cron.parse(expression, zone, NOW), NOW)


def test_a_cron_that_never_fires_is_refused() -> None:
    assert refused("0 0 30 2 *") == [("invalid_cron", "cron")]  # no February has a 30th
    assert refused("0 0 */31 2 MON#5") == [("invalid_cron", "cron")]  # a February 1st that is its 5th Monday


def test_next_runs_are_capped_and_a_rare_cron_shown_again_walks_the_calendar_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = cron.parse("0 0 30 2 SUN#5", "Europe/Paris", NOW)  # stored before the rule: it still shows
    walks: list[datetime] = []

    class Counted(cron.CronSim):
        def __init__(self, expr: str, dt: datetime) -> None:
            walks.append(dt)
            super().__init__(expr, dt)

    monkeypatch.setattr(cron, "CronSim", Counted)
    first = c.upcoming(NOW + 0.25, 1000)
    assert len(first) == cron.MAX_NEXT == 50
    assert len(walks) <= cron.MAX_NEXT + 1
    walks.clear()
    # Polled again a little later: only the walk from "now" to the first tick is new.
    assert c.upcoming(NOW + 60.5, 50) == first
    assert len(walks) == 1


# ---------------------------------------------------------------- zones replicas agree on


def test_localtime_factory_and_other_non_iana_names_are_not_time_zones() -> None:
    for name in ("localtime", "Factory", "posixrules", "posix/Europe/Paris", "right/UTC"):
        assert refused("0 2 * * *", name) == [("unknown_timezone", "timezone")], name
    with pytest.raises(CronError) as caught:
        cron.parse("0 2 * * *", "localtime", NOW)
    assert "replicas" in caught.value.problems[0].message
    for name in ("Etc/GMT+5", "Etc/UTC", "Europe/Paris", "America/Argentina/Buenos_Aires", "UTC", "GMT"):
        assert cron.parse("0 2 * * *", name, NOW).timezone == name
