"""Liveness of agents that never call `gt` (docs/agents.md, "Liveness"): the planner counts a runtime's activity
(tool-call hook, transcript; the tmux pane for command runtimes) as a sign of life, and the witness renews a busy
agent's hook lease on its behalf without weakening fencing. Pure."""

from __future__ import annotations

import functools
import json
from datetime import timedelta

import msgspec

from services.witness.plan.actions import Warrant
from services.witness.plan.liveness import Renewal, renewals_owed, still_starting
from shared.core.ids import hook_lease_name
from shared.model.events import LeaseAcquired, LeaseExpired, RigUpdated
from shared.model.runtimes import ACTIVITY_HOOK, ClaudeRuntime, runtime_for
from tests.unit.test_witness_plan import World, only


def claude_world(stall_after_s: float = 60, agent: str = "claude") -> tuple[World, str]:
    """A rig running ``agent`` (Claude Code unless told) and one session of it, started."""
    w = World()
    w.rig(stall_after_s=stall_after_s)
    w.add(RigUpdated(rig="demo", agent_command=agent))
    w.bead("gt-abc")
    return w, w.running("gt-abc")


def test_a_claude_session_busy_with_its_tools_is_not_stalled_until_its_activity_stops() -> None:
    w, session = claude_world()
    pane = w.pane(session)
    for _ in range(3):  # three stall limits of tool calls, no `gt`
        w.tick(50)
        busy = w.observe(pane, start_confirmed=frozenset({session}), activity={session: w.clock})
        assert w.plan(busy) == []
    w.tick(61)
    quiet = w.observe(pane, start_confirmed=frozenset({session}), activity={session: w.clock - timedelta(seconds=61)})
    warrant = only(w.plan(quiet), Warrant)
    assert warrant.reason == "stalled"
    assert "agent activity for 61s" in warrant.detail


def test_claude_pane_output_is_no_sign_of_life_but_a_command_runtimes_is() -> None:
    w, session = claude_world()
    w.tick(100)
    redrawing = msgspec.structs.replace(w.pane(session), activity=int(w.clock.timestamp()))
    confirmed = frozenset({session})
    assert only(w.plan(w.observe(redrawing, start_confirmed=confirmed)), Warrant).reason == "stalled", (
        "Claude Code's spinner redraws while its model never answers"
    )
    # A session runs what it was requested with (a rig changed later leaves it be): a rig of a command runtime.
    w, session = claude_world(agent="aider --yes {beacon}")
    w.tick(100)
    redrawing = msgspec.structs.replace(w.pane(session), activity=int(w.clock.timestamp()))
    assert w.plan(w.observe(redrawing)) == [], "a command runtime shows nothing but its pane"
    assert only(w.plan(w.observe(w.pane(session))), Warrant).reason == "stalled"


def test_a_claude_session_not_yet_confirmed_is_judged_by_the_start_deadline_not_the_stall_limit() -> None:
    w, session = claude_world(stall_after_s=5)
    w.tick(30)
    assert w.plan(w.observe(w.pane(session))) == [], "still booting: the start deadline (120 s) applies"
    w.tick(100)
    assert only(w.plan(w.observe(w.pane(session))), Warrant).reason == "failed_to_start"


def test_the_post_tool_use_hook_marks_activity_with_no_process_of_its_own() -> None:
    hooks = ClaudeRuntime().settings_local("/opt/gt/bin/gt")["hooks"]
    [entry] = hooks["PostToolUse"]
    assert entry["matcher"] == "*", "every tool"
    assert [h["command"] for h in entry["hooks"]] == [ACTIVITY_HOOK]
    assert ACTIVITY_HOOK == ': > "$GT_SESSION_DIR/activity"', "a shell redirection only: no `gt`, no Python"
    assert "activity" in runtime_for("claude").activity_files
    assert json.loads(json.dumps(hooks)) == hooks


def held(w: World, session: str, token: int = 1, ttl_s: float = 60) -> None:
    w.add(
        LeaseAcquired(
            lease=hook_lease_name("gt-abc"),
            holder=session,
            token=token,
            ttl_s=ttl_s,
            expires_at=w.clock + timedelta(seconds=ttl_s),
        )
    )


def test_a_busy_agents_hook_lease_is_renewed_once_per_new_activity_at_most_every_quarter_ttl() -> None:
    w, session = claude_world()
    held(w, session)
    lease = hook_lease_name("gt-abc")
    w.tick(30)
    assert renewals_owed(w.state, {session: w.clock}, {}, w.clock) == [Renewal(session=session, lease=lease, token=1)]
    renewed = {session: w.clock}
    w.tick(5)
    assert renewals_owed(w.state, {session: w.clock}, renewed, w.clock) == [], "coalesced: a quarter TTL apart"
    w.tick(15)
    assert renewals_owed(w.state, {session: renewed[session]}, renewed, w.clock) == [], "no new activity"
    assert len(renewals_owed(w.state, {session: w.clock}, renewed, w.clock)) == 1
    stale = w.clock - timedelta(seconds=60)
    assert renewals_owed(w.state, {session: stale}, {}, w.clock) == [], "activity a TTL old vouches for nothing"


def test_a_lost_hook_lease_is_never_renewed_for_the_session_that_lost_it() -> None:
    w, session = claude_world()
    held(w, session)
    w.add(LeaseExpired(lease=hook_lease_name("gt-abc"), holder=session, token=1, last_renewed=w.clock))
    assert renewals_owed(w.state, {session: w.clock}, {}, w.clock) == [], "expired: fenced out"
    held(w, "gt-abc-2", token=2)
    assert renewals_owed(w.state, {session: w.clock}, {}, w.clock) == [], "a newer session holds it"


def test_a_runtime_still_starting_is_alive_until_its_start_deadline_so_its_lease_is_renewed() -> None:
    w, session_id = claude_world(stall_after_s=15)
    session = w.state.sessions[session_id]
    assert session.started_at is not None
    soon = session.started_at + timedelta(seconds=20)
    starting = functools.partial(still_starting, session, confirms_start=True, now=soon, deadline_s=120)
    assert starting(confirmed=False), "past its lease's TTL, no hook yet: its start is its sign of life"
    assert not starting(confirmed=True), "confirmed: its hooks and files speak for it from now on"
    assert not still_starting(session, confirms_start=False, confirmed=False, now=soon, deadline_s=120)
    late = session.started_at + timedelta(seconds=121)
    assert not still_starting(session, confirms_start=True, confirmed=False, now=late, deadline_s=120)
