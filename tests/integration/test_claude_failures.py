"""How a ``--agent claude`` rig lives through agent failures (docs/agents.md, "Claude Code failures"): the real
Claude Code CLI in real tmux, a real town, the scripted model server as the only fake. Each test is one scenario:
the agent killed while its tool runs, a nudge typed while it generates, a ``/clear``, the context exhausted (an
automatic compaction). The scenarios every runtime shares are in test_runtime_conformance.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from nats.aio.client import Client

from gt.model_server import Fault, ModelServer, Script, bash, exhaust_context, say, use
from gt.model_server.server import RecordedRequest
from services.witness.settings import WitnessSettings
from services.witness.state import Session, continue_nudge_id
from shared.core.config import TownConfig
from tests.helpers import assert_eventually, running_with
from tests.log_tools import events_of
from tests.witness_town import PolecatTown, polecat_town

STEPS = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, claude_witness_env: None) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, done_exit_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


def finish(*, first: str = "commit") -> tuple[Any, ...]:
    """The turns that take a session from step ``first`` (its prime says so) to `gt done`."""
    rest = STEPS[STEPS.index(first) :]
    return (
        use(bash(" && ".join(f"gt step done {s}" for s in rest[:-1]), expect=f"{rest[-2]}: done")),
        use(bash("gt step done submit && gt done", expect="merge request")),
        say("Submitted to the merge queue."),
    )


def session_requests(server: ModelServer, script: str) -> dict[str, list[RecordedRequest]]:
    """A script's turn requests by Claude Code process (``x-claude-code-session-id``), in order of arrival."""
    out: dict[str, list[RecordedRequest]] = {}
    for request in server.turns(script):
        out.setdefault(request.headers.get("x-claude-code-session-id", ""), []).append(request)
    return out


