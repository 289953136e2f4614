"""The cron parser: fields, the day rule of Vixie cron, next and previous ticks."""

from __future__ import annotations

import functools
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ferryq import cron
from ferryq.cron import CronError
from tests.conftest import examples


def at(text: str) -> float:
    """'2026-11-24 08:15' in UTC, as Unix seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def show(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M %a")


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        ("* * * * *", "2026-11-24 08:15:30", "2026-11-24 08:16"),
        ("* * * * *", "2026-11-24 08:15", "2026-11-24 08:16"),  # strictly after
        ("*/5 * * * *", "2026-11-24 08:15", "2026-11-24 08:20"),
        ("*/5 * * * *", "2026-11-24 08:56", "2026-11-24 09:00"),
        ("7,19 */6 * * *", "2026-11-24 06:20", "2026-11-24 12:07"),
        ("0 9-17/4 * * *", "2026-11-24 13:00", "2026-11-24 17:00"),
        ("0 9-17/4 * * *", "2026-11-24 17:00", "2026-11-25 09:00"),
        ("30 2 * * *", "2026-12-31 03:00", "2027-01-01 02:30"),
        ("0 0 31 * *", "2026-11-01 00:00", "2026-12-31 00:00"),  # November has no 31st
        ("0 0 29 2 *", "2026-03-01 00:00", "2028-02-29 00:00"),
        ("0 12 * * 0", "2026-11-24 08:00", "2026-11-29 12:00"),  # Sunday is 0 ...
        ("0 12 * * 7", "2026-11-24 08:00", "2026-11-29 12:00"),  # ... and 7
        ("0 12 * * sun", "2026-11-24 08:00", "2026-11-29 12:00"),
        ("0 0 1 jan-mar/2 *", "2026-01-02 00:00", "2026-03-01 00:00"),
        ("0 8 * * mon-fri", "2026-11-27 09:00", "2026-11-30 08:00"),  # Friday to Monday
        # Both day fields restricted: either may match (the 13th, or any Friday).
        ("0 0 13 * 5", "2026-11-24 00:00", "2026-11-27 00:00"),
        ("0 0 13 * 5", "2026-11-27 00:00", "2026-12-04 00:00"),
        ("0 0 13 * 5", "2026-12-12 00:00", "2026-12-13 00:00"),
        # One of them starts with '*': both must match (odd days that are Mondays).
        ("0 0 */2 * 1", "2026-11-24 00:00", "2026-12-07 00:00"),
        ("0 0 1 * *", "2026-11-24 00:00", "2026-12-01 00:00"),
        ("@hourly", "2026-11-24 08:15", "2026-11-24 09:00"),
        ("@daily", "2026-11-24 08:15", "2026-11-25 00:00"),
        ("@weekly", "2026-11-24 08:15", "2026-11-29 00:00"),
        ("@monthly", "2026-11-24 08:15", "2026-12-01 00:00"),
        ("@yearly", "2026-11-24 08:15", "2027-01-01 00:00"),
        ("5/20 * * * *", "2026-11-24 08:30", "2026-11-24 08:45"),
        ("0 0 29 2 */7", "2026-11-24 00:00", "2032-02-29 00:00"),  # a Sunday 29 February
    ],
)
def test_next_tick(expression: str, after: str, expected: str) -> None:
    assert show(cron.parse(expression).next_after(at(after))) == show(at(expected))


@pytest.mark.parametrize(
    ("expression", "before", "expected"),
    [
        ("*/5 * * * *", "2026-11-24 08:15", "2026-11-24 08:10"),  # strictly before
        ("*/5 * * * *", "2026-11-24 08:15:01", "2026-11-24 08:15"),
        ("30 2 * * *", "2027-01-01 02:00", "2026-12-31 02:30"),
        ("0 0 29 2 *", "2028-02-28 00:00", "2024-02-29 00:00"),
        ("0 0 13 * 5", "2026-12-13 00:00", "2026-12-11 00:00"),
        ("0 0 31 * *", "2026-12-01 00:00", "2026-10-31 00:00"),
        ("0 0 29 2 */7", "2026-11-24 00:00", "2004-02-29 00:00"),  # 2100 is no leap year:
        ("0 0 29 2 */7", "2096-01-01 00:00", "2088-02-29 00:00"),  # 40 years to 2128
    ],
)
def test_previous_tick(expression: str, before: str, expected: str) -> None:
    assert show(cron.parse(expression).previous_before(at(before))) == show(at(expected))


@pytest.mark.parametrize(
    ("expression", "complaint"),
    [
        ("* * * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("60 * * * *", "outside 0-59"),
        ("* 24 * * *", "outside 0-23"),
        ("* * 0 * *", "outside 1-31"),
        ("* * * 13 *", "outside 1-12"),
        ("* * * * 8", "outside 0-7"),
        ("5-1 * * * *", "runs backwards"),
        ("*/0 * * * *", "at least 1"),
        ("a * * * *", "not a valid minute"),
        ("1,,2 * * * *", "not a valid minute"),
        ("* * * foo *", "not a valid month"),
        ("*/x * * * *", "not a valid minute"),
        ("0 0 30 2 *", "no tick"),  # parses, but never runs
        ("", "5 fields"),
    ],
)
def test_bad_expressions_say_what_is_wrong(expression: str, complaint: str) -> None:
    with pytest.raises(CronError, match=complaint):
        cron.parse(expression)


def test_a_cron_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        cron.parse("nonsense")


# -- against a reference: every minute, checked one by one -------------------------

_LIMITS = {"minute": (0, 59), "hour": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (0, 7)}


def _allows(text: str, value: int, low: int, high: int) -> bool:
    """Whether a cron field allows ``value``: a predicate, unlike the parser's sets."""
    for part in text.split(","):
        span, slash, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = (int(n) for n in span.split("-"))
        else:
            first = int(span)
            last = high if slash else first
        if first <= value <= last and (value - first) % int(step or 1) == 0:
            return True
    return False


