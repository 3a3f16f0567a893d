"""The witness with real tmux, real git and the reference agent: spawning, the done flow, detection and
recovery, cleanup, nudges, and bad input."""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest
from nats.aio.client import Client

from services.witness.settings import WitnessSettings
from shared.bus.append import Appender
from shared.core.config import TownConfig
from shared.host import git, processes
from shared.model.decision import NewEvent
from shared.model.events import MoleculeAttached, SessionRequested, SessionStarted, StepCompleted, decode_envelope
from shared.service.intake import to_pending
from tests.helpers import assert_eventually
from tests.log_tools import read_all
from tests.witness_town import PolecatTown, polecat_town, run_gt

STEPS = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")


async def step_done_counts(pt: PolecatTown, bead: str) -> dict[str, int]:
    """How many step.done events the log holds per step of the bead's molecule."""
    counts: dict[str, int] = {}
    for _seq, _subject, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.{MoleculeAttached.AGGREGATE}.{bead}"):
        env = decode_envelope(data)
        if env.type == StepCompleted.TYPE:
            step = msgspec.json.decode(env.data)["step"]
            counts[step] = counts.get(step, 0) + 1
    return counts


def step_files(bead: str) -> list[str]:
    return [f"{i:02d}-{step}.txt" for i, step in enumerate(STEPS, start=1)]


async def merged(pt: PolecatTown, bead: str) -> None:
    """Until the bead's work is merged (its bead closed by the refinery)."""

    def closed() -> bool:
        assert pt.mayor is not None
        assert pt.mayor.projection.state.beads[bead].status == "closed"
        return True

    await assert_eventually(closed, timeout=120)


async def test_a_slung_bead_is_worked_submitted_and_cleaned_up(pt: PolecatTown) -> None:
    await pt.add_rig()
    bead = await pt.new_bead("Add a greeting")
    await pt.sling(bead)
    mr = await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["done"]
    session = sessions[0]
    assert session.worktree_removed, "given up: its polecat's name is free"
    assert await asyncio.to_thread(Path(session.worktree).is_dir), "kept for the polecat's next bead"
    assert "[gt-agent] done" in session.pane_tail.splitlines(), "its pane's last lines, recorded when it was ended"
    assert session.branch == f"polecat/ace/{bead}"
    assert mr["branch"] == session.branch
    await merged(pt, bead)  # published as a bundle: in the rig's repository once merged
    assert pt.branch_files(session.branch, bead) == step_files(bead)
    assert pt.branch_log(session.branch)[0] == f"{bead}: submit"
    assert git.git("log", "-1", "--format=%s", mr["head"], cwd=pt.origin).strip() == f"{bead}: submit"
    assert pt.mayor is not None
    molecule = pt.mayor.projection.state.molecules[bead]
    assert all(s.status == "done" for s in molecule.steps)
    await assert_eventually(lambda: pt.tmux.snapshot() == {}, message="the finished session's tmux is gone")


def crash_at_every_step() -> str:
    """Attempt k crashes at step k (after committing it, before `gt step done`), for each of the 6 steps."""
    return "GT_AGENT_FAULT=" + ",".join(f"crash-at-step={k}@{k}" for k in range(1, 7)) + " gt-agent"


async def test_kill_9_at_each_of_six_steps_loses_nothing_and_redoes_nothing(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command=crash_at_every_step(), max_respawns=6)
    bead = await pt.new_bead("Survive six deaths")
    await pt.sling(bead)
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["zombie"] * 6 + ["done"]
    assert [s.attempt for s in sessions] == list(range(1, 8))
    assert {s.polecat for s in sessions} == {"ace"}, "every fresh session reuses the polecat and its worktree"
    assert pt.mayor is not None
    molecule = pt.mayor.projection.state.molecules[bead]
    assert [s.status for s in molecule.steps] == ["done"] * 6
    assert await step_done_counts(pt, bead) == dict.fromkeys(STEPS, 1), "each step done exactly once"
    branch = sessions[-1].branch
    await merged(pt, bead)  # published as a bundle: in the rig's repository once merged
    assert pt.branch_files(branch, bead) == step_files(bead)
    assert pt.branch_log(branch)[:6] == [f"{bead}: {step}" for step in reversed(STEPS)]
    assert len(pt.branch_log(branch)) == 7, "one commit per step on top of main: no step committed twice"


