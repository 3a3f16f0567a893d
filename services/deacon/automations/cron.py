"""Five-field cron schedules: parse, match a minute, find the previous and the next matching minute. Pure.

Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12), day of week (0-7, 0 and 7 are Sunday).
Each field is ``*``, a number, a range ``a-b``, a step ``*/n`` or ``a-b/n``, or a comma list of those. As in
Vixie cron, when both day fields are restricted a day matches if either does. Times are wall-clock times of
whatever zone the caller's datetimes are in; seconds are ignored.
"""

from __future__ import annotations

import calendar
from datetime import date, datetime, timedelta

import msgspec

from shared.errors import GastownError

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 7))
SEARCH_DAYS = 4 * 366 + 1
"""How far the previous/next searches look: every restricted day pattern recurs within four years (29 February)."""


class CronError(GastownError, ValueError):
    """A schedule that cannot be used; the message names the field."""


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 = Sunday ... 6 = Saturday (a 7 in the text is folded into 0)."""
    days_restricted: bool
    weekdays_restricted: bool


def parse(text: str) -> Schedule:
    """Raises CronError naming the field that is wrong."""
    parts = text.split()
    if len(parts) != len(FIELDS):
        raise CronError(
            f"a schedule has 5 fields (minute hour day-of-month month day-of-week), got {len(parts)} in {text!r}"
        )
    values = [_field(part, name, low, high) for part, (name, low, high) in zip(parts, FIELDS, strict=True)]
    weekdays = frozenset(d % 7 for d in values[4])
    schedule = Schedule(
        text=" ".join(parts),
        minutes=values[0],
        hours=values[1],
        days=values[2],
        months=values[3],
        weekdays=weekdays,
        days_restricted=parts[2] != "*",
        weekdays_restricted=parts[4] != "*",
    )
    if schedule.days_restricted and not schedule.weekdays_restricted:
        longest = max(_days_in_month(2000, m) for m in schedule.months)  # 2000 is a leap year
        if min(schedule.days) > longest:
            raise CronError(f"day-of-month {parts[2]!r} never occurs in month {parts[3]!r}: the schedule never fires")
    return schedule


def _field(part: str, name: str, low: int, high: int) -> frozenset[int]:
    out: set[int] = set()
    for item in part.split(","):
        if not item:
            raise CronError(f"{name}: empty entry in {part!r}")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            step = _number(step_text, name, 1, high - low + 1, what="step")
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _number(a, name, low, high), _number(b, name, low, high)
            if first > last:
                raise CronError(f"{name}: range {base!r} runs backwards")
        else:
            first = _number(base, name, low, high)
            last = high if slash else first  # "5/15" means from 5 to the end, every 15
        out.update(range(first, last + 1, step))
    return frozenset(out)


def _number(text: str, name: str, low: int, high: int, *, what: str = "value") -> int:
    if not text.isdigit():
        raise CronError(
            f"{name}: {text!r} is not a number (use *, numbers, a-b, */n or lists; names are not supported)"
        )
    value = int(text)
    if not low <= value <= high:
        raise CronError(f"{name}: {what} {value} is out of range {low}-{high}")
    return value


def _days_in_month(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


def _day_matches(schedule: Schedule, day: date) -> bool:
    if day.month not in schedule.months:
        return False
    in_days = day.day in schedule.days
    in_weekdays = (day.isoweekday() % 7) in schedule.weekdays
    if schedule.days_restricted and schedule.weekdays_restricted:
        return in_days or in_weekdays
    return in_days and in_weekdays


def matches(schedule: Schedule, when: datetime) -> bool:
    """True when the minute ``when`` falls in is one the schedule names."""
    return when.minute in schedule.minutes and when.hour in schedule.hours and _day_matches(schedule, when.date())


def previous_due(schedule: Schedule, at: datetime) -> datetime | None:
    """The latest matching minute at or before ``at`` (seconds dropped), or None within the search window."""
    day = at.date()
    for offset in range(SEARCH_DAYS):
        current = day - timedelta(days=offset)
        if not _day_matches(schedule, current):
            continue
        for hour in sorted(schedule.hours, reverse=True):
            if offset == 0 and hour > at.hour:
                continue
            for minute in sorted(schedule.minutes, reverse=True):
                if offset == 0 and hour == at.hour and minute > at.minute:
                    continue
                return datetime.combine(current, datetime.min.time(), at.tzinfo).replace(hour=hour, minute=minute)
    return None


def next_due(schedule: Schedule, after: datetime) -> datetime | None:
    """The first matching minute strictly after the minute ``after`` falls in, or None within the search window."""
    day = after.date()
    for offset in range(SEARCH_DAYS):
        current = day + timedelta(days=offset)
        if not _day_matches(schedule, current):
            continue
        for hour in sorted(schedule.hours):
            if offset == 0 and hour < after.hour:
                continue
            for minute in sorted(schedule.minutes):
                if offset == 0 and hour == after.hour and minute <= after.minute:
                    continue
                return datetime.combine(current, datetime.min.time(), after.tzinfo).replace(hour=hour, minute=minute)
    return None
