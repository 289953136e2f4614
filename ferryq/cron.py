"""Five-field cron expressions, in UTC: parse them and find the ticks around a time.

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

Pure functions, no I/O. Ticks are Unix seconds on whole minutes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

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
#: How far to look for the next or previous tick: covers a 29 February, a leap year
#: skipped at a century included.
_HORIZON_DAYS = 366 * 9


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

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = day.isoweekday() % 7 in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday  # Vixie cron: either restricted field may match

    def next_after(self, t: float) -> float:
        """The first tick strictly after ``t``."""
        start = _minute_floor(t) + timedelta(minutes=1)
        day = start.date()
        for _ in range(_HORIZON_DAYS):
            if self.matches_day(day):
                floor = (start.hour, start.minute) if day == start.date() else (0, 0)
                found = _first_at_or_after(self.hours, self.minutes, floor)
                if found is not None:
                    return _at(day, *found)
            day += timedelta(days=1)
        raise CronError(f"{self.expression!r} has no tick after {_iso(t)}")

    def previous_before(self, t: float) -> float:
        """The last tick strictly before ``t``."""
        floor = _minute_floor(t)
        end = floor - timedelta(minutes=1) if floor.timestamp() == t else floor
        day = end.date()
        for _ in range(_HORIZON_DAYS):
            if self.matches_day(day):
                ceiling = (end.hour, end.minute) if day == end.date() else (23, 59)
                found = _last_at_or_before(self.hours, self.minutes, ceiling)
                if found is not None:
                    return _at(day, *found)
            day -= timedelta(days=1)
        raise CronError(f"{self.expression!r} has no tick before {_iso(t)}")


def parse(expression: str) -> Cron:
    """Parse a cron expression; :class:`CronError` (a ValueError) says what is wrong."""
    if not isinstance(expression, str):
        raise CronError(f"a cron expression is a string (got {expression!r})")
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


def _minute_floor(t: float) -> datetime:
    return datetime.fromtimestamp(t // 60 * 60, UTC)


def _at(day: date, hour: int, minute: int) -> float:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC).timestamp()


def _first_at_or_after(
    hours: tuple[int, ...], minutes: tuple[int, ...], floor: tuple[int, int]
) -> tuple[int, int] | None:
    for hour in hours:
        if hour < floor[0]:
            continue
        for minute in minutes:
            if (hour, minute) >= floor:
                return hour, minute
    return None


def _last_at_or_before(
    hours: tuple[int, ...], minutes: tuple[int, ...], ceiling: tuple[int, int]
) -> tuple[int, int] | None:
    for hour in reversed(hours):
        if hour > ceiling[0]:
            continue
        for minute in reversed(minutes):
            if (hour, minute) <= ceiling:
                return hour, minute
    return None


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")