async def merged(pt: PolecatTown, server: ModelServer, bead: str, timeout: float = 180) -> None:
    def check() -> bool:
        assert server.failures == [], server.failures
        assert pt.refinery is not None
        done = {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
        sessions = pt.sessions_of(bead)
        live = pt.tmux.snapshot()
        panes = {s.id: pt.tmux.capture(s.tmux_name) for s in sessions if s.status == "started" and s.tmux_name in live}
        assert bead in done, ([(s.id, s.status, s.end_reason) for s in sessions], panes, server.answers[-3:])
        return True

    await assert_eventually(check, timeout=timeout, interval=1.0)


async def steps_done(nc: Client, bead: str) -> list[str]:
    return [e["step"] for kind, e in await events_of(nc, f"gt.evt.mol.{bead}") if kind == "step.done"]


async def started_session(pt: PolecatTown, bead: str, attempt: int = 1) -> Session:
    def started() -> Session:
        sessions = pt.sessions_of(bead)
        assert len(sessions) >= attempt, sessions
        assert sessions[attempt - 1].status == "started", sessions
        assert sessions[attempt - 1].pane_pid
        return sessions[attempt - 1]

    return await assert_eventually(started, timeout=60)


def claude_pid(session: Session) -> int:
    """The ``claude`` process of a session: below its pane's reaper (``env``, ``sh`` and ``exec`` replace one another
    up to it)."""
    pane = psutil.Process(session.pane_pid or 0)
    for proc in (pane, *pane.children(recursive=True)):
        if "--dangerously-skip-permissions" in proc.cmdline():
            return int(proc.pid)
    raise AssertionError(f"no claude below the pane's process {session.pane_pid}")


# ---- 1. the agent killed mid-step: its running tool ------------------------------------------------------------------


async def test_a_killed_claudes_running_tool_is_gone_before_a_fresh_session_takes_the_worktree(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial's case: `kill -9` of claude while its Bash tool runs a command that writes into the worktree later.
    The tool's process (re-parented when claude died) must be gone before the next session gets the worktree."""
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)
    bead = await pt.new_bead("Leave a tool running [model-script:leftover]")
    marker = f"gt-leftover-{uuid.uuid4().hex[:8]}"
    late = f"sleep 12 && echo {marker} >> LEFTOVER.txt"
    before_kill = Script(
        name="leftover",
        turns=(use(bash("gt prime", expect="Current step: load-context")), use(bash(late)), say("never reached")),
    )
    async with ModelServer([before_kill]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)
        first = await started_session(pt, bead)
        await assert_eventually(lambda: running_with(marker), timeout=120, message="the tool's command never ran")
        server.add(Script(name="leftover", turns=(say("A fresh session, waiting."),)))
        os.kill(claude_pid(first), signal.SIGKILL)
        killed_at = time.monotonic()
        second = await started_session(pt, bead, attempt=2)
        assert second.worktree == first.worktree
        assert running_with(marker) == [], "a process of the killed session runs on beside its successor"
        leftover = os.path.join(first.worktree, "LEFTOVER.txt")
        # Past the moment the command would have written: nothing was written, then or ever.
        while time.monotonic() < killed_at + 15:
            assert not os.path.exists(leftover), "the killed session's tool wrote into its successor's worktree"
            await asyncio.sleep(0.5)
        assert pt.sessions_of(bead)[0].end_reason == "zombie", "claude's death seen as such"


# (Killed mid-step and resumed, a 429/529 storm, a 401 that parks the rig, a busy agent, a stalled turn, a nudge at
# the prompt: the runtime contract's scenarios, tests/integration/test_runtime_conformance.py and
# test_runtime_liveness.py, for every runtime.)


# ---- 4. a nudge typed while Claude Code generates ----------------------------------------------------------------


NUDGE = "please also update the changelog (nudge 4711)"


async def test_a_nudge_typed_while_claude_generates_arrives_once_intact_at_the_next_turn(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)
    bead = await pt.new_bead("Busy [model-script:busy]")
    script = Script(
        name="busy",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            # Generating: this request is held while the nudge is typed.
            use(bash("gt step done load-context", expect="load-context: done"), faults=(Fault(kind="stall"),)),
            use(bash("gt step done implement", expect="implement: done")),
            *finish(),
        ),
    )
    async with ModelServer([script]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        try:
            await pt.sling(bead)
            await assert_eventually(lambda: server.stalled >= 1, timeout=120)
            outcome = await pt.command("gt.cmd.nudge.send", target="demo/ace", message=NUDGE)
            assert outcome["type"] == "cmd.accepted", outcome
            assert pt.witness is not None

            def delivered() -> bool:
                assert pt.witness is not None
                assert [n.status for n in pt.witness.state.nudges.values()] == ["delivered"]
                return True

            await assert_eventually(delivered, timeout=60)
            server.release()
            await merged(pt, server, bead)
        finally:
            server.release()
    turns = server.turns("busy")
    carrying = [r for r in turns if NUDGE in json.dumps(r.body)]
    assert carrying, "the nudge never reached the model"
    first = carrying[0]
    assert json.dumps(first.body).count(NUDGE) == 1, "arrived once, not twice"
    assert first.turn is not None
    assert first.turn <= 3, f"acted on at the next turn, not later (turn {first.turn})"
    assert all(json.dumps(r.body).count(NUDGE) == 1 for r in carrying), "never duplicated later"


# ---- 5. /clear -------------------------------------------------------------------------------------------------


async def test_clear_re_primes_the_session_with_the_current_step_and_the_work_continues(
    pt: PolecatTown, town: TownConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)
    bead = await pt.new_bead("Clear me [model-script:clear]")
    before = Script(
        name="clear",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context", expect="load-context: done")),
            say("Let me pause here."),  # the Stop hook sends it on (step implement is open) ...
            say("Pausing anyway.", prompt="implement"),  # ... once: then it is idle at its prompt
        ),
    )
    after = Script(
        name="clear",
        turns=(
            # Nobody types anything after /clear: the witness's nudge sends the cleared session on.
            use(bash("gt step done implement", expect="implement: done"), prompt="Go on with your current step"),
            *finish(),
        ),
    )
    # The header names the script: after /clear the conversation starts again without the beacon's marker.
    monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "x-gt-model-script: clear")
    async with ModelServer([before]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)
        session = await started_session(pt, bead)
        await assert_eventually(lambda: len(server.turns("clear")) >= 4, timeout=120)
        hooks = town.gt_home / "rigs" / "demo" / "sessions" / session.id / "hooks.log"

        def idle() -> bool:
            assert hooks.read_text().count("stop") >= 2
            assert "\u276f" in pt.tmux.capture(session.tmux_name)  # the prompt
            return True

        await assert_eventually(idle, timeout=60)
        assert pt.witness is not None
        assert pt.witness.state.nudges == {}, "an agent idle after its own turns is not nudged"
        server.add(after)
        pt.tmux.send_text(session.tmux_name, "/clear")
        pt.tmux.send_enter(session.tmux_name)
        await assert_eventually(lambda: "session-start clear" in hooks.read_text(), timeout=60)
        await merged(pt, server, bead, timeout=90)
        [done] = await pt.wait_settled(bead)  # while the model answers the turn after `gt done`
    assert done.end_reason == "done", "the same session went on after /clear"
    cleared = [r for r in server.turns("clear") if r.turn == 0][-1]
    assert "Current step: implement" in json.dumps(cleared.body), "re-primed with the current step after /clear"
    # One nudge, for the second start of the session (the /clear), delivered to it.
    assert pt.witness is not None
    nudges = pt.witness.state.nudges
    assert list(nudges) == [continue_nudge_id(session.id, 2)], nudges
    assert nudges[continue_nudge_id(session.id, 2)].status == "delivered"
    assert json.dumps(cleared.body).count("Go on with your current step") == 1, "typed once"


