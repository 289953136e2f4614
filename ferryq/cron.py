"""Five-field cron expressions, in UTC or a time zone: parse them and find the ticks
around a time.

``minute hour day-of-month month day-of-week``, each ``*``, a number, a range
``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (from a to the field's end), or a
comma-separated list of those. Months
and weekdays may be named (``jan``, ``mon``); Sunday is 0 or 7. ``@hourly``,
``@daily`` (``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly``
(``@annually``) stand for their usual expressions.

Day of month and day of week combine as in Vixie cron: when both fields are
restricted (neither starts with ``*``), a day matches if either matches; otherwise
both must (so ``0 0 13 * 5`` runs on every 13th and every Friday, while
``0 0 */2 * 1`` runs on odd days that are Mondays).

In a time zone (``parse(expression, "Europe/Paris")``) the fields are read on the
zone's wall clock, and each wall time that matches runs once across daylight-saving
changes: a time the change to summer time skips runs at the change (``30 2 * * *``
runs at 03:00 that day; every skipped tick of ``*/10 * * * *`` becomes that one), a
time the change back repeats runs the first time only. (cronie does the same for
jobs at fixed times, but runs frequent jobs by the clock through both changes.)

Pure functions, no I/O (but the zone's rules, read once). Ticks are Unix seconds on
whole minutes (but for the rare change of an old offset of odd seconds).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
#: (name, lowest, highest, names) of the five fields, in order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, {name: i + 1 for i, name in enumerate(_MONTHS)}),
    ("day of week", 0, 7, {name: i for i, name in enumerate(_DAYS)}),
)
#: How far to look for the next or previous tick: covers a 29 February that is a
#: given weekday (``0 0 29 2 */7``: up to 40 years apart, a century's skipped leap year
#: included).
_HORIZON_DAYS = 366 * 41
_MINUTE = timedelta(minutes=1)
#: How long after a change back the clock may still read times it read before: the
#: longest change back on record is well under a day.
_REPEATS_WITHIN = timedelta(days=1)


class CronError(ValueError):
    """A cron expression that cannot be parsed, or that never matches."""


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the values each field allows."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]  # of the month, 1-31
    months: frozenset[int]  # 1-12
    weekdays: frozenset[int]  # 0-6, Sunday 0
    any_day: bool  # the day-of-month field starts with '*'
    any_weekday: bool  # the day-of-week field starts with '*'
    zone: tzinfo = UTC  # whose wall clock the fields read

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = day.isoweekday() % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday  # Vixie cron: either restricted field may match

    @property
    def timezone(self) -> str | None:
        """The zone's name, None for UTC."""
        return self.zone.key if isinstance(self.zone, ZoneInfo) else None

    def next_after(self, t: float) -> float:
        """The first tick strictly after ``t``."""
        # Every wall time before the clock's reading at t falls at or before t (a
        # skipped one at a change before t, a repeated one at its first reading); the
        # first later one falling after t is it.
        start = _minute_floor(t + self._offset(t)).replace(tzinfo=None) - _MINUTE
        for wall in self._walls_from(start):
            if (tick := self._instant(wall)) > t:
                return tick
        raise CronError(f"{self.expression!r} has no tick after {_iso(t)}")

    def previous_before(self, t: float) -> float:
        """The last tick strictly before ``t``."""
        # The same, backwards, from the latest time the clock read up to t: just after
        # a change back it reads times again that it read later before.
        offset = max(self._offset(t), self._offset(t - _REPEATS_WITHIN.total_seconds()))
        end = _minute_floor(t + offset).replace(tzinfo=None) + _MINUTE
        for wall in self._walls_back(end):
            if (tick := self._instant(wall)) < t:
                return tick
        raise CronError(f"{self.expression!r} has no tick before {_iso(t)}")

    def _walls_from(self, start: datetime) -> Iterator[datetime]:
        """The wall times (naive) the fields match, from ``start`` on, in order."""
        day, floor = start.date(), (start.hour, start.minute)
        for _ in range(_HORIZON_DAYS):
            if self.matches_day(day):
                for hour in self.hours:
                    if hour < floor[0]:
                        continue
                    for minute in self.minutes:
                        if (hour, minute) >= floor:
                            yield datetime(day.year, day.month, day.day, hour, minute)
            day, floor = day + timedelta(days=1), (0, 0)

    def _walls_back(self, end: datetime) -> Iterator[datetime]:
        """The wall times (naive) the fields match, from ``end`` back, in reverse order."""
        day, ceiling = end.date(), (end.hour, end.minute)
        for _ in range(_HORIZON_DAYS):
            if self.matches_day(day):
                for hour in reversed(self.hours):
                    if hour > ceiling[0]:
                        continue
                    for minute in reversed(self.minutes):
                        if (hour, minute) <= ceiling:
                            yield datetime(day.year, day.month, day.day, hour, minute)
            day, ceiling = day - timedelta(days=1), (23, 59)

    def _instant(self, wall: datetime) -> float:
        """When the zone's clock reads ``wall``: the first time if it reads it twice,
        the change itself if the change to summer time skips it. Never decreases as
        ``wall`` increases."""
        first = wall.replace(tzinfo=self.zone, fold=0).timestamp()
        if _wall_at(first, self.zone) == wall:
            return first
        # Skipped: the clock jumps over it between these two readings of it, made
        # at the offsets after and before the change; find the change's second (a
        # whole minute but for old offsets such as Monrovia's -0:44:30).
        before, after = wall.replace(tzinfo=self.zone, fold=1).timestamp(), first
        while after - before > 1:
            middle = float((before + after) // 2)
            if _wall_at(middle, self.zone) > wall:
                after = middle
            else:
                before = middle
        return after

    def _offset(self, t: float) -> float:
        """The zone's UTC offset at ``t``, in seconds."""
        return (datetime.fromtimestamp(t, self.zone).utcoffset() or timedelta(0)).total_seconds()


def parse(expression: str, timezone: str | None = None) -> Cron:
    """Parse a cron expression, read in UTC or in ``timezone`` (an IANA name such as
    ``Europe/Paris``); :class:`CronError` (a ValueError) says what is wrong."""
    if not isinstance(expression, str):
        raise CronError(f"a cron expression is a string (got {expression!r})")
    zone = UTC if timezone is None else _zone(timezone)
    text = MACROS.get(expression.strip().lower(), expression)
    fields = text.split()
    if len(fields) != 5:
        raise CronError(
            f"{expression!r}: a cron expression has 5 fields (minute hour day-of-month "
            f"month day-of-week), not {len(fields)}"
        )
    values = [_field(raw, *spec, expression) for raw, spec in zip(fields, _FIELDS, strict=True)]
    minutes, hours, days, months, weekdays = values
    cron = Cron(
        expression=expression,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(d % 7 for d in weekdays),
        any_day=fields[2].startswith("*"),
        any_weekday=fields[4].startswith("*"),
        zone=zone,
    )
    cron.next_after(0.0)  # "0 0 30 2 *" parses but never runs: say so now
    return cron


def _field(raw: str, name: str, low: int, high: int, names: dict[str, int], expr: str) -> set[int]:
    allowed: set[int] = set()
    for part in raw.lower().split(","):
        span, _, step_text = part.partition("/")
        step = _number(step_text, name, expr, None) if step_text else 1
        if step < 1:
            raise CronError(f"{expr!r}: the step in {name} field {raw!r} must be at least 1")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            start, _, end = span.partition("-")
            first, last = _number(start, name, expr, names), _number(end, name, expr, names)
        else:
            first = _number(span, name, expr, names)
            last = high if step_text else first  # "5/15" means 5-59/15
        if not low <= first <= last <= high:
            raise CronError(
                f"{expr!r}: {name} field {raw!r} is outside {low}-{high} or runs backwards"
            )
        allowed.update(range(first, last + 1, step))
    return allowed


def _number(text: str, name: str, expr: str, names: dict[str, int] | None) -> int:
    if names and text in names:
        return names[text]
    if not text.isdigit():
        raise CronError(f"{expr!r}: {text!r} is not a valid {name}")
    return int(text)


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name.strip():
        raise CronError(f"a time zone is a name such as 'Europe/Paris' (got {name!r})")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        message = f"unknown time zone {name!r} (an IANA name such as 'Europe/Paris')"
        raise CronError(message) from exc


def _minute_floor(t: float) -> datetime:
    return datetime.fromtimestamp(t // 60 * 60, UTC)


def _wall_at(t: float, zone: tzinfo) -> datetime:
    """What the zone's clock reads at ``t``, without the zone (naive)."""
    return datetime.fromtimestamp(t, zone).replace(tzinfo=None, fold=0)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