def _day_matches(fields: list[str], day: date) -> bool:
    weekday = day.isoweekday() % 7
    by_date = _allows(fields[2], day.day, 1, 31)
    by_weekday = _allows(fields[4], weekday, 0, 7) or (weekday == 0 and _allows(fields[4], 7, 0, 7))
    if not _allows(fields[3], day.month, 1, 12):
        return False
    if fields[2].startswith("*") or fields[4].startswith("*"):
        return by_date and by_weekday
    return by_date or by_weekday


def _reference_next(fields: list[str], t: float) -> float:
    moment = datetime.fromtimestamp(t // 60 * 60, UTC) + timedelta(minutes=1)
    for _ in range(3000 * 1440):
        if not _day_matches(fields, moment.date()):
            moment = datetime.combine(moment.date() + timedelta(days=1), moment.time().min, UTC)
            continue
        if _allows(fields[1], moment.hour, 0, 23) and _allows(fields[0], moment.minute, 0, 59):
            return moment.timestamp()
        moment += timedelta(minutes=1)
    raise AssertionError("no tick found")


def _field(name: str) -> st.SearchStrategy[str]:
    low, high = _LIMITS[name]
    value = st.integers(low, high)
    single = st.one_of(
        st.just("*"),
        st.builds(lambda n: f"*/{n}", st.integers(1, high)),
        value.map(str),
        st.tuples(value, value).map(lambda p: f"{min(p)}-{max(p)}"),
        st.tuples(value, value, st.integers(1, 12)).map(
            lambda p: f"{min(p[:2])}-{max(p[:2])}/{p[2]}"
        ),
    )
    return st.lists(single, min_size=1, max_size=3).map(",".join)


expressions = st.tuples(*(_field(name) for name in _LIMITS)).map(" ".join)
moments = st.floats(at("2000-01-01 00:00"), at("2090-01-01 00:00"))


@settings(max_examples=examples(300), deadline=None)
@given(expressions, moments)
def test_next_and_previous_agree_with_a_minute_by_minute_reference(
    expression: str, t: float
) -> None:
    try:
        parsed = cron.parse(expression)
    except CronError:
        assume(False)  # a combination that never runs, such as 31 February
        raise
    fields = expression.split()
    expected = _reference_next(fields, t)
    assert parsed.next_after(t) == expected, show(expected)
    before = parsed.previous_before(t)
    assert before < t and _reference_next(fields, before - 1) == before
    assert _reference_next(fields, before) >= t  # nothing between it and t


# -- in a time zone ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "timezone", "after", "expected"),
    [
        ("0 9 * * *", "Europe/Paris", "2026-11-24 10:00", "2026-11-25 08:00"),  # CET, +1
        ("0 9 * * *", "Europe/Paris", "2026-06-01 10:00", "2026-06-02 07:00"),  # CEST, +2
        ("0 9 * * mon", "America/New_York", "2026-11-24 00:00", "2026-11-30 14:00"),
        ("30 8 * * *", "Asia/Kolkata", "2026-11-24 00:00", "2026-11-24 03:00"),  # +5:30
        # The change to summer time (Paris, 29 March 2026, 01:00 UTC: 02:00 -> 03:00): a
        # skipped time runs once, at the change; the day after, at its own time again.
        ("30 2 * * *", "Europe/Paris", "2026-03-28 12:00", "2026-03-29 01:00"),
        ("30 2 * * *", "Europe/Paris", "2026-03-29 01:00", "2026-03-30 00:30"),
        ("*/30 * * * *", "Europe/Paris", "2026-03-29 00:30", "2026-03-29 01:00"),
        ("*/30 * * * *", "Europe/Paris", "2026-03-29 01:00", "2026-03-29 01:30"),
        # The change back (25 October 2026, 01:00 UTC: 03:00 -> 02:00): a repeated
        # time runs once, the first time; the repeated half hour runs nothing again.
        ("30 2 * * *", "Europe/Paris", "2026-10-24 12:00", "2026-10-25 00:30"),
        ("30 2 * * *", "Europe/Paris", "2026-10-25 00:30", "2026-10-26 01:30"),
        ("*/30 * * * *", "Europe/Paris", "2026-10-25 00:30", "2026-10-25 02:00"),
        # A half-hour change back (Lord Howe Island, 4 April 2026, 15:00 UTC: 02:00
        # at +11 -> 01:30 at +10:30): 01:45 runs at its first reading only.
        ("45 1 * * *", "Australia/Lord_Howe", "2026-04-04 12:00", "2026-04-04 14:45"),
        ("45 1 * * *", "Australia/Lord_Howe", "2026-04-04 14:45", "2026-04-05 15:15"),
        # Samoa skipped 30 December 2011 whole: its noon ran at the change, midnight.
        ("0 12 * * *", "Pacific/Apia", "2011-12-29 22:00", "2011-12-30 10:00"),
        ("0 12 * * *", "Pacific/Apia", "2011-12-30 10:00", "2011-12-30 22:00"),
    ],
)
def test_ticks_in_a_time_zone(expression: str, timezone: str, after: str, expected: str) -> None:
    parsed = cron.parse(expression, timezone)
    assert show(parsed.next_after(at(after))) == show(at(expected))
    assert show(parsed.previous_before(at(expected) + 1)) == show(at(expected))


