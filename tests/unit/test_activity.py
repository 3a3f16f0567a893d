"""The active/standby rules: when a standby takes a scope's key over, and when a holder must have stopped."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.model import activity
from shared.model.activity import Holder, Seen, Take, Timing, Wait
from shared.service.entrypoint import _active_ttl

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TTL = 6.0


def holder(instance: str = "100-aaaaaa", *, ttl_s: float = TTL, released: bool = False) -> Holder:
    return Holder(
        identity="witness",
        instance=instance,
        host="h1",
        pid=100,
        pid_started=1.5,
        machine="boot/pid:[1]",
        ttl_s=ttl_s,
        since=T0,
        renewed_at=T0,
        released=released,
    )


def decide(seen: Seen | None, now: float, *, gone: bool = False, me: str = "200-bbbbbb") -> Take | Wait:
    return activity.decide(seen, now, me=me, holder_gone=gone, own_ttl_s=TTL)


def test_an_absent_key_is_created() -> None:
    assert activity.observe(None, None, 0, now=5.0) is None
    assert decide(None, 5.0) == Take(revision=0, why="nobody holds it")


def test_a_renewed_key_is_never_taken() -> None:
    seen = activity.observe(None, holder(), 7, now=100.0)
    assert isinstance(decide(seen, 100.0 + TTL - 0.01), Wait)
    # A renewal is a new revision: the wait starts over from when it is seen.
    renewed = activity.observe(seen, holder(), 8, now=100.0 + TTL - 0.01)
    assert renewed is not None
    assert renewed.since == 100.0 + TTL - 0.01
    assert decide(renewed, 100.0 + TTL + 1) == Wait(until=100.0 + 2 * TTL - 0.01)


def test_a_key_unchanged_for_its_holders_whole_ttl_is_taken_with_that_revision() -> None:
    seen = activity.observe(None, holder(ttl_s=3.0), 7, now=100.0)
    assert decide(seen, 102.99) == Wait(until=103.0)
    again = activity.observe(seen, holder(ttl_s=3.0), 7, now=103.0)
    assert again is seen, "the same revision keeps the moment it was first seen"
    taken = decide(again, 103.0)
    assert isinstance(taken, Take)
    assert taken.revision == 7  # compare-and-set: a renewal landing meanwhile makes the take fail
    assert "not renewed" in taken.why


def test_the_holders_ttl_counts_not_the_standbys() -> None:
    seen = activity.observe(None, holder(ttl_s=20.0), 3, now=0.0)
    assert isinstance(decide(seen, TTL + 1), Wait)
    assert isinstance(decide(seen, 20.0), Take)


def test_an_unreadable_value_is_judged_by_the_standbys_own_ttl() -> None:
    seen = activity.observe(None, None, 3, now=0.0)
    assert decide(seen, TTL - 0.1) == Wait(until=TTL)
    assert isinstance(decide(seen, TTL), Take)


def test_a_released_key_is_taken_after_the_margin_only() -> None:
    seen = activity.observe(None, holder(released=True), 9, now=50.0)
    margin = TTL * (1 - activity.STOP_FRACTION)
    assert decide(seen, 50.0 + margin - 0.01) == Wait(until=50.0 + margin)
    taken = decide(seen, 50.0 + margin)
    assert isinstance(taken, Take)
    assert "released" in taken.why


def test_a_holder_seen_dead_on_this_machine_is_taken_over_at_once() -> None:
    seen = activity.observe(None, holder(), 9, now=50.0)
    taken = decide(seen, 50.0, gone=True)
    assert taken == Take(revision=9, why="its holder 100-aaaaaa is not running")


def test_our_own_write_whose_reply_was_lost_is_renewed() -> None:
    seen = activity.observe(None, holder("200-bbbbbb"), 4, now=1.0)
    assert decide(seen, 1.0) == Take(revision=4, why="it is ours")


@pytest.mark.parametrize("ttl", [0.5, 3.0, 6.0, 30.0])
def test_the_holder_stops_a_third_of_a_ttl_before_any_standby_can_take_over(ttl: float) -> None:
    timing = Timing(ttl_s=ttl)
    sent = 10.0
    # The standby saw the revision no earlier than it was sent, and waits a whole TTL from then.
    earliest_takeover = sent + ttl
    stop = activity.deadline(sent, timing)
    assert earliest_takeover - stop == pytest.approx(ttl / 3)
    # Renewals come often enough that one lost renewal (and then retries) fits before the deadline.
    assert timing.renew_every * 2 <= timing.stop_after
    assert timing.retry_every < timing.renew_every
    assert 0 < timing.poll_every <= activity.MAX_POLL_S


def test_a_holder_round_trips_and_garbage_decodes_to_none() -> None:
    value = holder(released=True)
    assert activity.decode(activity.encode(value)) == value
    assert activity.decode(b"not json") is None
    assert activity.decode(b'{"identity": "witness"}') is None
    assert activity.decode(None) is None


def test_gt_active_ttl_is_read_per_service_and_checked() -> None:
    assert _active_ttl(None, {}, "mayor") == 6.0
    assert _active_ttl(None, {"GT_ACTIVE_TTL": "3"}, "mayor") == 3.0
    assert _active_ttl(None, {"GT_ACTIVE_TTL": "3", "WITNESS_GT_ACTIVE_TTL": "9"}, "witness") == 9.0
    assert _active_ttl(2.5, {"GT_ACTIVE_TTL": "3"}, "mayor") == 2.5
    with pytest.raises(ValueError, match="GT_ACTIVE_TTL"):
        _active_ttl(None, {"GT_ACTIVE_TTL": "0.1"}, "mayor")
    with pytest.raises(ValueError, match="--active-ttl"):
        _active_ttl(0.1, {}, "mayor")
