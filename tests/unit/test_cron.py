"""Cron schedules: the field syntax, errors that name the field, matching, and the previous and next due minute."""

from __future__ import annotations

from datetime import datetime

import pytest

from services.deacon.automations.cron import CronError, matches, next_due, parse, previous_due


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


class TestParse:
    def test_stars_numbers_lists_ranges_and_steps(self) -> None:
        s = parse("*/15 9-17 1,15 */3 1-5")
        assert s.minutes == {0, 15, 30, 45}
        assert s.hours == set(range(9, 18))
        assert s.days == {1, 15}
        assert s.months == {1, 4, 7, 10}
        assert s.weekdays == {1, 2, 3, 4, 5}

    def test_a_range_with_a_step_and_a_start_with_a_step(self) -> None:
        assert parse("10-30/10 * * * *").minutes == {10, 20, 30}
        assert parse("50/5 * * * *").minutes == {50, 55}

    def test_sunday_is_0_and_7(self) -> None:
        assert parse("0 0 * * 7").weekdays == {0}
        assert parse("0 0 * * 0,7").weekdays == {0}

    def test_extra_spaces_are_fine_and_the_text_is_normalised(self) -> None:
        assert parse("  0   3 * *  * ").text == "0 3 * * *"

    @pytest.mark.parametrize(
        ("text", "words"),
        [
            ("* * * *", "5 fields"),
            ("* * * * * *", "5 fields"),
            ("60 * * * *", "minute: value 60 is out of range 0-59"),
            ("* 24 * * *", "hour: value 24 is out of range 0-23"),
            ("* * 0 * *", "day-of-month: value 0 is out of range 1-31"),
            ("* * * 13 *", "month: value 13 is out of range 1-12"),
            ("* * * * 8", "day-of-week: value 8 is out of range 0-7"),
            ("* * * JAN *", "month: 'JAN' is not a number"),
            ("5-1 * * * *", "minute: range '5-1' runs backwards"),
            ("*/0 * * * *", "minute: step 0 is out of range"),
            ("1,,2 * * * *", "minute: empty entry"),
            ("0 0 30 2 *", "never occurs"),
        ],
    )
    def test_a_bad_schedule_names_the_field(self, text: str, words: str) -> None:
        with pytest.raises(CronError, match=words.replace("(", r"\(")):
            parse(text)

    def test_the_last_day_of_some_months_is_fine(self) -> None:
        assert parse("0 0 31 1,2 *").days == {31}
        assert parse("0 0 29 2 *").months == {2}


class TestMatches:
    def test_every_field_must_match(self) -> None:
        s = parse("30 9 * * 1-5")
        assert matches(s, at("2026-05-04T09:30:59"))  # a Monday; seconds are ignored
        assert not matches(s, at("2026-05-04T09:31:00"))
        assert not matches(s, at("2026-05-03T09:30:00"))  # a Sunday

    def test_both_day_fields_restricted_means_either(self) -> None:
        s = parse("0 0 1 * 1")  # the 1st of the month, or any Monday
        assert matches(s, at("2026-05-01T00:00"))  # Friday the 1st
        assert matches(s, at("2026-05-04T00:00"))  # Monday the 4th
        assert not matches(s, at("2026-05-05T00:00"))

    def test_a_step_in_a_day_field_restricts_it_too(self) -> None:
        # Vixie's rule as documented: "*/10" is a restriction, so the day fields are ORed (Debian cron, and cronsim
        # given the text as written, would AND them because the field starts with "*").
        s = parse("0 0 */10 * 1")  # the 1st, 11th, 21st and 31st, or any Monday
        assert s.expression == "0 0 1,11,21,31 * 1"
        assert matches(s, at("2026-05-04T00:00"))  # Monday the 4th
        assert matches(s, at("2026-05-21T00:00"))  # Thursday the 21st
        assert not matches(s, at("2026-05-05T00:00"))
        assert next_due(s, at("2026-05-01T00:00")) == at("2026-05-04T00:00")

    def test_one_day_field_restricted_means_that_one(self) -> None:
        assert not matches(parse("0 0 1 * *"), at("2026-05-04T00:00"))
        assert not matches(parse("0 0 * * 1"), at("2026-05-01T00:00"))


class TestPreviousAndNext:
    def test_next_is_strictly_after_the_current_minute(self) -> None:
        s = parse("0 * * * *")
        assert next_due(s, at("2026-05-01T10:00:30")) == at("2026-05-01T11:00")
        assert next_due(s, at("2026-05-01T10:59:59")) == at("2026-05-01T11:00")

    def test_previous_includes_the_current_minute(self) -> None:
        s = parse("0 * * * *")
        assert previous_due(s, at("2026-05-01T10:00:30")) == at("2026-05-01T10:00")
        assert previous_due(s, at("2026-05-01T10:59:59")) == at("2026-05-01T10:00")

    def test_they_cross_days_months_and_years(self) -> None:
        s = parse("15 3 1 1 *")
        assert next_due(s, at("2026-05-01T00:00")) == at("2027-01-01T03:15")
        assert previous_due(s, at("2026-05-01T00:00")) == at("2026-01-01T03:15")

    def test_leap_days_are_found_years_away(self) -> None:
        s = parse("0 12 29 2 *")
        assert next_due(s, at("2025-03-01T00:00")) == at("2028-02-29T12:00")
        assert previous_due(s, at("2027-06-01T00:00")) == at("2024-02-29T12:00")

    def test_weekday_schedules(self) -> None:
        s = parse("0 9 * * 1-5")
        assert next_due(s, at("2026-05-01T09:00")) == at("2026-05-04T09:00")  # Friday -> Monday
        assert previous_due(s, at("2026-05-03T23:00")) == at("2026-05-01T09:00")  # Sunday -> Friday

    def test_the_timezone_of_the_input_is_kept(self) -> None:
        when = datetime.fromisoformat("2026-05-01T10:20:00+02:00")
        found = next_due(parse("30 * * * *"), when)
        assert found == datetime.fromisoformat("2026-05-01T10:30:00+02:00")
        assert found is not None
        assert found.tzinfo == when.tzinfo
