"""Rigs with ``--agent claude``: the real Claude Code CLI in real tmux, driven by the scripted model server, works
beads end to end through a real town (mayor, witness, refinery, real git), its usage recorded as the model server
sent it; a missing binary, missing credentials or a screen nobody answers are escalated naming the rig and the
session. The model server is the only fake."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from gt.model_server import ModelServer, Script, bash, edit, say, use, write
from services.witness.plan import session_id_for
from services.witness.settings import WitnessSettings
from services.witness.state import Session, UsageMark
from shared.core.config import TownConfig
from shared.host import git
from shared.model import runtimes
from shared.model.commands import RigPark, RigUnpark
from tests.claude_code import usage_recorded, usage_sent
from tests.helpers import assert_eventually
from tests.integration.test_agent_rework import commit_to_main
from tests.witness_town import PolecatTown, polecat_town

FIRST_RUN_SCREENS = ("trust this folder", "do you want to use this api key", "choose the text style", "select login")
"""Text of Claude Code's first-run screens (folder trust, custom key approval, onboarding): none may ever show."""
BEADS = int(os.environ.get("GT_TEST_CLAUDE_BEADS", "3"))
RUN_DEADLINE_S = 240.0


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, claude_witness_env: None) -> AsyncIterator[PolecatTown]:
    # The default grace after `gt done` (10 s): Claude Code writes its last answer (and its usage) to its transcript
    # after `gt done` returned; a shorter grace may end it first, and that answer's tokens would go unrecorded.
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


def polecat_story(name: str, bead: str, worktree: str, n: int) -> Script:
    """One polecat's session: prime, write and edit a file with Claude Code's own tools, commit, every step done
    (one stop half-way, which the Stop hook refuses), `gt done`."""
    feature = f"{worktree}/feature-{n}.txt"
    return Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context"), text="Let me see my hook."),
            use(bash("gt step done load-context", expect="load-context: done")),
            use(write(feature, f"feature {n}: draft\n"), text="Writing the feature."),
            use(edit(feature, "draft", "final", expect="updated successfully")),
            use(bash("gt step done implement", expect="implement: done")),
            use(bash(f"git add feature-{n}.txt && git commit -q -m '{bead}: feature {n}' && git log --oneline -1")),
            use(bash("gt step done commit", expect="commit: done")),
            say("I have committed the feature; that should be all."),
            use(
                bash("gt step done self-review && gt step done run-tests", expect="run-tests: done"),
                prompt="self-review",  # the Stop hook's reason: step self-review is still open
            ),
            use(bash("gt step done submit && gt done", expect="merge request")),
            say("Submitted to the merge queue."),
        ),
    )