def agent_process(pane_pid: int) -> psutil.Process:
    """The agent: the process the pane's reaper runs (the shell of the rig's agent command, or what it exec'd)."""
    children = psutil.Process(pane_pid).children()
    assert children, f"the pane's reaper (pid {pane_pid}) runs nothing yet"
    return children[0]


async def started_session(pt: PolecatTown, bead: str, attempt: int) -> tuple[str, int, str]:
    """Wait for the bead's session of ``attempt`` to be started; its id, pane pid and tmux name."""

    def started() -> tuple[str, int, str]:
        sessions = pt.sessions_of(bead)
        assert len(sessions) >= attempt, f"no session {attempt} yet"
        s = sessions[attempt - 1]
        assert s.status == "started", s.status
        assert s.pane_pid is not None
        return s.id, s.pane_pid, s.tmux_name

    found: tuple[str, int, str] = await assert_eventually(started, timeout=60, interval=0.05)
    return found


async def test_an_agent_gets_its_own_environment_and_nothing_of_the_witnesss(
    town: TownConfig, nc: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tmux server starts from this environment: a secret in it must not reach the agent, and PATH must
    # be the agent's even though tmux puts its client's PATH into new sessions.
    monkeypatch.setenv("WITNESS_ONLY_SECRET", "s3cret")
    monkeypatch.setenv("EXTRA_FOR_AGENTS", "passed on")
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    home = tmp_path / "home-without-git-identity"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # as on a fresh machine: the agent still commits
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, agent_env=("EXTRA_FOR_AGENTS",))
    async with polecat_town(town, nc, tmp_path, settings) as pt:
        await pt.add_rig(agent_command='env > "$GT_WORKTREE/../$GT_SESSION.env"; gt-agent')
        bead = await pt.new_bead("Look at your environment")
        await pt.sling(bead)
        mr = await pt.wait_merge_requested(bead)
        session = (await pt.wait_settled(bead))[0]
        published = pt.config.gt_home / "rigs" / "demo" / "refinery" / "repo.git"  # imported from its bundle
        author = git.git("log", "-1", "--format=%an <%ae>", mr["head"], cwd=published)
    assert author.strip() == "demo/ace <ace.demo@gastown.invalid>", "the witness gives the session its git identity"
    dumped = Path(session.worktree).parent / f"{session.id}.env"
    seen = dict(line.split("=", 1) for line in dumped.read_text().splitlines() if "=" in line)
    assert "WITNESS_ONLY_SECRET" not in seen
    assert seen["EXTRA_FOR_AGENTS"] == "passed on"
    assert seen["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert (seen["GT_SESSION"], seen["GT_BEAD"], seen["TERM"]) == (session.id, bead, "screen-256color")
    assert seen["HOME"] == str(home)
    assert not any(key.startswith("TMUX") for key in seen), "nothing of the tmux server's environment"


async def test_an_agent_killed_9_makes_a_zombie_and_a_lost_tmux_session_is_dead(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang@1-2 gt-agent")
    bead = await pt.new_bead("Outlive your agents")
    await pt.sling(bead)
    _, pane_pid, _ = await started_session(pt, bead, 1)
    agent = await assert_eventually(lambda: agent_process(pane_pid))
    agent.kill()  # kill -9 the agent: its pane stays (dead) in a live tmux session
    _, _, tmux_name = await started_session(pt, bead, 2)
    pt.tmux.kill(tmux_name)  # the whole tmux session disappears
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["zombie", "dead", "done"]
    assert [s.warrant_reason for s in sessions] == ["zombie", "dead", None]


async def test_a_stalled_agent_is_warranted_unless_it_heartbeats(pt: PolecatTown, gt_env: dict[str, str]) -> None:
    # Ten seconds leave room for a `gt heartbeat` process to start on a loaded machine (three did not in six, beside
    # a 1,000-bead chaos run), and for the fresh session's agent to show its first sign of life on two busy cores
    # (at six it was warranted too, beside the suite's heaviest tests); the heartbeats below go on for longer.
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang@1 gt-agent", stall_after_s=10.0)
    bead = await pt.new_bead("Do not stall")
    await pt.sling(bead)
    session_id, _, _ = await started_session(pt, bead, 1)
    env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_SESSION": session_id, "GT_BEAD": bead, "GT_RIG": "demo"}
    env.update(GT_WORKTREE=pt.sessions_of(bead)[0].worktree, GT_BRANCH=pt.sessions_of(bead)[0].branch)
    # Heartbeats keep a session that makes no step progress from being judged stalled.
    deadline = time.monotonic() + 13.0
    while time.monotonic() < deadline:
        beat = await run_gt(env, "heartbeat", "--note", "thinking")
        assert beat.returncode == 0, beat.stderr
        assert pt.sessions_of(bead)[0].warrant_reason is None
    # Without them it is warranted, killed and its bead continues in a fresh session.
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [("stalled", "stalled"), (None, "done")]


GIVES_UP = "echo \"make: *** No rule to make target 'test'.  Stop.\" >&2; exit 2"
"""A rig test command that fails as a project without a test target does: the reference agent gives up on it."""


async def logged_at(pt: PolecatTown, session: str, event_type: str) -> datetime:
    """When the log recorded the session's ``event_type`` (its envelope's timestamp)."""
    for _seq, _subject, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.session.{session}"):
        env = decode_envelope(data)
        if env.type == event_type:
            return env.ts
    raise AssertionError(f"no {event_type} for {session}")


async def test_a_failing_agent_is_respawned_with_a_backoff_and_its_cause_is_shown_everywhere(
    town: TownConfig, nc: Client, tmp_path: Path, gt_env: dict[str, str]
) -> None:
    backoff = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, respawn_backoff_s=1.0)
    async with polecat_town(town, nc, tmp_path, backoff) as pt:
        await pt.add_rig(test_command=GIVES_UP, max_respawns=3)
        bead = await pt.new_bead("Cannot pass its tests")
        await pt.sling(bead)

        def escalated() -> list[Any]:
            sessions = pt.sessions_of(bead)
            assert len(sessions) == 4, [(s.id, s.status) for s in sessions]
            assert sessions[-1].escalated == "respawn_limit", "not escalated yet"
            return sessions

        sessions = await assert_eventually(escalated, timeout=120)
        assert [s.end_reason for s in sessions] == ["zombie"] * 4, "its agent exits: each pane stays, dead"
        assert [s.steps_done for s in sessions] == [4, 0, 0, 0], "the first got four steps done, the others none"

        # The backoff, from the log's timestamps: the first death came after progress and the first quick death
        # is one crash (both respawned at once); the second quick death in a row is a crash loop: it waits 1 s.
        gaps = [
            (await logged_at(pt, later.id, "session.requested") - await logged_at(pt, earlier.id, "session.ended"))
            for earlier, later in itertools.pairwise(sessions)
        ]
        assert gaps[2].total_seconds() >= 1.0, gaps

        # The cause, as the agent said it, where an operator looks.
        said = "giving up: tests fail (2): make: *** No rule to make target 'test'.  Stop."
        last = sessions[-1]
        assert said in last.pane_tail
        env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home)}
        shown = await run_gt(env, "session", "show", last.id)
        assert shown.returncode == 0, shown.stderr
        assert "warranted: zombie" in shown.stdout
        assert "its pane's last lines when it was warranted:" in shown.stdout
        assert f"  | [gt-agent] {said}" in shown.stdout
        history = await run_gt(env, "bead", "history", bead)
        assert history.returncode == 0, history.stderr
        assert history.stdout.count(f"| [gt-agent] {said}") == 4, history.stdout

        def raised() -> Any:
            assert pt.mayor is not None
            found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
            assert found, "not raised yet"
            return found

        [escalation] = await assert_eventually(raised, timeout=30)
        assert f"Its last session {last.id} showed:" in escalation.message
        assert said in escalation.message
        listed = await run_gt(env, "escalations")
        assert said in listed.stdout, listed.stdout
        assert pt.witness is not None
        assert pt.mayor is not None
        assert not pt.witness.state.mass_deaths, "one bead dying again and again is no mass death"
        assert [e.source for e in pt.mayor.projection.state.escalations.values()] == ["witness/demo"]

        # Given up by the operator: the escalation about it closes by itself.
        closed = await run_gt(env, "bead", "close", bead, "--reason", "no tests to run yet")
        assert closed.returncode == 0, closed.stderr

        def resolved() -> bool:
            assert pt.mayor is not None
            found = pt.mayor.projection.state.escalations[escalation.id]
            assert (found.status, found.closed_by) == ("closed", "mayor"), found.status
            assert found.close_reason == f"resolved: bead {bead} closed: no tests to run yet"
            return True

        await assert_eventually(resolved, timeout=30)


