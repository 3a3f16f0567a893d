"""Escalations that resolve by themselves: the mayor closes one once what it names is resolved (a bead closed, a
merge request merged, a session done on a rig, a service up), with the reason; an operator's own stays open.

The mayor's pure logic over the in-memory log (decide, fold, reconcile), events of the other services recorded
as they would store them."""

from __future__ import annotations

from typing import Any

import pytest

from services.mayor.state import MayorState
from shared.model.events import (
    Event,
    MergeRequestMerged,
    ServiceDown,
    ServiceUp,
    SessionEnded,
    SessionRequested,
)
from tests.mayor_town import STALE_AFTER, mayor_town
from tests.memory_log import MemoryTown

RAISE = "gt.cmd.escalation.raise"


def happened(town: MemoryTown[MayorState], *events: Event, actor: str = "witness") -> None:
    """Events another service stored, folded, then the mayor's reconcile."""
    town.tick(1)
    town.log.record(events, ts=town.clock, actor=actor)
    town.log.replay(town.projection, after=town.projection.last_seq)
    town.reconcile()


def escalation(town: MemoryTown[MayorState], **body: Any) -> str:
    result = town.send(RAISE, {"severity": "high", "message": "look", **body}, actor="witness")
    return str(result["id"])


def closed(town: MemoryTown[MayorState], escalation_id: str) -> tuple[str | None, str | None] | None:
    """(by, reason) once closed, else None."""
    found = town.state.escalations[escalation_id]
    return (found.closed_by, found.close_reason) if found.status == "closed" else None


def bead(town: MemoryTown[MayorState], title: str = "work") -> str:
    return str(town.send("gt.cmd.bead.create", {"title": title})["id"])


def test_an_escalation_about_a_bead_is_closed_by_the_mayor_once_the_bead_is_closed() -> None:
    town = mayor_town()
    work = bead(town)
    resolving = escalation(town, bead=work, resolved_when=[f"bead:{work}"])
    acked = escalation(town, bead=work, resolved_when=[f"bead:{work}"])
    town.send("gt.cmd.escalation.ack", {"id": acked})
    manual = escalation(town, bead=work)  # an operator's own: about the bead, resolved by nobody but a person
    town.send("gt.cmd.bead.update", {"id": work, "priority": 1})
    assert closed(town, resolving) is None
    town.send("gt.cmd.bead.close", {"id": work, "reason": "merged"})
    assert closed(town, resolving) == ("mayor", f"resolved: bead {work} closed: merged")
    assert closed(town, acked) == ("mayor", f"resolved: bead {work} closed: merged")
    assert closed(town, manual) is None
    town.tick(STALE_AFTER.total_seconds() + 1)
    town.reconcile()
    assert town.state.escalations[manual].reescalations == 1, "an operator's own goes on being raised"
    assert town.state.escalations[resolving].reescalations == 0


def test_one_about_a_closed_bead_is_closed_at_once() -> None:
    town = mayor_town()
    work = bead(town)
    town.send("gt.cmd.bead.close", {"id": work})
    late = escalation(town, bead=work, resolved_when=[f"bead:{work}"])
    assert closed(town, late) == ("mayor", f"resolved: bead {work} closed")


def test_an_escalation_about_a_merge_request_is_closed_once_it_merged() -> None:
    town = mayor_town()
    work = bead(town)
    failed = escalation(town, bead=work, resolved_when=["mr:mr-abc", f"bead:{work}"])
    happened(town, MergeRequestMerged(mr_id="mr-other", merged_commit="c" * 40, target_before="b" * 40))
    assert closed(town, failed) is None, "another merge request's merge resolves nothing"
    happened(town, MergeRequestMerged(mr_id="mr-abc", merged_commit="c" * 40, target_before="b" * 40))
    assert closed(town, failed) == ("mayor", "resolved: merge request mr-abc merged")


def test_a_mass_death_is_closed_once_a_session_of_its_rig_finishes_its_work_after_it() -> None:
    town = mayor_town()
    work = bead(town)
    requested = {
        n: SessionRequested(
            session_id=f"{work}-{n}",
            rig="demo",
            polecat="ace",
            bead=work,
            worktree="/w",
            branch="b",
            tmux_name="t",
            attempt=n,
        )
        for n in (1, 2, 3)
    }
    happened(town, requested[1], SessionEnded(session_id=f"{work}-1", reason="done"))
    mass = escalation(town, resolved_when=["rig:demo"])
    assert closed(town, mass) is None, "a session done before it was raised says nothing of what broke since"
    happened(town, requested[2], SessionEnded(session_id=f"{work}-2", reason="zombie"))
    happened(town, requested[3])
    assert closed(town, mass) is None
    happened(town, SessionEnded(session_id=f"{work}-3", reason="done"))
    assert closed(town, mass) == ("mayor", f"resolved: session {work}-3 of rig demo finished its work")


def test_a_service_down_escalation_is_closed_once_the_service_is_up() -> None:
    town = mayor_town()
    happened(town, ServiceDown(service="witness", instance="w1", reason="no heartbeat for 61 s"), actor="deacon")
    down = escalation(town, resolved_when=["service:witness"])
    happened(town, ServiceUp(service="refinery", instance="r1", pid=7), actor="deacon")
    assert closed(town, down) is None
    happened(town, ServiceUp(service="witness", instance="w2", pid=8), actor="deacon")
    assert closed(town, down) == ("mayor", "resolved: service witness is up again")


@pytest.mark.parametrize(
    "entries",
    [["bead"], ["bead:"], ["ticket:T-1"], ["mr:MR 1"], [f"bead:b{n}" for n in range(17)]],
)
def test_what_cannot_resolve_an_escalation_is_refused(entries: list[str]) -> None:
    town = mayor_town()
    assert town.reject_code(RAISE, {"severity": "low", "message": "x", "resolved_when": entries}) == "invalid"
