"""The witness planner: what it owes for a state and an observation. Pure: no tmux, no processes, no clock.

States are built by folding real events through the witness projection, as the service does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.witness.plan import Observed, PaneSeen, Policy, plan, session_id_for
from services.witness.plan.actions import (
    Action,
    ClaimBead,
    Clean,
    DeliverNudge,
    Escalate,
    ExpireNudge,
    GiveUp,
    Kill,
    KillOrphan,
    MassDeath,
    ReapPane,
    ReleaseHook,
    Spawn,
    Start,
    Warrant,
)
from services.witness.plan.names import POOL, polecat_name
from services.witness.projection import new_projection
from services.witness.state import WitnessState, agent_of
from shared.core.ids import hook_lease_name
from shared.model.events import (
    BeadClaimed,
    BeadClosed,
    BeadCreated,
    BeadSlung,
    BeadUnslung,
    BeadUpdated,
    LeaseAcquired,
    LeaseExpired,
    LeaseReleased,
    MergeRequestFailed,
    MergeRequestRequeued,
    MergeRequestSubmitted,
    NudgeQueued,
    RigAdded,
    RigMassDeath,
    RigParked,
    RigRemoved,
    RigUnparked,
    RigUpdated,
    SessionCleaned,
    SessionDoneIntent,
    SessionEnded,
    SessionEscalated,
    SessionRequested,
    SessionStarted,
    SessionWarranted,
    StepCompleted,
)
from tests.memory_log import Fed

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = Policy(rigs_root="/town/rigs", min_orphan_age_s=60, done_stuck_after_s=60, respawn_backoff_s=0)
"""Without the respawn backoff, which has tests of its own (``BACKOFF``): the others look at what is owed, not when."""
BACKOFF = Policy(rigs_root="/town/rigs", respawn_backoff_s=5, respawn_backoff_max_s=30, respawn_backoff_reset_s=120)


class World(Fed[WitnessState]):
    """A witness projection fed event by event, with a clock the test moves."""

    def __init__(self) -> None:
        super().__init__(new_projection(), clock=T0)

    def rig(self, name: str = "demo", **options: Any) -> None:
        self.add(RigAdded(rig=name, repo="/repos/demo.git", prefix=name[:2], agent_command="gt-agent", **options))

    def bead(self, bead: str, rig: str = "demo", *, forced: bool = False, agent: str | None = None) -> None:
        if bead not in self.state.beads:
            self.add(BeadCreated(bead_id=bead, title=f"work on {bead}"))
        self.add(BeadSlung(bead_id=bead, rig=rig, forced=forced, agent=agent))

    def request(self, spawn: Spawn) -> str:
        self.add(
            SessionRequested(
                session_id=spawn.session,
                rig=spawn.rig,
                polecat=spawn.polecat,
                bead=spawn.bead,
                worktree=spawn.worktree,
                branch=spawn.branch,
                tmux_name=spawn.tmux_name,
                attempt=spawn.attempt,
                handoff_of=spawn.handoff_of,
                agent=spawn.agent,
            )
        )
        return spawn.session

    def start(self, session: str, pid: int = 4242) -> None:
        self.add(SessionStarted(session_id=session, pane_pid=pid, pid_started=1000.0))

    def end(self, session: str, reason: str, *, cleaned: bool = True, removed: bool = False) -> None:
        self.add(SessionEnded(session_id=session, reason=reason))
        if cleaned:
            self.add(SessionCleaned(session_id=session, worktree_removed=removed))

    def kept_after_a_death(self, bead: str, detail: str = "kept") -> str:
        """A session of the bead that died with no respawn left: escalated, and cleaned keeping its worktree."""
        session = self.running(bead)
        self.end(session, "dead", cleaned=False)
        self.add(SessionEscalated(session_id=session, reason="respawn_limit"))
        self.add(SessionCleaned(session_id=session, worktree_removed=False, detail=detail))
        return session

    def running(self, bead: str) -> str:
        """Spawn (as planned), request and start a session for the bead; its id."""
        spawn = only(self.plan(), Spawn)
        assert spawn.bead == bead
        session = self.request(spawn)
        self.start(session)
        return session

    def pane(self, session: str, *, dead: bool = False, age_s: float = 5.0) -> PaneSeen:
        recorded = self.state.sessions[session]
        created = int((self.clock - timedelta(seconds=age_s)).timestamp())
        return PaneSeen(name=recorded.tmux_name, pane_pid=4242, dead=dead, created=created, label=session)

    def observe(self, *panes: PaneSeen, **fields: Any) -> Observed:
        return Observed(now=self.clock, as_of_seq=self.log.last_seq, panes={p.name: p for p in panes}, **fields)

    def plan(self, obs: Observed | None = None, policy: Policy = POLICY) -> list[Action]:
        live = [self.pane(s.id) for s in self.state.sessions.values() if s.status == "started"]
        return plan(self.state, obs or self.observe(*live), policy)


def only(actions: list[Action], kind: type[Any]) -> Any:
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


# ---- spawning ----------------------------------------------------------------------------------


def test_a_bead_slung_to_a_rig_gets_one_session_with_derived_names() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    spawn = only(w.plan(), Spawn)
    assert spawn == Spawn(
        bead="gt-abc",
        session="gt-abc-1",
        rig="demo",
        polecat="ace",
        worktree="/town/rigs/demo/polecats/ace",
        branch="polecat/ace/gt-abc",
        tmux_name="gt-demo-ace",
        attempt=1,
        agent="gt-agent",
    )


def test_a_rig_added_again_after_its_removal_works_in_a_directory_of_its_own() -> None:
    """Issue 39: a removed rig's name is added again as a new rig, with nothing of the old one's on disk."""
    w = World()
    w.add(RigAdded(rig="demo", repo="/repos/demo.git", prefix="old", agent_command="gt-agent"))
    w.add(RigRemoved(rig="demo"))
    w.add(RigAdded(rig="demo", repo="/repos/other.git", prefix="new", agent_command="claude"))
    rig = w.state.rigs["demo"]
    assert (rig.repo, rig.prefix, rig.former_prefixes, rig.incarnation) == ("/repos/other.git", "new", ["old"], 2)
    assert (rig.removed, rig.parked, rig.agent_command) == (False, False, "claude")
    w.bead("new-1")
    assert only(w.plan(), Spawn).worktree == "/town/rigs/demo.2/polecats/ace"


def test_a_retitled_bead_is_named_by_its_new_title_to_its_next_session() -> None:
    """What the beacon says: a title changed after the sling (a scripted model's ``[model-script:NAME]``) reaches
    the next session."""
    w = World()
    w.rig()
    w.bead("gt-1")
    w.add(BeadUpdated(bead_id="gt-1", title="Fix it [model-script:rework]"))
    assert w.state.beads["gt-1"].title == "Fix it [model-script:rework]"
    w.add(BeadUpdated(bead_id="gt-1", priority=0))
    assert w.state.beads["gt-1"].title == "Fix it [model-script:rework]", "a change without a title keeps it"


def test_a_bead_slung_to_an_unknown_rig_waits_for_the_rig() -> None:
    w = World()
    w.bead("gt-abc", rig="later")
    assert w.plan() == []
    w.rig("later")
    assert only(w.plan(), Spawn).rig == "later"


def test_max_polecats_queues_the_rest_in_sling_order_and_recycles_names() -> None:
    w = World()
    w.rig(max_polecats=2)
    for bead in ("gt-1", "gt-2", "gt-3"):
        w.bead(bead)
    spawns = [a for a in w.plan() if isinstance(a, Spawn)]
    assert [(s.bead, s.polecat) for s in spawns] == [("gt-1", "ace"), ("gt-2", "bob")]
    for spawn in spawns:
        w.start(w.request(spawn))
    assert not [a for a in w.plan() if isinstance(a, Spawn)], "the third waits for a free polecat"
    w.end("gt-1-1", "done", removed=True)
    spawn = only(w.plan(), Spawn)
    assert (spawn.bead, spawn.polecat) == ("gt-3", "ace"), "ace's worktree was removed: the name is free again"


def test_a_bead_whose_session_died_gets_the_next_free_polecat_before_beads_never_started() -> None:
    """Found by the town chaos run: a bead re-slung after a death went to the back of the queue (its sling is the
    newest), waited behind hundreds of new beads, and the deacon took its hook for stale meanwhile."""
    w = World()
    w.rig(max_polecats=1)
    w.bead("gt-1")
    first = w.running("gt-1")
    w.bead("gt-2")
    w.bead("gt-3")
    w.end(first, "dead", cleaned=False)
    w.bead("gt-1", forced=True)  # the witness's re-sling after the death: now the newest sling of the three
    w.bead("gt-4")
    spawn = only(w.plan(), Spawn)
    assert (spawn.bead, spawn.resling) == ("gt-1", True), "work under way resumes before new work starts"


def test_a_name_whose_worktree_was_kept_is_not_given_to_another_bead() -> None:
    w = World()
    w.rig(max_polecats=2, max_respawns=0)
    w.bead("gt-1")
    w.kept_after_a_death("gt-1")
    w.bead("gt-2")
    assert only(w.plan(), Spawn).polecat == "bob"


def test_a_name_kept_for_a_failed_start_is_free_again_once_its_bead_is_closed() -> None:
    w = World()
    w.rig(max_polecats=2)
    w.bead("gt-1")
    first = w.request(only(w.plan(), Spawn))
    # Its agent could not be started (`_agent_unavailable`): escalated, ended, cleaned keeping its worktree.
    w.add(SessionEscalated(session_id=first, reason="agent_unavailable"))
    w.end(first, "failed_to_start", cleaned=False)
    clean = only(w.plan(), Clean)
    assert (clean.session, clean.remove_worktree) == (first, False)
    w.add(SessionCleaned(session_id=first, worktree_removed=False, detail=clean.detail))
    assert not [a for a in w.plan() if isinstance(a, Clean)], "kept while its bead is open"
    w.add(BeadClosed(bead_id="gt-1", reason="not needed"))
    again = only(w.plan(), Clean)
    assert again == Clean(session=first, remove_worktree=True, again=True)
    w.add(SessionCleaned(session_id=first, worktree_removed=True, detail="worktree removed"))
    assert not [a for a in w.plan() if isinstance(a, Clean)]
    w.bead("gt-2")
    assert only(w.plan(), Spawn).polecat == "ace", "the name is free"


def test_a_worktree_that_holds_unsaved_work_after_its_bead_closed_is_tried_once_more_only() -> None:
    w = World()
    w.rig(max_polecats=2, max_respawns=0)
    w.bead("gt-1")
    first = w.kept_after_a_death("gt-1", "kept for manual recovery (escalated)")
    w.add(BeadClosed(bead_id="gt-1"))
    assert only(w.plan(), Clean).again
    w.add(SessionCleaned(session_id=first, worktree_removed=False, detail="it holds uncommitted changes"))
    assert not [a for a in w.plan() if isinstance(a, Clean)], "unsaved work stays, and the name with it"
    w.bead("gt-2")
    assert only(w.plan(), Spawn).polecat == "bob"


def test_a_requested_session_is_started_and_given_up_after_repeated_failures() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.request(only(w.plan(), Spawn))
    assert only(w.plan(), Start) == Start(session=session)
    assert w.plan(w.observe(busy=frozenset({"bead:gt-abc"}))) == [], "its spawn is still starting it"
    gave_up = only(w.plan(w.observe(start_failures={session: 3})), GiveUp)
    assert gave_up.session == session


def test_actions_already_running_are_not_planned_again() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    assert w.plan(w.observe(busy=frozenset({"bead:gt-abc"}))) == []


# ---- detection ---------------------------------------------------------------------------------


def test_a_session_whose_tmux_session_is_gone_is_warranted_dead() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    warrant = only(w.plan(w.observe()), Warrant)
    assert (warrant.session, warrant.reason) == (session, "dead")


def test_a_tmux_session_of_the_same_name_started_for_another_session_does_not_count() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    stranger = PaneSeen(name=w.state.sessions[session].tmux_name, pane_pid=1, dead=False, created=0, label="other")
    assert only(w.plan(w.observe(stranger)), Warrant).reason == "dead"


@pytest.mark.parametrize(("pane_dead", "agent_alive"), [(True, True), (False, False)])
def test_a_live_tmux_session_without_its_agent_is_a_zombie(pane_dead: bool, agent_alive: bool) -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    obs = w.observe(w.pane(session, dead=pane_dead), alive={session: agent_alive})
    assert only(w.plan(obs), Warrant).reason == "zombie"


def test_an_agent_whose_credentials_were_refused_is_warranted_and_after_the_unpark_resumed_on_its_hook() -> None:
    w = World()
    w.add(RigAdded(rig="demo", repo="/repos/demo.git", prefix="de", agent_command="claude"))
    w.bead("gt-abc")
    session = w.running("gt-abc")
    refused = w.observe(w.pane(session), start_confirmed=frozenset({session}), refused={session: "401"})
    warrant = only(w.plan(refused), Warrant)
    assert warrant.reason == "agent_unauthorized"
    assert warrant.detail == "rig demo: 401"
    w.add(RigParked(rig="demo", reason="refused"))
    w.add(SessionWarranted(session_id=session, reason="agent_unauthorized"))
    w.end(session, "agent_unauthorized", cleaned=False)
    assert not [a for a in w.plan() if isinstance(a, Spawn)], "parked: no new session, no loop"
    w.add(RigUnparked(rig="demo"))
    spawn = only(w.plan(), Spawn)
    assert (spawn.attempt, spawn.resling) == (2, True), "the hook moves to the new session"
    for _ in range(5):
        w.end(w.running("gt-abc"), "agent_unauthorized", cleaned=False)
    assert only(w.plan(), Spawn).attempt == 7, "not a death: never the respawn limit, the bead is not at fault"


def test_nothing_is_judged_dead_when_tmux_could_not_be_asked_or_the_session_changed_meanwhile() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    blind = Observed(now=w.clock, as_of_seq=w.log.last_seq, panes=None)
    assert w.plan(blind) == []
    stale = Observed(now=w.clock, as_of_seq=w.state.sessions[session].version - 1, panes={})
    assert w.plan(stale) == []


def test_a_quiet_session_is_warranted_stalled_unless_a_heartbeat_or_step_shows_life() -> None:
    w = World()
    w.rig(stall_after_s=120)
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.tick(100)
    assert w.plan() == []
    w.tick(30)
    assert only(w.plan(), Warrant).reason == "stalled"
    fresh = w.observe(w.pane(session), heartbeats={session: w.clock - timedelta(seconds=10)})
    assert w.plan(fresh) == []


def test_a_session_in_done_is_left_to_finish_until_it_is_stuck() -> None:
    w = World()
    w.rig(stall_after_s=30)
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.add(SessionDoneIntent(session_id=session))
    w.tick(50)
    assert w.plan() == [], "stall detection does not apply while done runs"
    w.tick(20)
    assert only(w.plan(), Warrant).reason == "stuck_in_done"
    assert only(w.plan(w.observe()), Warrant).reason == "dead", "dying in done is still noticed"


def test_a_warranted_session_is_killed_and_a_closed_bead_warrants_its_session() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.add(BeadClosed(bead_id="gt-abc", reason="not needed"))
    assert only(w.plan(), Warrant).reason == "bead_closed"
    w.add(SessionWarranted(session_id=session, reason="bead_closed"))
    assert only(w.plan(), Kill) == Kill(session=session)


# ---- recovery ----------------------------------------------------------------------------------


def test_a_dead_session_is_resung_to_the_same_polecat_worktree_and_branch() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    first = w.running("gt-abc")
    w.end(first, "dead", cleaned=False)
    spawn = only(w.plan(), Spawn)
    assert (spawn.session, spawn.attempt, spawn.polecat, spawn.resling) == ("gt-abc-2", 2, "ace", True)
    assert spawn.branch == "polecat/ace/gt-abc"
    w.request(spawn)
    clean = only(w.plan(), Clean)
    assert (clean.session, clean.remove_worktree) == (first, False), "the worktree carries on"


def test_a_handoff_gets_a_fresh_session_without_moving_the_hook() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    first = w.running("gt-abc")
    w.end(first, "handoff", cleaned=False)
    spawn = only(w.plan(), Spawn)
    assert (spawn.handoff_of, spawn.resling, spawn.polecat) == (first, False, "ace")


def test_a_session_the_operator_stopped_is_respawned_by_the_next_witness_not_by_this_one() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    first = w.running("gt-abc")
    acting_since = w.clock
    w.tick(5)
    w.add(SessionWarranted(session_id=first, reason="stopped", detail="stopped by the operator"))
    assert kinds(w.plan()) == ["Kill"]
    w.end(first, "stopped", cleaned=False)
    assert "Spawn" not in kinds(w.plan(w.observe(acting_since=acting_since))), "the town is going down"
    spawn = only(w.plan(w.observe(acting_since=w.clock + timedelta(seconds=1))), Spawn)  # the next witness
    assert (spawn.attempt, spawn.polecat, spawn.resling) == (2, "ace", False)  # keeps its hook, like a handoff


def test_a_bead_resung_max_respawns_times_is_escalated_on_its_next_death() -> None:
    w = World()
    w.rig(max_respawns=3)
    w.bead("gt-abc")
    for attempt in range(1, 5):
        session = w.running("gt-abc")
        assert session == f"gt-abc-{attempt}"
        w.end(session, "dead", cleaned=False)
    escalate = only(w.plan(), Escalate)
    assert (escalate.session, escalate.reason) == ("gt-abc-4", "respawn_limit")
    assert "re-sling it with `gt sling gt-abc demo --force`" in escalate.message
    assert not [a for a in w.plan() if isinstance(a, Spawn)]
    w.add(SessionEscalated(session_id="gt-abc-4", reason="respawn_limit"))
    cleans = {a.session: a for a in w.plan() if isinstance(a, Clean)}
    assert cleans["gt-abc-4"].remove_worktree is False, "kept for manual recovery"
    assert "escalated" in cleans["gt-abc-4"].detail
    w.bead("gt-abc", forced=True)  # the operator looked and slings it again: a fresh respawn budget
    assert only(w.plan(), Spawn).attempt == 5


def test_a_finished_session_is_cleaned_with_its_worktree_and_the_bead_gets_no_new_session() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.add(
        MergeRequestSubmitted(
            mr_id="mr-1", bead="gt-abc", rig="demo", branch="polecat/ace/gt-abc", target="main", head="abc"
        )
    )
    w.end(session, "done", cleaned=False)
    assert w.plan() == [Clean(session=session, remove_worktree=True)]


def ended_by_gt_done() -> tuple[World, str]:
    """A world with one session that `gt done` ended, not cleaned up yet: its agent may still run."""
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.add(SessionDoneIntent(session_id=session))
    w.end(session, "done", cleaned=False)
    return w, session


def test_an_agent_running_on_after_gt_done_has_a_grace_to_see_the_result_before_it_is_cleaned() -> None:
    w, session = ended_by_gt_done()
    # Cleaning kills the session's process tree: `gt done` (which just ended it) and the agent that ran it.
    assert w.plan(w.observe(w.pane(session))) == [], "the agent is still reading what `gt done` said"
    w.tick(POLICY.done_exit_grace_s - 1)
    assert w.plan(w.observe(w.pane(session))) == []
    w.tick(2)
    assert w.plan(w.observe(w.pane(session))) == [Clean(session=session, remove_worktree=True)], "grace over"


def test_an_agent_that_exits_after_gt_done_is_cleaned_up_at_once() -> None:
    w, session = ended_by_gt_done()
    clean = [Clean(session=session, remove_worktree=True)]
    assert w.plan(w.observe(w.pane(session, dead=True))) == clean, "its pane is dead: the agent exited"
    assert w.plan(w.observe(w.pane(session), alive={session: False})) == clean, "its process is gone"
    assert w.plan(w.observe()) == clean, "its tmux session is gone"


def test_an_agent_that_ended_its_turn_after_gt_done_is_cleaned_up_without_waiting_out_the_grace() -> None:
    w, session = ended_by_gt_done()
    assert w.plan(w.observe(w.pane(session))) == [], "still in the turn that ran `gt done`"
    reported = w.observe(w.pane(session), reported_done=frozenset({session}))
    assert w.plan(reported) == [Clean(session=session, remove_worktree=True)], "its turn ended: it read the result"


def test_the_pane_of_an_ended_session_that_lingers_is_reaped() -> None:
    w = World()
    w.rig(max_respawns=0)
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.end(session, "zombie", cleaned=False)
    w.add(SessionEscalated(session_id=session, reason="respawn_limit"))
    # Escalated sessions are cleaned (worktree kept); an ended session with no successor yet gets reaped.
    assert isinstance(only(w.plan(), Clean), Clean)
    w2 = World()
    w2.rig(max_polecats=1)
    w2.bead("gt-1")
    first = w2.running("gt-1")
    w2.end(first, "dead", cleaned=False)
    obs = w2.observe(w2.pane(first), busy=frozenset({"bead:gt-1"}))
    assert ReapPane(session=first) in w2.plan(obs)


def test_three_deaths_within_the_window_are_a_mass_death_once() -> None:
    w = World()
    w.rig(max_polecats=5)
    for bead in ("gt-1", "gt-2", "gt-3"):
        w.bead(bead)
    for spawn in [a for a in w.plan() if isinstance(a, Spawn)]:
        w.start(w.request(spawn))
    for n, session in enumerate(("gt-1-1", "gt-2-1", "gt-3-1")):
        w.tick(10 if n else 0)
        w.end(session, "dead", cleaned=False)
    mass = only(w.plan(), MassDeath)
    assert mass.sessions == ("gt-1-1", "gt-2-1", "gt-3-1")
    w.add(RigMassDeath(rig="demo", sessions=list(mass.sessions), window_s=30))
    assert not [a for a in w.plan() if isinstance(a, MassDeath)]


def _dying_wave(w: World) -> list[str]:
    """Every session the plan spawns (after the respawn backoff) started, then dead within seconds of each other:
    what one broken command shared by a rig's beads does."""
    for _ in range(200):
        spawns = [a for a in w.plan() if isinstance(a, Spawn)]
        if spawns:
            break
        w.tick(5)
    sessions = [w.request(spawn) for spawn in spawns]
    for session in sessions:
        w.start(session)
    for session in sessions:
        w.tick(1)
        w.end(session, "zombie")
    return sessions


def _mass_deaths_raised(w: World) -> list[MassDeath]:
    """Plan, and record the mass deaths it asks for as the executor does."""
    raised = [a for a in w.plan() if isinstance(a, MassDeath)]
    for mass in raised:
        w.add(RigMassDeath(rig=mass.rig, sessions=list(mass.sessions), window_s=mass.window_s))
    return raised


def test_a_rig_whose_sessions_keep_dying_is_one_mass_death_until_one_finishes_its_work_or_the_rig_changes() -> None:
    w = World()
    w.rig(max_polecats=5, max_respawns=20)
    for bead in ("gt-1", "gt-2", "gt-3"):
        w.bead(bead)
    first = _dying_wave(w)
    assert [m.sessions for m in _mass_deaths_raised(w)] == [tuple(first)]
    for _ in range(3):  # the trial: four critical escalations in 12 s for one typo in the test command
        assert len(_dying_wave(w)) == 3
        assert _mass_deaths_raised(w) == [], "the open mass death already says so"
    # A session of the rig finishes its work: what they share works again, and the next deaths are news.
    w.bead("gt-4")
    done = next(a for a in w.plan() if isinstance(a, Spawn) and a.bead == "gt-4")
    w.start(w.request(done))
    w.end(done.session, "done")
    again = _dying_wave(w)
    assert [m.sessions for m in _mass_deaths_raised(w)] == [tuple(again)]
    assert _dying_wave(w)
    assert _mass_deaths_raised(w) == []
    # The operator changes the rig (a fixed test command that is still wrong): its deaths are news again.
    w.add(RigUpdated(rig="demo", test_command="pytest"))
    after_update = _dying_wave(w)
    assert [m.sessions for m in _mass_deaths_raised(w)] == [tuple(after_update)]


def test_deaths_spread_wider_than_the_window_are_not_a_mass_death() -> None:
    w = World()
    w.rig(max_polecats=5)
    for bead in ("gt-1", "gt-2", "gt-3"):
        w.bead(bead)
    for spawn in [a for a in w.plan() if isinstance(a, Spawn)]:
        w.start(w.request(spawn))
    for session in ("gt-1-1", "gt-2-1", "gt-3-1"):
        w.end(session, "dead", cleaned=False)
        w.tick(16)
    assert not [a for a in w.plan() if isinstance(a, MassDeath)]


def test_one_bead_dying_again_and_again_is_no_mass_death() -> None:
    w = World()
    w.rig(max_respawns=3)
    w.bead("gt-1")
    for _ in range(4):
        w.end(w.running("gt-1"), "zombie", cleaned=False)
        w.tick(2)
    assert not [a for a in w.plan() if isinstance(a, MassDeath)], "its own respawn backoff and limit deal with it"
    w.add(SessionEscalated(session_id="gt-1-4", reason="respawn_limit"))
    w.bead("gt-2")
    w.end(w.running("gt-2"), "zombie", cleaned=False)
    assert not [a for a in w.plan() if isinstance(a, MassDeath)], "two beads are not yet three"


# ---- the respawn backoff -----------------------------------------------------------------------


def spawned(w: World, policy: Policy = BACKOFF) -> bool:
    return any(isinstance(a, Spawn) for a in w.plan(policy=policy))


def respawn(w: World, spawn: Spawn) -> None:
    """Carry out a respawn as the executor does: the hook moves to the new session (the re-sling the mayor
    records, naming it), then the session is requested and started."""
    assert spawn.resling
    w.add(BeadSlung(bead_id=spawn.bead, rig=spawn.rig, forced=True, session=spawn.session))
    w.start(w.request(spawn))


def wait_for_respawn(w: World, waited_s: float) -> None:
    """Nothing is spawned just before ``waited_s`` after the death, a session is at ``waited_s`` (0: at once):
    started."""
    if waited_s > 0:
        w.tick(waited_s - 0.5)
        assert not spawned(w), f"respawned before {waited_s}s"
        w.tick(0.5)
    respawn(w, only(w.plan(policy=BACKOFF), Spawn))


def test_one_crash_is_respawned_at_once_and_a_crash_loop_after_a_backoff_that_doubles_up_to_its_cap() -> None:
    w = World()
    w.rig(max_respawns=10)
    w.bead("gt-abc")
    w.running("gt-abc")
    for n, waited in enumerate((0, 5, 10, 20, 30, 30), start=1):  # at once, then BACKOFF: 5 s, doubled, at most 30 s
        w.tick(3)
        w.end(f"gt-abc-{n}", "zombie", cleaned=False)
        wait_for_respawn(w, waited)
    assert w.state.sessions["gt-abc-7"].status == "started"


def test_the_backoff_starts_over_after_a_session_that_lived_long_enough_or_got_a_step_done() -> None:
    w = World()
    w.rig(max_respawns=10)
    w.bead("gt-abc")
    w.running("gt-abc")
    for n, waited in enumerate((0, 5), start=1):
        w.tick(1)
        w.end(f"gt-abc-{n}", "dead", cleaned=False)
        wait_for_respawn(w, waited)
    w.tick(BACKOFF.respawn_backoff_reset_s)  # it lived long enough: no crash loop
    w.end("gt-abc-3", "stalled", cleaned=False)
    assert spawned(w), "respawned at once"
    respawn(w, only(w.plan(policy=BACKOFF), Spawn))
    for n, waited in enumerate((0, 5), start=4):  # counted from there: at once, then the shortest wait
        w.tick(1)
        w.end(f"gt-abc-{n}", "zombie", cleaned=False)
        wait_for_respawn(w, waited)
    w.add(StepCompleted(bead_id="gt-abc", step="implement"))  # it got on with the work before it died
    w.tick(1)
    w.end("gt-abc-6", "zombie", cleaned=False)
    assert spawned(w), "respawned at once"


def test_the_backoff_is_read_from_the_log_so_a_restarted_witness_waits_the_same() -> None:
    w = World()
    w.rig(max_respawns=10)
    w.bead("gt-abc")
    w.running("gt-abc")
    for n, waited in enumerate((0, 5, 10), start=1):
        w.tick(1)
        w.end(f"gt-abc-{n}", "zombie", cleaned=False)
        wait_for_respawn(w, waited)
    w.tick(1)
    w.end("gt-abc-4", "zombie", cleaned=False)
    died_at = w.state.sessions["gt-abc-4"].ended_at
    assert died_at is not None
    restarted = World()  # a new witness: nothing but the log
    w.log.replay(restarted.projection, after=0)
    restarted.clock = died_at + timedelta(seconds=19.5)
    assert not spawned(restarted), "the fourth quick death in a row waits 20 s, whoever watches"
    restarted.tick(0.5)
    assert spawned(restarted)


def test_an_operator_sling_starts_the_backoff_over() -> None:
    w = World()
    w.rig(max_respawns=1)
    w.bead("gt-abc")
    w.running("gt-abc")
    w.tick(1)
    w.end("gt-abc-1", "zombie", cleaned=False)
    wait_for_respawn(w, 0)
    w.tick(1)
    w.end("gt-abc-2", "zombie", cleaned=False)  # two quick deaths in a row: a crash loop, over the limit
    assert not spawned(w)
    w.add(SessionEscalated(session_id="gt-abc-2", reason="respawn_limit"))
    w.bead("gt-abc", forced=True)
    assert spawned(w), "the operator looked and slung it again: at once"


def test_the_respawn_limit_escalation_quotes_the_last_sessions_pane() -> None:
    w = World()
    w.rig(max_respawns=0)
    w.bead("gt-abc")
    session = w.running("gt-abc")
    tail = "[gt-agent] giving up: tests fail (2): make: *** No rule to make target 'test'.  Stop."
    w.add(SessionWarranted(session_id=session, reason="zombie", detail="its agent is not", pane_tail=tail))
    w.end(session, "zombie", cleaned=False)
    escalate = only(w.plan(), Escalate)
    assert f"Its last session {session} showed:\n{tail}\n" in escalate.message


# ---- orphans -----------------------------------------------------------------------------------


def test_an_orphan_tmux_session_is_killed_only_once_old_enough_and_only_if_ours_by_name() -> None:
    w = World()
    now = int(w.clock.timestamp())
    young = PaneSeen(name="gt-demo-zed", pane_pid=7, dead=False, created=now - 30)
    old = PaneSeen(name="gt-demo-yak", pane_pid=8, dead=False, created=now - 61)
    foreign = PaneSeen(name="editor", pane_pid=9, dead=False, created=now - 9999)
    assert w.plan(w.observe(young, old, foreign)) == [KillOrphan(tmux_name="gt-demo-yak", pane_pid=8, created=now - 61)]


def test_a_tmux_session_labelled_with_a_known_session_is_never_an_orphan() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    assert not [a for a in w.plan(w.observe(w.pane(session, age_s=9999))) if isinstance(a, KillOrphan)]


# ---- nudges ------------------------------------------------------------------------------------


def test_a_nudge_is_delivered_to_the_polecats_live_session_and_expires_otherwise() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    w.add(
        NudgeQueued(
            nudge_id="nd-1", rig="demo", polecat="ace", message="hurry", expires_at=w.clock + timedelta(seconds=60)
        )
    )
    session = w.request(only(w.plan(), Spawn))
    assert not [a for a in w.plan() if isinstance(a, DeliverNudge)], "not while the session is starting"
    w.start(session)
    assert DeliverNudge(nudge="nd-1", session=session) in w.plan()
    w.tick(61)
    assert ExpireNudge(nudge="nd-1") in w.plan(w.observe(w.pane(session)))


# ---- properties --------------------------------------------------------------------------------


def test_the_plan_is_ordered_by_priority_and_has_one_action_per_key() -> None:
    w = World()
    w.rig(max_polecats=3)
    for bead in ("gt-1", "gt-2"):
        w.bead(bead)
    spawns = [a for a in w.plan() if isinstance(a, Spawn)]
    w.start(w.request(spawns[0]))
    w.end("gt-1-1", "done", cleaned=False)
    now = int(w.clock.timestamp())
    actions = w.plan(w.observe(PaneSeen(name="gt-demo-old", pane_pid=3, dead=False, created=now - 100)))
    priorities = [type(a).PRIORITY for a in actions]
    assert priorities == sorted(priorities)
    assert len({a.key for a in actions}) == len(actions)
    assert set(kinds(actions)) >= {"Spawn", "Clean", "KillOrphan"}


def test_session_ids_are_deterministic_bounded_and_distinct_per_attempt() -> None:
    assert session_id_for("gt-abc", 2) == "gt-abc-2"
    long_bead = "gt-" + "x" * 90
    ids = {session_id_for(long_bead, n) for n in range(1, 20)}
    assert len(ids) == 19
    assert all(len(i) <= 64 for i in ids)
    assert session_id_for(long_bead, 3) == session_id_for(long_bead, 3)


def test_polecat_names_come_from_the_pool_then_numbers() -> None:
    assert [polecat_name(i) for i in range(3)] == ["ace", "bob", "cat"]
    assert polecat_name(len(POOL)) == f"p{len(POOL)}"
    assert len(set(POOL)) == len(POOL)
    with pytest.raises(ValueError, match="must not be negative"):
        polecat_name(-1)


def test_a_session_in_done_is_left_to_finish_when_its_bead_is_closed_meanwhile() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.add(SessionDoneIntent(session_id=session))
    w.add(BeadClosed(bead_id="gt-abc", reason="merged in mr-1"))  # the refinery was quicker than `gt done`
    assert w.plan() == []
    assert only(w.plan(w.observe()), Warrant).reason == "dead", "dying in done is still noticed"


# ---- hook leases -------------------------------------------------------------------------------


def _hooked(w: World, bead: str, session: str, token: int) -> str:
    lease = hook_lease_name(bead)
    w.add(LeaseAcquired(lease=lease, holder=session, token=token, ttl_s=30.0, expires_at=w.clock))
    return lease


def test_a_session_whose_hook_lease_expired_is_warranted_even_with_a_live_pane() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    lease = _hooked(w, "gt-abc", session, 1)
    assert w.state.sessions[session].lease_token == 1
    assert not [a for a in w.plan() if isinstance(a, Warrant)], "a held hook: nothing to do"
    w.add(LeaseExpired(lease=lease, holder=session, token=1, last_renewed=w.clock))
    warrant = only(w.plan(), Warrant)
    assert (warrant.session, warrant.reason) == (session, "stalled")
    assert "hook lease" in warrant.detail
    assert "expired" in warrant.detail


def test_a_started_session_holding_its_hook_has_its_hooked_bead_claimed_for_its_polecat_and_only_once() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    spawn = only(w.plan(), Spawn)
    session = w.request(spawn)
    _hooked(w, "gt-abc", session, 1)
    assert not [a for a in w.plan() if isinstance(a, ClaimBead)], "not before its pane started"
    w.start(session)
    assert only(w.plan(), ClaimBead) == ClaimBead(session=session, bead="gt-abc")
    w.add(BeadClaimed(bead_id="gt-abc", assignee=f"demo/{spawn.polecat}"))
    assert not [a for a in w.plan() if isinstance(a, ClaimBead)], "claimed: nothing more to do"


def test_a_bead_whose_session_does_not_hold_its_hook_or_is_handing_in_is_not_claimed() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    assert not [a for a in w.plan() if isinstance(a, ClaimBead)], "no hook lease held"
    _hooked(w, "gt-abc", session, 1)
    w.add(SessionDoneIntent(session_id=session))
    assert not [a for a in w.plan() if isinstance(a, ClaimBead)], "in `gt done`"


def test_a_session_in_its_done_flow_keeps_going_without_its_hook() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    lease = _hooked(w, "gt-abc", session, 1)
    w.add(SessionDoneIntent(session_id=session))
    w.add(LeaseExpired(lease=lease, holder=session, token=1, last_renewed=w.clock))
    assert not [a for a in w.plan() if isinstance(a, Warrant)], "the witness finishes a done flow itself"


def test_an_ended_session_releases_its_hook_before_it_is_cleaned_and_only_its_own() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    lease = _hooked(w, "gt-abc", session, 1)
    w.end(session, "stalled", cleaned=False)
    assert only(w.plan(), ReleaseHook) == ReleaseHook(session=session, bead="gt-abc")
    assert not [a for a in w.plan() if isinstance(a, Clean)], "one action per session at a time"
    w.add(LeaseReleased(lease=lease, holder=session, token=1))
    assert w.state.hooks[lease].status == "released"
    assert not [a for a in w.plan() if isinstance(a, ReleaseHook)]
    # The next session takes token 2; the first one's late release or expiry does not touch it.
    second = only(w.plan(), Spawn)
    w.start(w.request(second))
    _hooked(w, "gt-abc", second.session, 2)
    w.add(LeaseExpired(lease=lease, holder=session, token=1, last_renewed=w.clock))
    assert w.state.hooks[lease].status == "held"
    assert w.state.hooks[lease].token == 2
    assert not [a for a in w.plan() if isinstance(a, Warrant)]


def test_hook_lease_names_fit_the_id_pattern_even_for_long_beads() -> None:
    long_bead = "x" * 64
    name = hook_lease_name(long_bead)
    assert len(name) <= 64
    assert name.startswith("hook-")
    assert name != hook_lease_name("x" * 63 + "y"), "a digest keeps long names apart"
    assert hook_lease_name("gt-abc") == "hook-gt-abc"


def test_a_merge_request_sent_back_then_put_back_in_the_queue_leaves_the_bead_waiting_for_the_queue() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    session = w.running("gt-abc")
    w.add(
        MergeRequestSubmitted(
            mr_id="mr-1", bead="gt-abc", rig="demo", branch="polecat/ace/gt-abc", target="main", head="abc"
        )
    )
    w.end(session, "done", cleaned=True, removed=True)
    w.add(MergeRequestFailed(mr_id="mr-1", gate="test", exit_code=1))
    assert only(w.plan(), Spawn).bead == "gt-abc", "sent back: a fresh session"
    # Its bead resubmitted the same commit (or an operator retried it): the queue has it again.
    w.add(MergeRequestRequeued(mr_id="mr-1", reason="resubmitted unchanged after its test gate failed"))
    assert not [a for a in w.plan() if isinstance(a, Spawn)]
    assert w.state.beads["gt-abc"].merge_requested


# ---- the runtime a bead was slung with (`gt sling --agent`) ------------------------------------


def test_a_bead_slung_with_an_agent_runs_it_and_a_bead_slung_without_runs_the_rigs() -> None:
    w = World()
    w.rig()
    w.bead("b1", agent="codex")
    w.bead("b2")
    spawns = {s.bead: s for s in w.plan() if isinstance(s, Spawn)}
    assert {bead: s.agent for bead, s in spawns.items()} == {"b1": "codex", "b2": "gt-agent"}
    session = w.state.sessions[w.request(spawns["b1"])]
    assert (session.agent, agent_of(session, w.state.rigs["demo"])) == ("codex", "codex")


def test_every_session_of_a_bead_runs_its_slung_agent_after_a_death_a_handoff_and_rework_whatever_the_rig_runs() -> (
    None
):
    w = World()
    w.rig()
    w.bead("b1", agent="codex")
    first = w.running("b1")
    w.add(RigUpdated(rig="demo", agent_command="claude"))
    w.end(first, "dead", cleaned=False)
    respawn = only(w.plan(), Spawn)
    assert (respawn.resling, respawn.agent) == (True, "codex")
    w.bead("b1", forced=True)  # a re-sling that names no agent (as an older mayor wrote it) keeps the bead's
    second = w.request(respawn)
    w.start(second)
    w.end(second, "handoff", cleaned=False)
    handoff = only(w.plan(), Spawn)
    assert (handoff.handoff_of, handoff.agent) == (second, "codex")
    third = w.request(handoff)
    w.start(third)
    w.add(MergeRequestSubmitted(mr_id="mr-1", bead="b1", rig="demo", branch=handoff.branch, target="main", head="a"))
    w.end(third, "done", cleaned=True)
    w.add(MergeRequestFailed(mr_id="mr-1", gate="test", exit_code=1))
    rework = only(w.plan(), Spawn)
    assert (rework.attempt, rework.agent) == (4, "codex"), "sent back by the merge queue: still the bead's runtime"
    w.bead("b2")
    assert only([s for s in w.plan() if isinstance(s, Spawn) and s.bead == "b2"], Spawn).agent == "claude"


def test_a_re_sling_naming_another_agent_is_run_by_the_next_session_the_running_one_keeps_its_own() -> None:
    w = World()
    w.rig()
    w.bead("b1", agent="codex")
    first = w.running("b1")
    w.bead("b1", forced=True, agent="gemini")
    assert agent_of(w.state.sessions[first], w.state.rigs["demo"]) == "codex"
    assert not [a for a in w.plan() if isinstance(a, Spawn)], "one session at a time"
    w.end(first, "dead", cleaned=False)
    assert only(w.plan(), Spawn).agent == "gemini"


# ---- unsling and parked rigs -------------------------------------------------------------------


def test_an_unslung_beads_session_is_warranted_then_cleaned_keeping_its_worktree() -> None:
    w = World()
    w.rig()
    w.bead("b1")
    session = w.running("b1")
    w.add(BeadUnslung(bead_id="b1", rig="demo", reason="wrong rig"))
    warrant = only(w.plan(), Warrant)
    assert (warrant.session, warrant.reason) == (session, "unslung")
    w.add(SessionWarranted(session_id=session, reason="unslung"), SessionEnded(session_id=session, reason="unslung"))
    actions = w.plan(w.observe())
    clean = only(actions, Clean)
    assert (clean.session, clean.remove_worktree) == (session, False)
    assert not [a for a in actions if isinstance(a, Spawn | Escalate)], "no respawn, no escalation: no death"


def test_an_unsling_that_asks_for_it_removes_the_worktree_unless_slung_again() -> None:
    w = World()
    w.rig()
    w.bead("b1")
    session = w.running("b1")
    w.add(BeadUnslung(bead_id="b1", rig="demo", remove_worktree=True))
    w.add(SessionWarranted(session_id=session, reason="unslung"), SessionEnded(session_id=session, reason="unslung"))
    assert only(w.plan(w.observe()), Clean).remove_worktree
    w.bead("b1")  # slung again before the clean-up: the next session continues in the worktree
    assert not only(w.plan(w.observe()), Clean).remove_worktree


def test_a_parked_rig_starts_no_session_and_an_unparked_one_does() -> None:
    w = World()
    w.rig()
    w.add(RigParked(rig="demo"))
    w.bead("b1")
    assert not [a for a in w.plan() if isinstance(a, Spawn)]
    w.add(RigUnparked(rig="demo"))
    assert only(w.plan(), Spawn).bead == "b1"


def test_parking_lets_a_running_session_finish_and_holds_back_its_respawn() -> None:
    w = World()
    w.rig()
    w.bead("b1")
    session = w.running("b1")
    w.add(RigParked(rig="demo"))
    assert not [a for a in w.plan() if isinstance(a, Warrant | Kill)], "a running session is left alone"
    w.end(session, "dead")
    assert not [a for a in w.plan(w.observe()) if isinstance(a, Spawn)], "its respawn waits for the unpark"


def test_a_rig_update_applies_to_the_next_plan() -> None:
    w = World()
    w.rig(max_polecats=1)
    w.bead("b1")
    w.bead("b2")
    w.running("b1")
    assert not [a for a in w.plan() if isinstance(a, Spawn)], "one polecat at most"
    w.add(RigUpdated(rig="demo", max_polecats=2, agent_command="claude"))
    assert only(w.plan(), Spawn).bead == "b2"
    assert (w.state.rigs["demo"].agent_command, w.state.rigs["demo"].test_command) == ("claude", "")
