"""The one lease record and its fold (shared/model/leases.py): every service keeps the leases it cares about as the
same record, moved by the same rules, and appends the same events to move them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.deacon.projection import new_projection as new_deacon_projection
from services.refinery.projection import new_projection as new_refinery_projection
from services.witness.projection import new_projection as new_witness_projection
from shared.core.ids import hook_lease_name, merge_lease_name
from shared.model.events import LeaseAcquired, LeaseExpired, LeaseReleased, decode_envelope
from shared.model.leases import Lease, Renewal, acquisition, due_to_expire, expiry, fold_lease, release
from tests.memory_log import MemoryLog

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
HOOK, MERGE, OTHER = hook_lease_name("demo-1"), merge_lease_name("demo"), "res-1"


def _acquired(lease: str, holder: str, token: int) -> LeaseAcquired:
    return LeaseAcquired(lease=lease, holder=holder, token=token, ttl_s=30.0, expires_at=T0)


def test_every_service_keeps_the_leases_it_cares_about_as_the_deacons_record() -> None:
    log = MemoryLog()
    log.record([_acquired(HOOK, "demo-1-1", 1), _acquired(MERGE, "refinery-a", 1), _acquired(OTHER, "x", 1)], ts=T0)
    log.record([LeaseExpired(lease=HOOK, holder="demo-1-1", token=1, last_renewed=T0)], ts=T0 + timedelta(seconds=40))
    log.record([_acquired(HOOK, "demo-1-2", 2)], ts=T0 + timedelta(seconds=50))
    log.record([LeaseReleased(lease=MERGE, holder="refinery-a", token=1)], ts=T0 + timedelta(seconds=60))
    deacon, witness, refinery = new_deacon_projection(), new_witness_projection(), new_refinery_projection()
    for projection in (deacon, witness, refinery):
        log.replay(projection)

    leases = deacon.state.leases.leases
    assert set(leases) == {HOOK, MERGE, OTHER}, "the deacon keeps every lease"
    assert witness.state.hooks == {HOOK: leases[HOOK]}, "the witness keeps hook leases"
    assert refinery.state.hooks == {HOOK: leases[HOOK]}
    assert refinery.state.merge_leases == {MERGE: leases[MERGE]}, "the refinery keeps merge leases too"
    assert (leases[HOOK].holder, leases[HOOK].token, leases[HOOK].status) == ("demo-1-2", 2, "held")
    assert (leases[MERGE].status, leases[MERGE].ended_at) == ("released", T0 + timedelta(seconds=60))


def test_only_the_current_held_token_ends_a_lease_and_every_event_moves_its_version() -> None:
    leases: dict[str, Lease] = {}
    log = MemoryLog()
    log.record([_acquired(OTHER, "a", 2)], ts=T0)
    log.record([LeaseReleased(lease=OTHER, holder="a", token=1)], ts=T0 + timedelta(seconds=1))
    log.record([LeaseExpired(lease=OTHER, holder="a", token=2, last_renewed=T0)], ts=T0 + timedelta(seconds=2))
    log.record([LeaseReleased(lease=OTHER, holder="a", token=2)], ts=T0 + timedelta(seconds=3))
    projection = new_deacon_projection()
    seen: list[tuple[str, int, int]] = []
    for seq, subject, data in log.messages:
        projection.apply(seq, subject, data)
        lease = projection.state.leases.leases[OTHER]
        seen.append((lease.status, lease.token, lease.version))
    assert seen == [("held", 2, 1), ("held", 2, 2), ("expired", 2, 3), ("expired", 2, 4)]
    assert projection.state.leases.leases[OTHER].ended_at == T0 + timedelta(seconds=2)
    # A release of a lease nobody here keeps changes nothing.
    fold_lease(LeaseReleased(lease="unknown", holder="a", token=1), leases, decode_envelope(log.messages[1][2]), 5)
    assert leases == {}


def test_the_events_that_move_a_lease_expect_its_last_event_and_count_its_tokens() -> None:
    first, token = acquisition(None, HOOK, "demo-1-1", 30.0, T0)
    assert (first.expected_seq, token) == (0, 1)
    expires = T0 + timedelta(seconds=30)
    assert first.payload == LeaseAcquired(lease=HOOK, holder="demo-1-1", token=1, ttl_s=30.0, expires_at=expires)
    lease = Lease(name=HOOK, holder="demo-1-1", token=1, ttl_s=30.0, acquired_at=T0, version=7)
    again, token = acquisition(lease, HOOK, "demo-1-2", 60.0, T0)
    assert (again.expected_seq, token, again.payload.aggregate_id()) == (7, 2, HOOK)
    given_back = release(lease)
    assert given_back.payload == LeaseReleased(lease=HOOK, holder="demo-1-1", token=1)
    assert given_back.expected_seq == 7
    renewal = Renewal(holder="demo-1-1", token=1, renewed_at=T0 + timedelta(seconds=20))
    ended = expiry(lease, renewal)
    assert ended.payload == LeaseExpired(lease=HOOK, holder="demo-1-1", token=1, last_renewed=renewal.renewed_at)
    assert ended.expected_seq == 7


def test_a_held_lease_is_due_to_expire_a_ttl_after_its_holders_newest_renewal_of_its_token() -> None:
    lease = Lease(name=HOOK, holder="demo-1-1", token=2, ttl_s=30.0, acquired_at=T0)
    later = T0 + timedelta(seconds=45)
    assert due_to_expire(lease, None, later)
    assert not due_to_expire(lease, None, T0 + timedelta(seconds=29))
    assert not due_to_expire(lease, Renewal(holder="demo-1-1", token=2, renewed_at=T0 + timedelta(seconds=20)), later)
    stale = Renewal(holder="demo-1-1", token=1, renewed_at=T0 + timedelta(seconds=40))
    assert due_to_expire(lease, stale, later), "a renewal of an older token does not keep the lease"
    marked = Renewal(holder="demo-1-1", token=2, renewed_at=later, expired=True)
    assert due_to_expire(lease, marked, later), "marked expired in the bucket: recorded next"
    assert lease.held_by("demo-1-1")
    assert lease.held_by("demo-1-1", 2)
    assert not lease.held_by("demo-1-1", 1)
    assert not lease.held_by("demo-1-2")
    lease.status = "released"
    assert not due_to_expire(lease, None, later)
    assert not lease.held_by("demo-1-1")