# ---- 6. the context exhausted: an automatic compaction ---------------------------------------------------------


async def test_an_exhausted_context_is_compacted_and_the_same_session_goes_on_on_its_hook(
    pt: PolecatTown, town: TownConfig, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)
    bead = await pt.new_bead("Long conversation [model-script:full]")
    script = Script(
        name="full",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context && gt step done implement", expect="implement: done")),
            # Its answer says the conversation fills the model's context window: Claude Code compacts it before it
            # asks for the next turn (the summary request is answered by the server and consumes no turn).
            exhaust_context(use(bash("gt step done commit", expect="commit: done"))),
            use(bash("gt step done self-review && gt step done run-tests", expect="run-tests: done")),
            use(bash("gt step done submit && gt done", expect="merge request")),
            say("Submitted to the merge queue."),
        ),
    )
    async with ModelServer([script]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)
        session = await started_session(pt, bead)
        await merged(pt, server, bead)
        [done] = await pt.wait_settled(bead)  # while the model answers the turn after `gt done`
    assert done.id == session.id
    assert done.end_reason == "done", "the same session went on after the compaction"
    assert done.warrant_reason is None
    compactions = [r for r in server.requests if r.kind == "compact"]
    assert len(compactions) == 1, [(r.kind, r.turn) for r in server.requests]
    assert [a.status for a in server.answers if a.kind == "compact"] == [200], "the summary was answered"
    # Every turn asked for once, in order: the summary consumed none and no step was asked for again.
    assert [r.turn for r in server.turns("full")] == list(range(len(script.turns)))
    compacted = server.turns("full")[3]
    body = json.dumps(compacted.body)
    assert "[model-turns:2]" in body, "the turn after the compaction carries the summary"
    assert "Current step: self-review" in body, "re-primed by the SessionStart hook after the compaction"
    assert "Current step: load-context" not in body, "the conversation before the compaction is gone"
    hooks = (town.gt_home / "rigs" / "demo" / "sessions" / session.id / "hooks.log").read_text()
    lines = [line.split(" ", 1)[1] for line in hooks.splitlines()]
    assert "PreCompact" in lines
    assert "session-start compact" in lines
    assert lines.index("PreCompact") < lines.index("session-start compact"), lines
    assert lines.count("session-start startup") == 1, "one process: started once, compacted once"
    assert pt.witness is not None
    assert pt.witness.state.nudges == {}, "it went on by itself: nobody nudged it"
    assert sorted(await steps_done(nc, bead)) == sorted(STEPS), "each step done once: none redone"
    assert len(await steps_done(nc, bead)) == len(STEPS)
