"""A nudge is about the work its target had when it was sent: to a polecat working a bead, or to a session, it is
typed only into a session of that bead (a fresh one after a crash too), never into the session of the next bead the
polecat is given, and it expires once that bead is closed. Pure: decide and plan on a made-up state."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from services.witness.decide import nudge
from services.witness.plan import Observed, Policy, plan
from services.witness.plan.actions import DeliverNudge, ExpireNudge
from services.witness.projection import new_projection
from services.witness.state import Nudge, WitnessState, WorkBead
from shared.model.commands import NudgeSend
from shared.model.decision import DecideContext
from shared.model.events import NudgeQueued
from tests.memory_log import Fed
from tests.unit.test_runtimes import NOW, _observe, _town

POLICY = Policy(rigs_root="/gt/rigs")
CTX = DecideContext(now=NOW, command_id="c-1", actor="operator", new_id=lambda prefix: f"{prefix}-1")


def _observe_as(session: str) -> Observed:
    """The polecat's pane, now ``session``'s, live and started."""
    obs = _observe(30, frozenset({session}))
    assert obs.panes is not None
    obs.panes["gt-demo-ace"] = msgspec.structs.replace(obs.panes["gt-demo-ace"], label=session)
    obs.alive[session] = True
    return obs


def _queued(state: WitnessState, target: str) -> NudgeQueued:
    [new] = nudge(state, NudgeSend(target=target, message="please also mention the README"), CTX).events
    assert isinstance(new.payload, NudgeQueued)
    return new.payload


def _with_nudge(state: WitnessState, queued: NudgeQueued) -> WitnessState:
    held = Nudge(
        id=queued.nudge_id,
        rig=queued.rig,
        polecat=queued.polecat,
        session=queued.session,
        bead=queued.bead,
        message=queued.message,
        queued_at=NOW,
        expires_at=queued.expires_at,
        version=5,
    )
    return msgspec.structs.replace(state, nudges={held.id: held})


def _next_bead(state: WitnessState, *, closed: bool) -> WitnessState:
    """b1's session ended (its bead ``closed`` or still in review), and polecat ace works b2 in session b2-1."""
    ended = msgspec.structs.replace(state.sessions["b1-1"], status="ended", end_reason="done")
    fresh = msgspec.structs.replace(state.sessions["b1-1"], id="b2-1", bead="b2", branch="polecat/ace/b2")
    first = msgspec.structs.replace(state.beads["b1"], status="closed" if closed else "in_progress")
    second = WorkBead(id="b2", title="the next", status="hooked", rig="demo", sessions=["b2-1"])
    return msgspec.structs.replace(state, sessions={"b1-1": ended, "b2-1": fresh}, beads={"b1": first, "b2": second})


def test_a_nudge_to_a_polecat_at_work_is_about_its_bead() -> None:
    state = _town("gt-agent")
    assert _queued(state, "demo/ace").bead == "b1"
    assert _queued(state, "b1-1").bead == "b1", "to a session: its bead"
    idle = _next_bead(state, closed=True)
    idle.sessions.pop("b2-1")
    assert _queued(idle, "demo/ace").bead is None, "no work now: whichever session it has next"


def test_it_never_reaches_the_next_beads_session_and_expires_with_its_bead() -> None:
    state = _town("gt-agent")
    queued = _queued(state, "demo/ace")
    obs = _observe_as("b2-1")
    in_review = _with_nudge(_next_bead(state, closed=False), queued)
    assert [a for a in plan(in_review, obs, POLICY) if isinstance(a, (DeliverNudge, ExpireNudge))] == []
    closed = _with_nudge(_next_bead(state, closed=True), queued)
    expired = [a for a in plan(closed, obs, POLICY) if isinstance(a, (DeliverNudge, ExpireNudge))]
    assert expired == [ExpireNudge(nudge=queued.nudge_id, reason="bead_closed")]


def test_a_fresh_session_of_the_same_bead_hears_it() -> None:
    state = _town("gt-agent")
    queued = _queued(state, "b1-1")
    crashed = msgspec.structs.replace(state.sessions["b1-1"], status="ended", end_reason="zombie")
    again = msgspec.structs.replace(state.sessions["b1-1"], id="b1-2", attempt=2)
    respawned = msgspec.structs.replace(state, sessions={"b1-1": crashed, "b1-2": again})
    obs = _observe_as("b1-2")
    actions = [a for a in plan(_with_nudge(respawned, queued), obs, POLICY) if isinstance(a, DeliverNudge)]
    assert actions == [DeliverNudge(nudge=queued.nudge_id, session="b1-2")]


def test_the_bead_is_folded_from_the_log_and_an_older_event_without_it_binds_nothing() -> None:
    fed = Fed(new_projection())
    expires = NOW + timedelta(hours=1)
    fed.add(NudgeQueued(nudge_id="nd-1", rig="demo", polecat="ace", bead="b1", message="m", expires_at=expires))
    fed.add(NudgeQueued(nudge_id="nd-2", rig="demo", polecat="ace", message="older", expires_at=expires))
    assert fed.state.nudges["nd-1"].bead == "b1"
    assert fed.state.nudges["nd-2"].bead is None