async def test_claude_sessions_work_beads_end_to_end_through_the_refinery(
    pt: PolecatTown, town: TownConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", max_polecats=BEADS, stall_after_s=600.0)
    beads = [await pt.new_bead(f"Feature {n} [model-script:story-{n}]") for n in range(BEADS)]
    names = ["ace", "bob", "cat"]
    worktrees = [str(town.gt_home / "rigs" / "demo" / "polecats" / names[n]) for n in range(BEADS)]
    scripts = [polecat_story(f"story-{n}", beads[n], worktrees[n], n) for n in range(BEADS)]
    panes: dict[str, str] = {}
    operator_home = town.gt_home.parent / "operator-home"
    (operator_home / ".claude").mkdir(parents=True)
    (operator_home / ".claude.json").write_text('{"the": "operator\'s own"}')
    monkeypatch.setenv("HOME", str(operator_home))  # the witness's HOME: never the agent's
    monkeypatch.setenv("ANTHROPIC_MODEL", "claude-scripted-model")  # passed on without GT_AGENT_ENV
    async with ModelServer(scripts) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        for n, bead in enumerate(beads):
            await pt.sling(bead)
            [session] = await assert_eventually(functools.partial(pt.sessions_of, bead), timeout=30)
            assert session.polecat == names[n], "the scripts name each polecat's worktree"

        def merged_while_watching() -> bool:
            for bead in beads:
                for session in pt.sessions_of(bead):
                    if session.status == "started":
                        text = pt.tmux.capture(session.tmux_name) if session.tmux_name in pt.tmux.snapshot() else ""
                        panes[session.id] = text or panes.get(session.id, "")
            assert pt.refinery is not None
            merged = {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
            assert server.failures == [], server.failures
            assert set(beads) <= merged, (merged, [(s.id, s.status) for b in beads for s in pt.sessions_of(b)])
            return True

        await assert_eventually(merged_while_watching, timeout=RUN_DEADLINE_S, interval=0.5)
        # Settled while the model still answers: each agent's last turn, after `gt done`, needs its answer (a
        # closed model server leaves Claude Code retrying it for minutes, and its Stop hook never runs).
        settled = [await pt.wait_settled(bead) for bead in beads]

    assert server.failures == []
    for n, bead in enumerate(beads):
        sessions = settled[n]
        assert [s.end_reason for s in sessions] == ["done"], "one session per bead, no failed start, no stall"
        shown = git.git("show", f"main:feature-{n}.txt", cwd=pt.origin)
        assert shown == f"feature {n}: final\n", "Claude Code's own Write then Edit made the file"
        merged_files = git.git("ls-tree", "-r", "--name-only", "main", cwd=pt.origin).split()
        assert not any(".claude" in path for path in merged_files), "the hooks never reach the branch"
        # SessionStart ran `gt prime`: its text reached the model in the session's first request.
        first = server.turns(f"story-{n}")[0]
        assert "Current step: load-context" in json.dumps(first.body), "the SessionStart hook primed the session"
        # The Stop hook refused the stop half-way, naming the open step.
        after_stop = server.turns(f"story-{n}")[8]
        assert "self-review" in json.dumps(after_stop.body["messages"][-1])
        hook_log = (town.gt_home / "rigs" / "demo" / "sessions" / sessions[0].id / "hooks.log").read_text()
        assert "session-start" in hook_log
        assert "stop" in hook_log
        assert runtimes.turn_ended_after_done(hook_log), "`gt done` marked the log and the Stop hook came after it"
        # The witness claimed the bead for its polecat as it started the pane (Claude Code never runs `gt bead claim`).
        assert pt.mayor is not None
        assert pt.mayor.projection.state.beads[bead].assignee == f"demo/{sessions[0].polecat}"
    assert {request.body.get("model") for request in server.requests if request.kind == "turn"} == {
        "claude-scripted-model"
    }
    # The usage the witness recorded for each session is what the model server sent it, once.
    for n, bead in enumerate(beads):
        [session] = pt.sessions_of(bead)
        mark = await assert_eventually(functools.partial(final_usage, pt, session.id), timeout=RUN_DEADLINE_S)
        assert len(server.usage(f"story-{n}")) == len(scripts[n].turns)
        assert usage_recorded(mark, "claude-scripted-model") == usage_sent(server, f"story-{n}")
        assert mark.models[0].messages == len(scripts[n].turns)
    assert sorted(p.name for p in operator_home.rglob("*")) == [".claude", ".claude.json"], "nothing of the operator's"
    assert (operator_home / ".claude.json").read_text() == '{"the": "operator\'s own"}'
    assert panes, "the panes were seen while the sessions ran"
    for text in panes.values():
        for screen in FIRST_RUN_SCREENS:
            assert screen not in text.lower(), f"a first-run screen ({screen!r}) shows:\n{text}"


def build_output_story(bead: str) -> Script:
    """A session on a Python project without a .gitignore: it runs the project's tests (Python writes
    ``__pycache__`` into the worktree), commits nothing of that, marks its steps done and runs `gt done`."""
    steps = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")
    return Script(
        name="build-output",
        turns=(
            use(bash("gt prime", expect="Current step: load-context"), text="Let me see my hook."),
            use(bash("python3 -m unittest -v test_calc 2>&1 && ls", expect="__pycache__"), text="Running the tests."),
            use(bash(" && ".join(f"gt step done {step}" for step in steps), expect="submit: done")),
            use(bash("gt done", expect="merge request"), text="Submitting."),
            say(f"Submitted {bead}."),
        ),
    )


async def test_a_claude_session_that_ran_python_tests_hands_in_its_work_and_no_bytecode_is_merged(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a new user's trial on a plain clone of a Python project with no .gitignore: the session ran the
    tests, and `gt done` refused the worktree for the ``__pycache__`` they left. The witness lists build output in
    the rig clone's info/exclude for every runtime, so `gt done` finds the worktree clean and nothing of it merges."""
    commit_to_main(pt, {"calc.py": "def add(a, b):\n    return a + b\n", "test_calc.py": CALC_TEST})
    await pt.add_rig(agent_command="claude", stall_after_s=600.0, test_command="python3 -m unittest test_calc")
    bead = await pt.new_bead("Check the calculator [model-script:build-output]")
    async with ModelServer([build_output_story(bead)]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)

        def merged() -> bool:
            assert server.failures == [], server.failures
            assert pt.refinery is not None
            assert bead in {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
            return True

        await assert_eventually(merged, timeout=RUN_DEADLINE_S, interval=0.5)
        sessions = await pt.wait_settled(bead)  # while the model answers the turn after `gt done`
    assert server.failures == []
    assert [s.end_reason for s in sessions] == ["done"], "`gt done` took the worktree as clean at once"
    tree = git.git("ls-tree", "-r", "--name-only", "main", cwd=pt.origin).split()
    assert not [path for path in tree if "__pycache__" in path or path.endswith(".pyc")], tree


CALC_TEST = """import unittest

import calc


class CalcTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(calc.add(2, 3), 5)
"""


GUESTBOOK = "GUESTBOOK.txt"


def signs_and_meets_a_conflict(bead: str, worktree: str, origin: Path) -> Script:
    """A first session that signs the guest book, and (standing for another polecat's work landing first) pushes a
    different first line of it to main before its own `gt done`: the merge queue meets a conflict."""
    other = (
        f'd=$(mktemp -d) && git clone -q {origin} "$d" && printf "main was here\\n" > "$d/{GUESTBOOK}" && '
        f'git -C "$d" add {GUESTBOOK} && git -C "$d" commit -q -m "another polecat signs" && '
        'git -C "$d" push -q origin HEAD:main && echo "pushed to main"'
    )
    steps = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")
    return Script(
        name="signs",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(write(f"{worktree}/{GUESTBOOK}", "claude was here\n")),
            use(
                bash(
                    f"git add {GUESTBOOK} && git commit -q -m '{bead}: sign the guest book' && {other}", expect="pushed"
                )
            ),
            use(bash(" && ".join(f"gt step done {step}" for step in steps) + " && gt done", expect="merge request")),
            say("Submitted."),
        ),
    )


def reworks_the_conflict(bead: str) -> Script:
    """The session the conflict is sent back to: primed with the rework, it tries to stop (the Stop hook names the
    rework step), rebases and resolves keeping both lines, force-pushes, works the round's steps and `gt done`."""
    resolve = (
        "git fetch -q origin && (git rebase origin/main || true) && "
        f'printf "main was here\\nclaude was here\\n" > {GUESTBOOK} && git add {GUESTBOOK} && '
        "GIT_EDITOR=true git rebase --continue && git push -q --force-with-lease origin HEAD && git log --oneline -2"
    )
    round_ = ("rework-1-rebase", "rework-1-run-tests", "rework-1-submit")
    return Script(
        name="rework",
        turns=(
            use(bash("gt prime", expect="Current step: rework-1-rebase"), text="Let me see why it came back."),
            say("It was submitted already; nothing left to do."),
            use(bash(resolve, expect=f"{bead}: sign the guest book"), prompt="rework-1-rebase"),
            use(bash(" && ".join(f"gt step done {step}" for step in round_) + " && gt done", expect="merge request")),
            say("Resolved and resubmitted."),
        ),
    )


async def test_a_conflict_sent_back_to_claude_code_points_it_at_the_rework_steps_and_it_merges(
    pt: PolecatTown, town: TownConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a new user's trial: after `mr.conflicted` the fresh Claude Code session's beacon said every step
    was done, the Stop hook told it to run `gt done`, and `gt prime` led with the same. The mayor appends rework
    steps, and the real Claude Code session is pointed at them by all three."""
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)
    bead = await pt.new_bead("Sign the guest book [model-script:signs]")
    worktree = str(town.gt_home / "rigs" / "demo" / "polecats" / "ace")
    scripts = [signs_and_meets_a_conflict(bead, worktree, pt.origin), reworks_the_conflict(bead)]
    async with ModelServer(scripts) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)

        def started() -> Session:
            sessions = pt.sessions_of(bead)
            assert [s.status for s in sessions] == ["started"], sessions
            return sessions[0]

        first = await assert_eventually(started, timeout=60)
        # Parked, the rig starts no session for the conflict until the test names the next session's script.
        await pt.send(RigPark(name="demo", reason="the next session gets another script"))

        def sent_back() -> list[str]:
            assert server.failures == [], server.failures
            assert pt.mayor is not None
            steps = [s.id for s in pt.mayor.projection.state.molecules[bead].steps]
            assert "rework-1-rebase" in steps, steps
            assert [s.status for s in pt.sessions_of(bead)] == ["ended"]
            return steps

        await assert_eventually(sent_back, timeout=RUN_DEADLINE_S, interval=0.5)
        monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "x-gt-model-script: rework")
        await pt.send(RigUnpark(name="demo"))

        def merged() -> bool:
            assert server.failures == [], server.failures
            assert pt.refinery is not None
            assert bead in {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
            return True

        await assert_eventually(merged, timeout=RUN_DEADLINE_S, interval=0.5)
        sessions = await pt.wait_settled(bead)  # while the model answers the turn after `gt done`
    assert server.failures == []
    assert [s.id for s in sessions][:1] == [first.id]
    assert [s.end_reason for s in sessions] == ["done", "done"]
    assert git.git("show", f"main:{GUESTBOOK}", cwd=pt.origin) == "main was here\nclaude was here\n"
    # Its first request: the beacon names the rework step, and the SessionStart hook's `gt prime` leads with it.
    opening = json.dumps(server.turns("rework")[0].body)
    assert "current step rework-1-rebase" in opening
    assert "The merge queue sent your work back" in opening
    assert "The merge queue sent this work back: merge request" in opening
    assert "all done" not in opening
    # The Stop hook refused the stop naming the rework step, not `gt done`.
    after_stop = json.dumps(server.turns("rework")[2].body["messages"][-1])
    assert "rework-1-rebase" in after_stop
    assert "Every step" not in after_stop
    assert pt.mayor is not None
    steps = pt.mayor.projection.state.molecules[bead].steps
    assert [s.id for s in steps][-3:] == ["rework-1-rebase", "rework-1-run-tests", "rework-1-submit"]
    assert all(s.status == "done" for s in steps)


def final_usage(pt: PolecatTown, session: str) -> UsageMark:
    """The session's last usage record (``final``: read after its agent's process was gone)."""
    assert pt.witness is not None
    mark = pt.witness.state.usage.get(session)
    assert mark is not None, "no usage recorded yet"
    assert mark.final, mark
    return mark


async def unavailable_escalation(pt: PolecatTown, bead: str) -> str:
    """The message of the escalation a session that could not start its agent raised, once it also ended."""

    def escalated() -> str:
        assert pt.mayor is not None
        found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
        assert found, "no escalation yet"
        assert [s.escalated for s in pt.sessions_of(bead)] == ["agent_unavailable"]
        # Escalated first, then ended (so no plan in between takes it for a death): wait for both.
        assert [s.status for s in pt.sessions_of(bead)] == ["ended"], "not ended yet"
        return found[0].message

    message: str = await assert_eventually(escalated, timeout=30)
    return message


async def test_a_missing_claude_binary_is_escalated_naming_the_rig_and_the_session(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GT_CLAUDE_BIN", str(tmp_path / "no-such-claude"))
    await pt.add_rig(agent_command="claude")
    bead = await pt.new_bead("Needs an agent")
    await pt.sling(bead)

    message = await unavailable_escalation(pt, bead)
    [session] = pt.sessions_of(bead)
    assert "rig demo" in message
    assert session.id in message
    assert "claude binary was not found" in message
    assert "no-such-claude" in message
    assert session.status == "ended"
    assert session.end_reason == "failed_to_start"
    assert session.escalated == "agent_unavailable"
    assert pt.tmux.snapshot().get(session.tmux_name) is None, "no silent pane"
    assert len(pt.sessions_of(bead)) == 1, "not respawned: retrying changes nothing"


async def test_missing_claude_credentials_are_escalated_naming_the_rig_and_the_session(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    await pt.add_rig(agent_command="claude")
    bead = await pt.new_bead("Needs a key")
    await pt.sling(bead)

    message = await unavailable_escalation(pt, bead)
    [session] = pt.sessions_of(bead)
    assert "rig demo" in message
    assert session.id in message
    assert "ANTHROPIC_API_KEY" in message
    assert session.escalated == "agent_unavailable"


async def test_a_claude_pane_that_never_fires_its_start_hook_is_a_failed_start_naming_rig_and_session(
    town: TownConfig, nc: Client, tmp_path: Path, claude_witness_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A "claude" that comes up and then waits for ever, as one stuck at a screen nobody answers would.
    stuck = tmp_path / "stuck-claude"
    stuck.write_text("#!/bin/sh\necho 'Do you want to use this API key?'\nexec sleep 600\n")
    stuck.chmod(0o755)
    monkeypatch.setenv("GT_CLAUDE_BIN", str(stuck))
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, start_confirm_s=2.0)
    async with polecat_town(town, nc, tmp_path, settings) as pt:
        await pt.add_rig(agent_command="claude", max_respawns=0)
        bead = await pt.new_bead("Never starts")
        await pt.sling(bead)

        def escalated() -> str:
            assert pt.mayor is not None
            found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
            assert found, "no escalation yet"
            # A screen it knows is escalated first, then the session ended (so no plan in between respawns it).
            assert [s.status for s in pt.sessions_of(bead)][-1:] == ["ended"], "not ended yet"
            return found[0].message

        message = await assert_eventually(escalated, timeout=60)
        [session] = pt.sessions_of(bead)
    assert session.warrant_reason == "failed_to_start"
    assert "rig demo" in session.warrant_detail
    assert session.id in session.warrant_detail
    assert "no SessionStart hook" in session.warrant_detail
    assert "API key" in session.pane_tail, "the warrant keeps what the pane showed"
    assert session.end_reason == "failed_to_start"
    assert "rig demo" in message
    assert "failed_to_start" in message


OTHER_KEY = "sk-ant-api03-a-key-the-witness-never-approved-0123456789"


async def test_a_claude_stopped_at_a_screen_nobody_answers_is_escalated_at_once_with_what_it_shows(
    pt: PolecatTown, town: TownConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)  # start deadline 120 s, 3 respawns: the defaults
    bead = await pt.new_bead("Meets a dialog")
    # The session's config home holds user settings (as an operator's copied-in settings.json could) whose env names
    # another API key than the one the witness approved in the first-run state: Claude Code asks whether to use it.
    config = town.gt_home / "rigs" / "demo" / "sessions" / session_id_for(bead, 1) / "home" / ".claude"
    config.mkdir(parents=True)
    (config / "settings.json").write_text(json.dumps({"env": {"ANTHROPIC_API_KEY": OTHER_KEY}}))
    async with ModelServer([]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)

        def escalated() -> str:
            assert pt.mayor is not None
            found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
            assert found, ("no escalation yet", [(s.id, s.status) for s in pt.sessions_of(bead)])
            return found[0].message

        # At once: well before the start deadline (120 s), let alone three respawns into the same screen.
        message = await assert_eventually(escalated, timeout=60)

        def ended_and_kept() -> Session:
            [session] = pt.sessions_of(bead)
            assert session.status == "ended", session
            assert session.cleaned, session
            return session

        session = await assert_eventually(ended_and_kept, timeout=30)
    assert "rig demo" in message
    assert bead in message
    assert session.id in message
    assert "Do you want to use this API key?" in message, "the pane's text is in the escalation"
    assert session.escalated == "agent_blocked"
    assert session.warrant_reason == "failed_to_start"
    assert session.end_reason == "failed_to_start"
    assert "API key" in session.pane_tail
    assert pt.tmux.snapshot().get(session.tmux_name) is None, "its pane is gone"
    # Cleaned in the same patrol that would have respawned it: none was, nor will be.
    assert len(pt.sessions_of(bead)) == 1, "not respawned into the same screen"
    assert [r for r in server.requests if r.kind == "turn"] == [], "it never got to its first turn"
