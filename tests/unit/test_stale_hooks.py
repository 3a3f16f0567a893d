"""Stale hooks, pure: which beads the deacon hands over (services/deacon/plan/hooks.py), and what the witness decides
for each (re-sling, escalate, or not stale after all)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.deacon.plan.hooks import StaleHook, stale
from services.deacon.projection import new_projection as new_deacon_projection
from services.deacon.state import DeaconState
from services.witness import decide as witness_decide
from services.witness.plan import Observed, Policy, plan
from services.witness.plan.actions import Escalate, Resling
from services.witness.projection import new_projection as new_witness_projection
from shared.core.errors import CommandError
from shared.core.ids import hook_lease_name
from shared.model.events import (
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadSlung,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    MergeRequestRejected,
    MergeRequestSubmitted,
    RigAdded,
    SessionCleaned,
    SessionEnded,
    SessionRequested,
    SessionStarted,
)
from tests.memory_log import Deciding, Fed

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
BEAD, SESSION = "demo-1", "demo-1-1"
LEASE = hook_lease_name(BEAD)
RECOVER = "gt.cmd.session.recover_hook"


# ---- the deacon: which hooks are stale ---------------------------------------------------------


class Deacon(Fed[DeaconState]):
    def __init__(self) -> None:
        super().__init__(new_deacon_projection(), clock=T0)

    def stale(self, now: datetime, after_s: float = 60.0) -> list[tuple[str, int]]:
        return [(h.bead, h.token) for h in stale(self.state.hooks, self.state.leases, now, after_s)]


def hooked_deacon() -> Deacon:
    d = Deacon()
    d.add(
        BeadCreated(bead_id=BEAD, title="t"),
        BeadSlung(bead_id=BEAD, rig="demo"),
        BeadClaimed(bead_id=BEAD, assignee="a"),
    )
    d.add(LeaseAcquired(lease=LEASE, holder=SESSION, token=1, ttl_s=30, expires_at=T0))
    return d


def test_a_held_hook_is_never_stale_and_a_lapsed_one_only_after_the_wait() -> None:
    d = hooked_deacon()
    assert d.stale(T0 + timedelta(hours=1)) == []
    d.add(LeaseExpired(lease=LEASE, holder=SESSION, token=1, last_renewed=T0), at=T0 + timedelta(seconds=40))
    assert d.stale(T0 + timedelta(seconds=99)) == [], "lapsed 59 s ago: the witness may still be at it"
    assert d.stale(T0 + timedelta(seconds=100)) == [(BEAD, 1)]
    d.add(LeaseAcquired(lease=LEASE, holder="demo-1-2", token=2, ttl_s=30, expires_at=T0))
    assert d.stale(T0 + timedelta(hours=1)) == [], "a fresh session took it"


def test_a_bead_waiting_for_its_merge_or_closed_is_not_stale_a_rejected_merge_makes_it_stale() -> None:
    d = hooked_deacon()
    d.add(MergeRequestSubmitted(mr_id="mr-1", bead=BEAD, rig="demo", branch="b", target="main", head="h"))
    d.add(LeaseReleased(lease=LEASE, holder=SESSION, token=1))
    later = T0 + timedelta(hours=1)
    assert d.stale(later) == [], "the refinery moves it on"
    d.add(MergeRequestRejected(mr_id="mr-1", reason="no"))
    assert d.stale(later) == [(BEAD, 1)]
    d.add(BeadClosed(bead_id=BEAD, reason="done by hand"))
    assert d.stale(later) == []
    assert d.state.hooks.beads == {}, "closed beads leave the deacon's tracking"
    assert d.state.hooks.by_lease == {}


def test_stale_hook_command_ids_are_valid_and_stable_for_long_beads() -> None:
    short = StaleHook(bead=BEAD, token=3, holder=SESSION)
    assert short.command_id == f"stale-hook-{BEAD}-3"
    long_id = StaleHook(bead="x" * 64, token=3, holder="s").command_id
    assert len(long_id) <= 64
    assert long_id == StaleHook(bead="x" * 64, token=3, holder="other").command_id


# ---- the witness: what it does with one --------------------------------------------------------


def witness_with_ended_session(end_reason: str = "done", *, cleaned: bool = True) -> Deciding:
    fed = Deciding(new_witness_projection(), witness_decide.decide, clock=T0)
    fed.add(RigAdded(rig="demo", repo="/repos/demo.git", prefix="demo", agent_command="gt-agent"))
    fed.add(BeadCreated(bead_id=BEAD, title="a bead"), BeadSlung(bead_id=BEAD, rig="demo"))
    fed.add(
        SessionRequested(
            session_id=SESSION,
            rig="demo",
            polecat="ace",
            bead=BEAD,
            worktree="/town/rigs/demo/polecats/ace",
            branch="polecat/ace/demo-1",
            tmux_name="gt-demo-ace",
            attempt=1,
        ),
        SessionStarted(session_id=SESSION, pane_pid=1, pid_started=1.0),
        LeaseAcquired(lease=LEASE, holder=SESSION, token=1, ttl_s=30, expires_at=T0),
        BeadClaimed(bead_id=BEAD, assignee="demo/ace"),
        SessionEnded(session_id=SESSION, reason=end_reason),
        LeaseReleased(lease=LEASE, holder=SESSION, token=1),
    )
    if cleaned:
        fed.add(SessionCleaned(session_id=SESSION, worktree_removed=True))
    return fed


def observed() -> Observed:
    return Observed(now=T0, as_of_seq=10**9, panes={})


POLICY = Policy(rigs_root="/town/rigs")


def test_a_clean_stale_hook_is_reslung_once_and_then_escalated() -> None:
    fed = witness_with_ended_session()
    result = fed.send(RECOVER, witness_decide.WorktreeFacts(None), bead=BEAD, token=1)
    assert (result["status"], result["changed"]) == ("resling", True)
    actions = plan(fed.projection.state, observed(), POLICY)
    assert Resling(bead=BEAD, rig="demo", after=SESSION) in actions
    again = fed.send(RECOVER, witness_decide.WorktreeFacts(None), bead=BEAD, token=1)
    assert again["status"] == "not_stale", "the same hand-over twice changes nothing"
    # The mayor records the re-sling; the fresh session ends without moving the bead on, and its hook lapses.
    fed.add(BeadSlung(bead_id=BEAD, rig="demo", forced=True))
    state = fed.projection.state
    assert not state.beads[BEAD].resling_owed
    fed.add(
        SessionRequested(
            session_id="demo-1-2",
            rig="demo",
            polecat="ace",
            bead=BEAD,
            worktree="/town/rigs/demo/polecats/ace",
            branch="polecat/ace/demo-1",
            tmux_name="gt-demo-ace",
            attempt=2,
        ),
        LeaseAcquired(lease=LEASE, holder="demo-1-2", token=2, ttl_s=30, expires_at=T0),
        SessionEnded(session_id="demo-1-2", reason="done"),
        LeaseReleased(lease=LEASE, holder="demo-1-2", token=2),
    )
    second = fed.send(RECOVER, witness_decide.WorktreeFacts(None), bead=BEAD, token=2)
    assert second["status"] == "escalate"
    assert "stale again" in second["detail"]
    escalation = next(a for a in plan(state, observed(), POLICY) if isinstance(a, Escalate))
    assert (escalation.session, escalation.reason) == ("demo-1-2", "stale_hook")


@pytest.mark.parametrize(
    ("facts", "rejected", "why"),
    [("uncommitted changes", False, "uncommitted changes"), (None, True, "merge request was rejected")],
)
def test_dirty_work_or_a_rejected_merge_request_is_escalated_never_reslung(
    facts: str | None, rejected: bool, why: str
) -> None:
    fed = witness_with_ended_session()
    if rejected:
        fed.add(MergeRequestSubmitted(mr_id="mr-1", bead=BEAD, rig="demo", branch="b", target="main", head="h"))
        fed.add(MergeRequestRejected(mr_id="mr-1", reason="not wanted"))
    result = fed.send(RECOVER, witness_decide.WorktreeFacts(facts), bead=BEAD, token=1)
    assert result["status"] == "escalate"
    assert why in result["detail"]
    actions = plan(fed.projection.state, observed(), POLICY)
    assert not [a for a in actions if isinstance(a, Resling)]
    assert [a.reason for a in actions if isinstance(a, Escalate)] == ["stale_hook"]


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("closed", "closed"),
        ("merge", "merge request is in the queue"),
        ("newer", "token 2"),
    ],
)
def test_a_hook_that_is_not_stale_any_more_changes_nothing(setup: str, why: str) -> None:
    fed = witness_with_ended_session()
    extra: dict[str, list[Any]] = {
        "closed": [BeadClosed(bead_id=BEAD, reason="merged")],
        "merge": [MergeRequestSubmitted(mr_id="mr-1", bead=BEAD, rig="demo", branch="b", target="main", head="h")],
        "newer": [LeaseAcquired(lease=LEASE, holder="someone", token=2, ttl_s=30, expires_at=T0)],
    }
    fed.add(*extra[setup])
    result = fed.send(RECOVER, witness_decide.WorktreeFacts("uncommitted changes"), bead=BEAD, token=1)
    assert (result["status"], result["changed"]) == ("not_stale", False)
    assert why in result["why"]


def test_an_unknown_bead_is_answered_not_found() -> None:
    fed = witness_with_ended_session()
    error: CommandError = fed.reject(RECOVER, None, bead="demo-404", token=1)
    assert error.code == "not_found"