def test_a_skipped_time_runs_at_a_change_that_is_not_on_a_whole_minute() -> None:
    # Monrovia, 7 January 1972: from -0:44:30 to UTC, the clock went from 00:00 to 00:44:30.
    parsed = cron.parse("30 0 7 1 *", "Africa/Monrovia")
    change = at("1972-01-07 00:44:30")
    assert parsed.next_after(at("1972-01-06 00:00")) == change
    assert parsed.previous_before(change + 1) == change


def test_a_time_zone_is_an_iana_name() -> None:
    for bad in ("Mars/Olympus", "", "../etc/passwd", 5):
        with pytest.raises(CronError, match="time zone"):
            cron.parse("* * * * *", bad)  # type: ignore[arg-type]
    assert cron.parse("* * * * *", "UTC").timezone == "UTC"
    assert cron.parse("* * * * *").timezone is None


_ZONES = ("Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Pacific/Chatham",
          "America/Santiago", "Asia/Kolkata")  # fmt: skip


@functools.cache
def _changes(timezone: str) -> list[float]:
    """The moments in 2026 when the zone's clock changes its offset (to the hour)."""
    zone = ZoneInfo(timezone)
    start = at("2026-01-01 00:00")
    offsets = [datetime.fromtimestamp(start + h * 3600, zone).utcoffset() for h in range(8760)]
    found = [start + h * 3600 for h in range(1, 8760) if offsets[h] != offsets[h - 1]]
    return found or [start]


def _wall_matches(fields: list[str], wall: datetime) -> bool:
    return (
        _day_matches(fields, wall.date())
        and _allows(fields[1], wall.hour, 0, 23)
        and _allows(fields[0], wall.minute, 0, 59)
    )


def _reference_next_in(timezone: str, fields: list[str], t: float) -> float:
    """Minute by minute in UTC: a minute ticks if the zone's clock, read for the first
    time, matches there, or jumped there over a matching time."""
    zone = ZoneInfo(timezone)
    moment = (t // 60 + 1) * 60
    previous = datetime.fromtimestamp(moment - 60, zone).replace(tzinfo=None, fold=0)
    for _ in range(3 * 1440):
        reading = datetime.fromtimestamp(moment, zone)
        wall = reading.replace(tzinfo=None, fold=0)
        if reading.fold == 0:  # not the second reading of a repeated time
            skipped = previous + timedelta(minutes=1)
            while skipped < wall and not _wall_matches(fields, skipped):
                skipped += timedelta(minutes=1)
            if skipped < wall or _wall_matches(fields, wall):
                return moment
        previous = wall
        moment += 60
    raise AssertionError("no tick found")


daily = st.tuples(_field("minute"), _field("hour")).map(lambda f: f"{f[0]} {f[1]} * * *")


@settings(max_examples=examples(300), deadline=None)
@given(daily, st.sampled_from(_ZONES), st.data())
def test_zone_ticks_agree_with_a_minute_by_minute_reference(
    expression: str, timezone: str, data: st.DataObject
) -> None:
    change = data.draw(st.sampled_from(_changes(timezone)))
    t = data.draw(st.floats(change - 36 * 3600, change + 36 * 3600))
    parsed = cron.parse(expression, timezone)
    fields = expression.split()
    expected = _reference_next_in(timezone, fields, t)
    assert parsed.next_after(t) == expected, show(expected)
    before = parsed.previous_before(t)
    assert before < t and _reference_next_in(timezone, fields, before - 1) == before
    assert _reference_next_in(timezone, fields, before) >= t  # nothing between it and t
