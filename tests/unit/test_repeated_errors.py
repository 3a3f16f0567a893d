"""A connection's repeated client errors: nats-py reports each failed reconnect (four a second while the server
is gone); the log gets the first of an outage and then one line per quiet period, never one per error."""

from __future__ import annotations

from shared.bus.connection import RepeatedErrors


def test_an_outage_logs_its_first_error_then_one_line_per_quiet_period_with_the_count_left_out() -> None:
    repeats = RepeatedErrors(quiet_s=30.0)
    admitted = [(t / 4, repeats.admit("OSError", t / 4)) for t in range(4 * 80)]  # 80 s of four errors a second
    logged = [(t, left_out) for t, left_out in admitted if left_out is not None]
    assert logged == [(0.0, 0), (30.0, 119), (60.0, 119)]


def test_each_kind_of_error_is_logged_on_its_own() -> None:
    repeats = RepeatedErrors(quiet_s=30.0)
    assert repeats.admit("OSError", 0.0) == 0
    assert repeats.admit("SlowConsumerError", 1.0) == 0, "an error of another kind is not hidden by the outage"
    assert repeats.admit("OSError", 2.0) is None


def test_a_reconnect_ends_the_outage_and_says_how_many_were_left_out() -> None:
    repeats = RepeatedErrors(quiet_s=30.0)
    assert repeats.admit("OSError", 0.0) == 0
    assert repeats.admit("OSError", 0.25) is None
    assert repeats.admit("OSError", 0.5) is None
    assert repeats.reset() == 2
    assert repeats.admit("OSError", 1.0) == 0, "the next outage's first error is logged at once"
