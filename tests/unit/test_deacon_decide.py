"""The deacon's decisions (services/deacon/decide.py), pure: lease acquire and release on the one lease record,
the sweep, the dispatch and the ordering keys; and which stale hooks it hands over while a mover is down
(services/deacon/plan/hooks.py, ``to_hand_over``). Events go through the real encoder and fold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from services.deacon import decide as deacon_decide
from services.deacon.plan import hooks
from services.deacon.projection import new_projection
from services.deacon.state import DeaconState
from shared.core.errors import CommandError
from shared.core.ids import hook_lease_name
from shared.model.commands import AutomationRun, BeadClose, GcSweep, LeaseAcquire, LeaseRelease
from shared.model.decision import Accepted, DecideContext
from shared.model.events import (
    BeadClaimed,
    BeadCreated,
    BeadSlung,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    ServiceDown,
    ServiceUp,
)
from tests.memory_log import Fed

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


class Deacon(Fed[DeaconState]):
    def __init__(self) -> None:
        super().__init__(new_projection(), clock=T0)

    def decide(self, cmd: LeaseAcquire | LeaseRelease | GcSweep | BeadClose, at: datetime = T0) -> Accepted:
        ctx = DecideContext(now=at, command_id="c-1", actor="operator:ann", new_id=lambda prefix: f"{prefix}-1")
        return deacon_decide.decide(self.state, cmd, ctx, gc_ttl_s=600.0, holder="1-aaaaaa", grace_s=5.0)

    def store(self, accepted: Accepted, at: datetime = T0) -> None:
        self.add(*(new.payload for new in accepted.events), at=at)


def test_a_free_lease_is_acquired_with_the_next_token_and_its_holder_acquiring_again_changes_nothing() -> None:
    d = Deacon()
    first = d.decide(LeaseAcquire(lease="deploy", holder="ann", ttl_s=30.0))
    assert msgspec.to_builtins(first.result) == {
        "lease": "deploy",
        "holder": "ann",
        "token": 1,
        "ttl_s": 30.0,
        "changed": True,
    }
    assert [new.expected_seq for new in first.events] == [0]
    d.store(first)
    again = d.decide(LeaseAcquire(lease="deploy", holder="ann", ttl_s=30.0))
    assert (again.events, again.result.changed, again.result.token) == ([], False, 1)


def test_a_held_lease_is_refused_to_another_holder_and_taken_with_a_new_token_once_it_ended() -> None:
    d = Deacon()
    d.add(LeaseAcquired(lease="deploy", holder="ann", token=1, ttl_s=30.0, expires_at=T0))
    with pytest.raises(CommandError) as refused:
        d.decide(LeaseAcquire(lease="deploy", holder="bob", ttl_s=30.0))
    assert refused.value.code == "conflict"
    assert "held by ann (token 1)" in str(refused.value)
    d.add(LeaseExpired(lease="deploy", holder="ann", token=1, last_renewed=T0))
    taken = d.decide(LeaseAcquire(lease="deploy", holder="bob", ttl_s=30.0))
    assert (taken.result.holder, taken.result.token) == ("bob", 2)
    assert [new.expected_seq for new in taken.events] == [d.state.leases.leases["deploy"].version]


def test_a_release_is_fenced_by_holder_and_token_and_repeating_it_changes_nothing() -> None:
    d = Deacon()
    with pytest.raises(CommandError) as unknown:
        d.decide(LeaseRelease(lease="deploy", holder="ann", token=1))
    assert unknown.value.code == "not_found"
    d.add(LeaseAcquired(lease="deploy", holder="ann", token=2, ttl_s=30.0, expires_at=T0))
    for wrong in (
        LeaseRelease(lease="deploy", holder="ann", token=1),
        LeaseRelease(lease="deploy", holder="bob", token=2),
    ):
        with pytest.raises(CommandError) as fenced:
            d.decide(wrong)
        assert fenced.value.code == "conflict"
    released = d.decide(LeaseRelease(lease="deploy", holder="ann", token=2))
    assert msgspec.to_builtins(released.result) == {
        "lease": "deploy",
        "token": 2,
        "status": "released",
        "changed": True,
    }
    d.store(released)
    assert d.state.leases.leases["deploy"].status == "released"
    again = d.decide(LeaseRelease(lease="deploy", holder="ann", token=2))
    assert (again.events, again.result.changed) == ([], False)


def test_a_release_after_the_expiry_is_refused() -> None:
    d = Deacon()
    d.add(LeaseAcquired(lease="deploy", holder="ann", token=1, ttl_s=30.0, expires_at=T0))
    d.add(LeaseExpired(lease="deploy", holder="ann", token=1, last_renewed=T0))
    with pytest.raises(CommandError, match="expired before the release"):
        d.decide(LeaseRelease(lease="deploy", holder="ann", token=1))


def test_a_sweep_takes_the_commands_ttl_or_the_deacons_and_expects_the_last_sweep() -> None:
    d = Deacon()
    own = d.decide(GcSweep())
    assert msgspec.to_builtins(own.result) == {
        "id": "gc",
        "cutoff": (T0 - timedelta(seconds=600)).isoformat(),
        "ttl_s": 600.0,
        "changed": True,
    }
    d.store(own)
    chosen = d.decide(GcSweep(ttl_s=0.0), at=T0 + timedelta(hours=1))
    assert chosen.result.ttl_s == 0.0
    assert [new.expected_seq for new in chosen.events] == [d.state.gc.version]


def test_a_command_of_another_service_is_refused_and_commands_are_ordered_per_aggregate() -> None:
    with pytest.raises(CommandError) as refused:
        Deacon().decide(BeadClose(id="demo-1"))
    assert refused.value.code == "unknown_command"
    keys = [
        cmd.ordering_key()
        for cmd in (
            LeaseAcquire(lease="deploy", holder="ann", ttl_s=1.0),
            LeaseRelease(lease="deploy", holder="ann", token=1),
            AutomationRun(name="nightly"),
            GcSweep(),
        )
    ]
    assert keys == ["lease:deploy", "lease:deploy", "automation:nightly", "gc"]


def test_stale_hooks_wait_while_a_service_that_moves_beads_on_is_down() -> None:
    d = Deacon()
    lease = hook_lease_name("demo-1")
    d.add(BeadCreated(bead_id="demo-1", title="t"), BeadSlung(bead_id="demo-1", rig="demo"))
    d.add(BeadClaimed(bead_id="demo-1", assignee="a"))
    d.add(LeaseAcquired(lease=lease, holder="demo-1-1", token=1, ttl_s=30.0, expires_at=T0))
    d.add(LeaseReleased(lease=lease, holder="demo-1-1", token=1))
    later = T0 + timedelta(hours=1)

    def handed() -> list[tuple[str, int]]:
        owed = hooks.to_hand_over(d.state.hooks, d.state.leases, d.state.liveness, later, 60.0)
        return [(hook.bead, hook.token) for hook in owed]

    assert handed() == [("demo-1", 1)]
    d.add(ServiceDown(service="witness-east", reason="no heartbeat for 9.0 s"))
    assert handed() == []  # a witness of some rigs counts as the witness
    d.add(ServiceUp(service="witness-east", instance="1-a", pid=1))
    d.add(ServiceDown(service="refinery", reason="no heartbeat for 9.0 s"))
    assert handed() == []
    d.add(ServiceUp(service="refinery", instance="2-b", pid=2))
    assert handed() == [("demo-1", 1)]