async def test_a_mass_death_quotes_a_pane_and_closes_by_itself_once_a_session_of_the_rig_finishes(
    pt: PolecatTown,
) -> None:
    # Each bead's first session is killed before it gets a step done; the second ones work.
    await pt.add_rig(agent_command="GT_AGENT_FAULT=crash-before-commit=1@1 gt-agent")
    beads = [await pt.new_bead(f"Survive {n}") for n in range(3)]
    for bead in beads:
        await pt.sling(bead)

    def raised() -> Any:
        assert pt.mayor is not None
        found = [e for e in pt.mayor.projection.state.escalations.values() if e.message.startswith("mass death")]
        assert found, "no mass death yet"
        return found[0]

    mass = await assert_eventually(raised, timeout=90)
    assert mass.severity == "critical"
    assert mass.resolved_when == ["rig:demo"]
    assert "3 sessions of 3 beads died" in mass.message
    assert "[gt-agent] crashing (fault injection: SIGKILL)" in mass.message, mass.message

    def resolved() -> Any:
        assert pt.mayor is not None
        found = pt.mayor.projection.state.escalations[mass.id]
        assert found.status == "closed", "still open"
        return found

    closed = await assert_eventually(resolved, timeout=120)
    assert closed.closed_by == "mayor"
    assert closed.close_reason is not None
    done = [s.id for bead in beads for s in pt.sessions_of(bead) if s.end_reason == "done"]
    assert any(closed.close_reason == f"resolved: session {s} of rig demo finished its work" for s in done), (
        closed.close_reason,
        done,
    )


