"""Five-field cron schedules: parse (with errors that name the field), match a minute, find the previous and the next
matching minute. Pure.

Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12), day of week (0-7, 0 and 7 are Sunday).
Each field is ``*``, a number, a range ``a-b``, a step ``*/n`` or ``a-b/n``, or a comma list of those. As in
Vixie cron, when both day fields are restricted a day matches if either does. Times are wall-clock times of
whatever zone the caller's datetimes are in; seconds are ignored.

The search for due minutes is cronsim's (a maintained, typed, dependency-free evaluator: docs/architecture.md,
"Libraries"); this module keeps the syntax the project accepts (numbers only, no names, ``L`` or ``#``) and
the messages that name the wrong field, which cronsim reduces to "Bad minute".
"""

from __future__ import annotations

import calendar
from datetime import datetime

import msgspec
from cronsim import CronSim

from shared.core.errors import GastownError

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day-of-month", 1, 31), ("month", 1, 12), ("day-of-week", 0, 7))


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

    @property
    def expression(self) -> str:
        """The schedule as cronsim reads it: each field its numbers listed, a ``*`` kept as ``*``. Listing keeps
        this module's day rule: cronsim (like Debian cron) ANDs the day fields when either starts with ``*``,
        so ``*/2`` written in a day field would otherwise change which days match."""
        fields = (self.minutes, self.hours, self.days, self.months, self.weekdays)
        parts = self.text.split()
        return " ".join(
            "*" if part == "*" else ",".join(map(str, sorted(values)))
            for part, values in zip(parts, fields, strict=True)
        )


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


def matches(schedule: Schedule, when: datetime) -> bool:
    """True when the minute ``when`` falls in is one the schedule names."""
    return previous_due(schedule, when) == when.replace(second=0, microsecond=0)


def previous_due(schedule: Schedule, at: datetime) -> datetime | None:
    """The latest matching minute at or before ``at`` (seconds dropped), or None when none is found (cronsim
    looks 50 years back)."""
    # A microsecond makes cronsim start at HH:MM:59 itself (not a second before it): the current minute counts.
    search = CronSim(schedule.expression, at.replace(second=59, microsecond=1), reverse=True)
    return next(search, None)


def next_due(schedule: Schedule, after: datetime) -> datetime | None:
    """The first matching minute strictly after the minute ``after`` falls in, or None when none is found
    (cronsim looks 50 years ahead)."""
    return next(CronSim(schedule.expression, after.replace(second=0, microsecond=0)), None)