async def test_an_agents_escalation_from_its_session_closes_by_itself_once_its_bead_is_closed(pt: PolecatTown) -> None:
    # The agent asks for help first (as `gt escalate` from its session), then does its work, which merges.
    await pt.add_rig(agent_command="gt escalate 'the docs say nothing of v2: I guessed' --severity low; exec gt-agent")
    bead = await pt.new_bead("Guess well")
    await pt.sling(bead)

    def closed() -> Any:
        assert pt.mayor is not None
        found = [e for e in pt.mayor.projection.state.escalations.values() if e.source.startswith("polecat:demo/")]
        assert found, "not raised yet"
        assert found[0].resolved_when == [f"bead:{bead}"], "its session's bead resolves it"
        assert found[0].status == "closed", "still open"
        return found[0]

    escalation = await assert_eventually(closed, timeout=120)
    assert pt.mayor is not None
    assert pt.mayor.projection.state.beads[bead].status == "closed"
    assert escalation.closed_by == "mayor"
    assert escalation.close_reason is not None
    assert escalation.close_reason.startswith(f"resolved: bead {bead} closed")


async def test_uncommitted_work_survives_a_crash_and_lands(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=crash-before-commit=2@1 gt-agent")
    bead = await pt.new_bead("Keep my edits")
    await pt.sling(bead)
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["zombie", "done"]
    assert sessions[0].worktree == sessions[1].worktree
    await merged(pt, bead)  # published as a bundle: in the rig's repository once merged
    log = pt.branch_log(sessions[1].branch)
    assert f"{bead}: work an earlier session left uncommitted" in log, "the dead session's edit was kept"
    assert pt.branch_files(sessions[1].branch, bead) == step_files(bead)


async def test_a_dirty_worktree_is_never_removed_when_the_bead_is_escalated(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=crash-before-commit=3 gt-agent", max_respawns=0)
    bead = await pt.new_bead("Always dies dirty")
    await pt.sling(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["zombie"]
    last = sessions[-1]
    assert last.escalated == "respawn_limit"
    assert not last.worktree_removed
    state = git.worktree_state(Path(last.worktree), "main")
    assert state.exists
    assert state.dirty, "the uncommitted edit is still there for a person to recover"
    assert state.unpushed == 2, "and so are the commits never pushed"
    assert pt.mayor is not None
    escalations = list(pt.mayor.projection.state.escalations.values())
    assert any(e.bead == bead and "re-sling" in e.message for e in escalations)
    assert not pt.tmux.snapshot(), "no tmux session is left running"


async def test_a_handoff_starts_a_fresh_session_on_the_same_hook(pt: PolecatTown, gt_env: dict[str, str]) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang@1 gt-agent")
    bead = await pt.new_bead("Hand it over")
    await pt.sling(bead)
    session_id, _, _ = await started_session(pt, bead, 1)
    first = pt.sessions_of(bead)[0]
    env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_SESSION": session_id, "GT_BEAD": bead, "GT_RIG": "demo"}
    env.update(GT_WORKTREE=first.worktree, GT_BRANCH=first.branch)
    done = await run_gt(env, "handoff", "--note", "context full")
    assert done.returncode == 0, done.stderr
    assert "handed off" in done.stdout
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.end_reason for s in sessions] == ["handoff", "done"]
    assert sessions[1].handoff_of == sessions[0].id
    assert sessions[1].polecat == sessions[0].polecat
    assert pt.mayor is not None
    assert pt.mayor.projection.state.beads[bead].slings == 1, "a handoff keeps the hook: no re-sling"


async def nudge_delivered(pt: PolecatTown, target: str, message: str) -> Any:
    """Send a nudge and wait until the witness recorded it delivered; its record."""
    queued = await pt.ok("gt.cmd.nudge.send", target=target, message=message)
    assert pt.witness is not None
    nudges = pt.witness.state.nudges
    await assert_eventually(lambda: getattr(nudges.get(queued["id"]), "status", None) == "delivered", timeout=30)
    return nudges[queued["id"]]


async def test_nudges_reach_the_agent_queue_while_away_and_expire(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="GT_AGENT_STEP_PAUSE=1 gt-agent")
    bead = await pt.new_bead("Listen to nudges")
    await pt.sling(bead)
    session_id, _, tmux_name = await started_session(pt, bead, 1)
    assert (await nudge_delivered(pt, "demo/ace", "please also update the docs")).delivered_to == session_id
    assert pt.witness is not None
    nudges = pt.witness.state.nudges
    await assert_eventually(lambda: "heard: please also update the docs" in pt.tmux.capture(tmux_name), timeout=30)
    await pt.wait_settled(bead)
    # The session is gone: a nudge to it waits for the polecat's next session, and expires after its TTL.
    later = await pt.ok("gt.cmd.nudge.send", target=session_id, message="anyone there?", ttl_s=1.0)
    assert later["polecat"] == "ace"
    # The outcome can be read before the witness's own projection applied the nudge: look it up each time.
    await assert_eventually(lambda: getattr(nudges.get(later["id"]), "status", None) == "expired", timeout=30)


async def test_a_nudge_into_a_pane_that_reads_nothing_is_typed_once_and_delivered(pt: PolecatTown) -> None:
    # A hung agent reads nothing: Enter only moves the pane's cursor, the text shown stays the same. The witness
    # must see the key took (by the cursor) and record the delivery, not type the nudge again and again.
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang gt-agent")
    bead = await pt.new_bead("Hangs")
    await pt.sling(bead)
    session_id, _, tmux_name = await started_session(pt, bead, 1)
    assert (await nudge_delivered(pt, "demo/ace", "are you still there")).delivered_to == session_id
    # A second nudge, delivered after the witness planned and worked again: neither is typed twice.
    await nudge_delivered(pt, "demo/ace", "a second question")
    screen = pt.tmux.capture(tmux_name).replace("\n", "")
    assert (screen.count("are you still there"), screen.count("a second question")) == (1, 1), screen


async def test_nudges_to_unknown_targets_are_rejected(pt: PolecatTown) -> None:
    await pt.add_rig()
    for target, expected in (
        ("hq-nosuch-1", "no session or polecat 'hq-nosuch-1'"),
        ("demo/nobody", "rig demo has no polecat 'nobody' (its polecats: none yet)"),
        ("nope/ace", "no rig 'nope'"),
    ):
        outcome = await pt.command("gt.cmd.nudge.send", target=target, message="hello")
        assert outcome["type"] == "cmd.rejected", outcome
        assert outcome["code"] == "not_found", outcome
        assert expected in outcome["message"]
    blank = await pt.command("gt.cmd.nudge.send", target="demo/ace", message="two\nlines")
    assert blank["code"] == "invalid"
    assert "one line" in blank["message"]


async def test_rig_add_rejects_what_cannot_work(pt: PolecatTown, tmp_path: Path) -> None:
    missing = await pt.command("gt.cmd.rig.add", name="ghost", repo=str(tmp_path / "no-such-repo.git"))
    assert missing["type"] == "cmd.rejected"
    assert missing["code"] == "not_found"
    assert "cannot read repository" in missing["message"]
    no_branch = await pt.command("gt.cmd.rig.add", name="ghost", repo=str(pt.origin), base_branch="develop")
    assert no_branch["code"] == "not_found"
    assert "has no branch 'develop' (it has: main)" in no_branch["message"]
    relative = await pt.command("gt.cmd.rig.add", name="ghost", repo="origin.git")
    assert relative["code"] == "invalid"
    assert "absolute path or a URL" in relative["message"]
    assert (await pt.add_rig())["changed"] is True
    assert (await pt.add_rig())["changed"] is False, "the same rig again is harmless"
    other = await pt.command("gt.cmd.rig.add", name="demo", repo=str(pt.origin), max_polecats=9)
    assert other["code"] == "conflict"
    assert "different configuration" in other["message"]
    assert pt.witness is not None
    assert list(pt.witness.state.rigs) == ["demo"]


async def test_gt_done_outside_a_session_and_in_a_dirty_worktree_is_refused(
    pt: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    env = {k: v for k, v in gt_env.items() if not k.startswith("GT_")}
    env["NATS_URL"] = pt.config.nats_url
    outside = await run_gt(env, "done")
    assert outside.returncode == 2
    assert "runs inside a polecat session" in outside.stderr
    assert "GT_SESSION" in outside.stderr
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang@1 gt-agent")
    bead = await pt.new_bead("Refuse dirty work")
    await pt.sling(bead)
    session_id, _, _ = await started_session(pt, bead, 1)
    session = pt.sessions_of(bead)[0]
    worktree = Path(session.worktree)
    # Build output is no one's work: the witness listed it in the clone's info/exclude (the agent here never ran).
    (worktree / "__pycache__").mkdir()
    (worktree / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (worktree / ".pytest_cache").mkdir()
    (worktree / ".pytest_cache" / "README.md").write_text("cache\n")
    (worktree / "notes.txt").write_text("not committed\n")
    for n in range(6):
        (worktree / f"extra-{n}.txt").write_text("also not committed\n")
    env.update(
        GT_SESSION=session_id, GT_BEAD=bead, GT_RIG="demo", GT_WORKTREE=session.worktree, GT_BRANCH=session.branch
    )
    dirty = await run_gt(env, "done")
    assert dirty.returncode == 1
    assert "uncommitted changes" in dirty.stderr
    # It names what holds it up (a few, then how many more) and the ways out.
    assert "extra-0.txt, extra-1.txt, extra-2.txt, extra-3.txt, extra-4.txt and 2 more" in dirty.stderr
    assert "__pycache__" not in dirty.stderr, dirty.stderr
    assert ".pytest_cache" not in dirty.stderr, dirty.stderr
    assert "commit" in dirty.stderr
    assert "remove" in dirty.stderr
    assert ".gitignore" in dirty.stderr
    assert pt.sessions_of(bead)[0].done_intent_at is None, "nothing was recorded"


async def test_a_young_orphan_is_left_alone_and_an_old_one_killed(town: TownConfig, nc: Client, tmp_path: Path) -> None:
    settings = WitnessSettings(min_orphan_age_s=4.0, kill_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as pt:
        assert pt.witness is not None
        pt.tmux.start("gt-demo-stray", "sleep 600", cwd=str(tmp_path), env={}, label="")
        pt.tmux.start("gt-demo-unknown", "sleep 600", cwd=str(tmp_path), env={}, label="hq-unknown-1")
        pt.tmux.start("other-work", "sleep 600", cwd=str(tmp_path), env={}, label="")
        passes = pt.witness.reconciles
        await assert_eventually(lambda: pt.witness is not None and pt.witness.reconciles >= passes + 3)
        assert {"gt-demo-stray", "gt-demo-unknown"} <= set(pt.tmux.snapshot()), "young orphans are not touched"
        await assert_eventually(lambda: set(pt.tmux.snapshot()) == {"other-work"}, timeout=30)


async def test_a_reused_pid_is_never_signalled(pt: PolecatTown, tmp_path: Path) -> None:
    """The session's recorded agent pid now belongs to an unrelated process (started later, elsewhere)."""
    signals = tmp_path / "signals.txt"
    trap = "; ".join(
        f"signal.signal(signal.{s}, lambda n, f: open({str(signals)!r}, 'a').write(str(n)))"
        for s in ("SIGTERM", "SIGHUP", "SIGINT", "SIGUSR1")
    )
    unrelated = subprocess.Popen([sys.executable, "-c", f"import signal, time; {trap}; time.sleep(600)"])
    try:
        await pt.add_rig()
        await pt.stop("witness")
        bead = await pt.new_bead("Whose pid is it")
        await pt.sling(bead)
        session_id = f"{bead}-1"
        tmux_name = "gt-demo-ace"
        pt.tmux.start(tmux_name, "sleep 600", cwd=str(tmp_path), env={}, label=session_id)
        recorded = processes.ProcessRef(pid=unrelated.pid, started=psutil.Process(unrelated.pid).create_time() - 50)
        await append_events(
            pt,
            NewEvent(
                payload=SessionRequested(
                    session_id=session_id,
                    rig="demo",
                    polecat="ace",
                    bead=bead,
                    worktree=str(tmp_path / "wt"),
                    branch=f"polecat/ace/{bead}",
                    tmux_name=tmux_name,
                    attempt=1,
                ),
                expected_seq=0,
            ),
            NewEvent(
                payload=SessionStarted(session_id=session_id, pane_pid=recorded.pid, pid_started=recorded.started),
                expected_seq=None,
            ),
        )
        assert not processes.send_signal(recorded, signal.SIGTERM), "the process layer refuses on its own"
        await pt.start_witness(WitnessSettings(kill_grace_s=1.0))
        await assert_eventually(lambda: pt.sessions_of(bead)[0].status == "ended", timeout=30)
        first = pt.sessions_of(bead)[0]
        assert first.warrant_reason == "zombie", "a pid held by another process is no sign of life"
        assert tmux_name not in pt.tmux.snapshot() or pt.tmux.snapshot()[tmux_name].label != session_id
        assert unrelated.poll() is None
        assert psutil.pid_exists(unrelated.pid)
        assert not signals.exists() or signals.read_text() == "", "the unrelated process got no signal"
        await pt.wait_merge_requested(bead)
    finally:
        unrelated.kill()
        unrelated.wait()


async def append_events(pt: PolecatTown, *events: NewEvent) -> None:
    appender = Appender(pt.nc, pt.config.evt_stream)
    now = datetime.now(UTC)
    for event in events:
        await appender.append([to_pending(event, ts=now, actor="witness", causation_id=None, correlation_id=None)])
