"""The runtime contract (docs/agents.md, "The runtime contract"), one suite for every agent runtime, each with its
real binary in real tmux, driven by the scripted model server in its vendor's API through a real town (mayor,
witness, refinery, real git). The model server is the only fake. A runtime joins by a row in
``tests.agent_runtimes.RUNTIMES``."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import psutil
import pytest
from nats.aio.client import Client

from gt.model_server import Fault, ModelServer, RecordedRequest, Script, Turn, bash, say, use, write
from gt.model_server.dialects import dialect_for
from services.witness.settings import WitnessSettings
from services.witness.state import Session
from shared.core.config import TownConfig
from shared.host import git
from shared.model import runtimes
from shared.model.events import decode_envelope
from shared.model.usage import TOKEN_FIELDS
from tests.agent_runtimes import RUNTIMES, AgentCli
from tests.helpers import assert_eventually
from tests.integration.test_claude_runtime import final_usage
from tests.log_tools import read_all
from tests.witness_town import PolecatTown, polecat_town

RUN_DEADLINE_S = 240.0
STEPS = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")


def runtime_under_test(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AgentCli:
    """The runtime a parametrised ``cli`` fixture names, its binary there and the operator's agent env out of it."""
    agent: AgentCli = request.param
    agent.binary()  # fails (never skips) naming ./dev setup when it is missing
    monkeypatch.delenv("GT_AGENT_ENV", raising=False)
    return agent


@pytest.fixture(params=RUNTIMES, ids=[cli.name for cli in RUNTIMES])
def cli(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AgentCli:
    return runtime_under_test(request, monkeypatch)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, cli: AgentCli) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, usage_interval_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


def worked_story(
    name: str, bead: str, worktree: str, *, file: str = "feature.txt", text: str = "the feature\n"
) -> Script:
    """A session's whole bead: prime, ``file`` written with the runtime's own tools (``text``), committed, every step
    done (one stop half-way, which its stop hook refuses naming the open step), `gt done`. ``bead``: what the commit
    message names."""
    return Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context"), text="Let me see my hook."),
            use(bash("gt step done load-context", expect="load-context: done")),
            use(write(f"{worktree}/{file}", text), text="Writing the feature."),
            use(bash(f"cat {file} && gt step done implement", expect="implement: done")),
            use(bash(f"git add {file} && git commit -q -m '{bead}: the feature' && gt step done commit")),
            say("I have committed the feature; that should be all."),
            use(
                bash("gt step done self-review && gt step done run-tests", expect="run-tests: done"),
                prompt="self-review",  # the stop hook's reason: step self-review is still open
            ),
            use(bash("gt step done submit && gt done", expect="merge request")),
            say("Submitted to the merge queue."),
        ),
    )


def _prompts(request: RecordedRequest) -> tuple[str, ...]:
    """What a request carries as prompts and context (its user and system texts), tool results left out."""
    path = request.path.split("?", 1)[0]
    dialect = dialect_for(path)
    assert dialect is not None, path
    return dialect.read(path, request.body).context


def _session_dir(town: TownConfig, session_id: str) -> Path:
    return town.gt_home / "rigs" / "demo" / "sessions" / session_id


async def test_a_bead_is_worked_to_merged_every_step_once(
    pt: PolecatTown, town: TownConfig, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    bead = await pt.new_bead(f"A feature [model-script:{cli.name}-worked]")
    worktree = str(town.gt_home / "rigs" / "demo" / "polecats" / "ace")
    async with ModelServer([worked_story(f"{cli.name}-worked", bead, worktree)]) as server:
        for name, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(name, value)
        await pt.sling(bead)

        def merged() -> bool:
            assert server.failures == [], server.failures
            assert pt.refinery is not None
            done = {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
            assert bead in done, [(s.id, s.status, s.end_detail) for s in pt.sessions_of(bead)]
            return True

        await assert_eventually(merged, timeout=RUN_DEADLINE_S, interval=0.5)
        [session] = await pt.wait_settled(bead)
    assert server.failures == []
    assert session.end_reason == "done", "one session, no failed start, no stall"
    await assert_eventually(lambda: session_processes(session.id) == [], timeout=30)
    assert git.git("show", "main:feature.txt", cwd=pt.origin) == "the feature\n"
    assert {r.dialect for r in server.requests if r.kind == "turn"} == {
        {"claude": "anthropic", "codex": "openai-responses", "gemini": "gemini", "opencode": "openai-chat"}[cli.name]
    }
    # The start hook's `gt prime` reached the model as context (not as a tool's result): with the first prompt
    # (Claude Code, Codex CLI) or right after it (Gemini CLI runs the hook while it sends the first prompt).
    prompts = [_prompts(request) for request in server.turns(f"{cli.name}-worked")]
    assert any("Current step: load-context" in text for texts in prompts for text in texts), "not primed"
    hook_log = (_session_dir(town, session.id) / "hooks.log").read_text()
    assert "session-start" in hook_log
    # Answered from what the witness wrote before the pane started: no `gt` client between the runtime's start and
    # its first model request.
    told = (_session_dir(town, session.id) / runtimes.START_ANSWER_TAKEN).read_text()
    assert f"Hook: bead {bead}" in told, told
    assert runtimes.turn_ended_after_done(hook_log), "`gt done` marked the log and a turn ended after it"
    logged = [decode_envelope(data) for _seq, _subject, data in await read_all(pt.nc, "GT_EVT")]
    steps = [msgspec.json.decode(e.data) for e in logged if e.type == "step.done"]
    assert sorted(s["step"] for s in steps if s["bead_id"] == bead) == sorted(STEPS), "every step done once"
    assert pt.mayor is not None
    assert pt.mayor.projection.state.beads[bead].assignee == "demo/ace", "the witness claimed the bead for its polecat"
    # Its usage, read from where the runtime writes it, is what the model server sent its conversation, once.
    mark = await assert_eventually(functools.partial(final_usage, pt, session.id), timeout=RUN_DEADLINE_S)
    sent = [a.usage for a in server.answers if a.kind == "turn" and a.status == 200 and a.usage is not None]
    recorded = {name: sum(getattr(m, name) for m in mark.models) for name in TOKEN_FIELDS}
    assert recorded == {name: sum(u[name] for u in sent) for name in TOKEN_FIELDS}, mark.models
    merged_files = git.git("ls-tree", "-r", "--name-only", "main", cwd=pt.origin).split()
    assert merged_files.count("feature.txt") == 1
    assert not any(part.startswith(".") and part not in (".gitignore",) for part in merged_files)


def finish(*, first: str = "load-context") -> tuple[Turn, ...]:
    """The turns that take a session from step ``first`` to `gt done`."""
    rest = STEPS[STEPS.index(first) :]
    return (
        use(bash(" && ".join(f"gt step done {s}" for s in rest[:-1]), expect=f"{rest[-2]}: done")),
        use(bash("gt step done submit && gt done", expect="merge request")),
        say("Submitted to the merge queue."),
    )


async def merged(pt: PolecatTown, server: ModelServer, bead: str) -> list[Session]:
    def check() -> bool:
        assert server.failures == [], server.failures
        assert pt.refinery is not None
        done = {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
        assert bead in done, [(s.id, s.status, s.end_reason, s.end_detail) for s in pt.sessions_of(bead)]
        return True

    await assert_eventually(check, timeout=RUN_DEADLINE_S, interval=0.5)
    return await pt.wait_settled(bead)  # while the model still answers the turn after `gt done`


async def test_rate_limits_and_overload_are_waited_out_never_counted_as_a_crash(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 then an overload (Anthropic's 529, the others' 503) on two turns: the runtime retries them itself,
    the session is neither warranted nor respawned."""
    await pt.add_rig(agent_command=cli.name, stall_after_s=300.0)
    bead = await pt.new_bead(f"Storm [model-script:{cli.name}-storm]")
    storm = (Fault(kind="rate_limited", times=1, retry_after_s=1), Fault(kind="overloaded", times=1))
    script = Script(
        name=f"{cli.name}-storm",
        turns=(
            use(bash("gt prime", expect="Current step: load-context"), faults=storm),
            use(bash("gt step done load-context && gt step done implement", expect="implement: done"), faults=storm),
            *finish(first="commit"),
        ),
    )
    async with ModelServer([script]) as server:
        for name, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(name, value)
        await pt.sling(bead)
        [session] = await merged(pt, server, bead)
    statuses = [a.status for a in server.answers if a.kind == "turn"]
    assert statuses.count(429) == 2, statuses
    assert statuses.count(529 if cli.name == "claude" else 503) == 2, statuses
    assert session.warrant_reason is None, "retrying is not stalling"
    assert session.end_reason == "done"
    assert session.escalated is None


async def test_a_401_parks_the_rig_and_is_escalated_naming_rig_and_session(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key the model API refuses: no new session of the rig could work either, so the rig is parked and the
    operator told at once (not after the runtime's own retries, not as a crash loop); unparked once the key is
    fixed, a fresh session takes the bead."""
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    bead = await pt.new_bead(f"Bad key [model-script:{cli.name}-refused]")
    refused = Script(
        name=f"{cli.name}-refused", turns=(say("never"),), faults=(Fault(kind="unauthorized", times=None),)
    )
    async with ModelServer([refused]) as server:
        for name, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(name, value)
        await pt.sling(bead)

        def escalated() -> str:
            assert pt.mayor is not None
            found = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
            assert found, ("no escalation yet", [(s.id, s.status, s.warrant_reason) for s in pt.sessions_of(bead)])
            assert [s.warrant_reason for s in pt.sessions_of(bead)] == ["agent_unauthorized"]
            return found[0].message

        message = await assert_eventually(escalated, timeout=120)
        [session] = pt.sessions_of(bead)
        assert "rig demo" in message
        assert session.id in message
        assert "gt rig unpark demo" in message, "it says what the operator does"
        assert pt.witness is not None
        assert pt.witness.state.rigs["demo"].parked, "no new sessions: not a crash loop"
        server.add(Script(name=f"{cli.name}-refused", turns=(use(bash("gt prime", expect="load-context")), *finish())))
        await pt.ok("gt.cmd.rig.unpark", name="demo")
        sessions = await merged(pt, server, bead)
    assert [s.end_reason for s in sessions] == ["agent_unauthorized", "done"]


def session_processes(session_id: str) -> list[str]:
    """What still runs of a session (its environment names it): nothing, once it ended (its runtime, the servers
    and daemons it started, its `gt` helper)."""
    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.environ().get("GT_SESSION") == session_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.info['name']}")
        except psutil.Error:
            continue
    return found


def agent_processes(session: Session) -> list[psutil.Process]:
    """The session's agent: the processes right below its pane's reaper (the runtime, however it started)."""
    children: list[psutil.Process] = psutil.Process(session.pane_pid or 0).children()
    return children


async def test_an_agent_killed_mid_step_is_resumed_at_the_current_step_by_a_fresh_session(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    name = f"{cli.name}-crash"
    bead = await pt.new_bead(f"Crash me [model-script:{name}]")
    before_kill = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context && gt step done implement", expect="implement: done")),
            # Working on step commit when the agent dies: this request is held until the kill.
            use(bash("gt step done commit"), faults=(Fault(kind="stall", times=None),)),
        ),
    )
    after_kill = Script(
        name=name, turns=(use(bash("gt prime", expect="Current step: commit")), *finish(first="commit"))
    )
    async with ModelServer([before_kill]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        try:
            await pt.sling(bead)
            await assert_eventually(lambda: server.stalled >= 1, timeout=120)
            [first] = pt.sessions_of(bead)
            server.add(after_kill)  # what a fresh conversation (turn 0 again) is answered
            killed_at = time.time()
            for process in agent_processes(first):
                process.kill()
            sessions = await merged(pt, server, bead)
        finally:
            server.release()
    assert [s.end_reason for s in sessions][-1] == "done"
    assert sessions[0].end_reason in ("zombie", "dead"), "seen dead, re-slung"
    assert len(sessions) == 2
    resumed = [r for r in server.turns(name) if r.received_at > killed_at]
    contexts = [text for request in resumed for text in _prompts(request)]
    assert any("Current step: commit" in text for text in contexts), "the fresh session was primed at the step"
    assert not any("Current step: load-context" in text for text in contexts)
    logged = [decode_envelope(data) for _seq, _subject, data in await read_all(pt.nc, "GT_EVT")]
    steps = [msgspec.json.decode(e.data)["step"] for e in logged if e.type == "step.done"]
    assert sorted(steps) == sorted(STEPS), "each step done once: none redone"


NUDGE = "please also update the changelog (nudge 4711)"


async def test_a_nudge_reaches_an_agent_waiting_at_its_prompt_once_intact(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent stops twice with its steps open: its stop hook sends it on the first time and lets it stop the
    second (never a loop), and it waits at its prompt. A nudge for its polecat is typed into its pane the way its
    runtime takes one (at once, or once it is idle), checked on screen, and reaches the model once, intact."""
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    name = f"{cli.name}-nudged"
    bead = await pt.new_bead(f"Waits [model-script:{name}]")
    script = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            say("Waiting for instructions."),
            say("Still waiting.", prompt="Not done yet"),  # the stop hook's reason: step load-context is open
            use(bash("gt step done load-context", expect="load-context: done"), prompt=NUDGE),
            *finish(first="implement"),
        ),
    )
    async with ModelServer([script]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        await pt.sling(bead)
        await assert_eventually(
            lambda: any(a.script == name and a.turn == 2 and a.status == 200 for a in server.answers), timeout=120
        )
        outcome = await pt.command("gt.cmd.nudge.send", target="demo/ace", message=NUDGE)
        assert outcome["type"] == "cmd.accepted", outcome

        def delivered() -> bool:
            assert pt.witness is not None
            assert [n.status for n in pt.witness.state.nudges.values()] == ["delivered"]
            return True

        await assert_eventually(delivered, timeout=90)
        [session] = await merged(pt, server, bead)
    assert session.end_reason == "done"
    carrying = [r for r in server.turns(name) if any(NUDGE in text for text in _prompts(r))]
    assert carrying, "the nudge never reached the model"
    assert carrying[0].turn == 3, "acted on at the next turn"
    assert all(sum(text.count(NUDGE) for text in _prompts(r)) == 1 for r in carrying), "once, never duplicated"


CONTEXT_WINDOWS = {"codex": 258_400}
"""What Codex CLI 0.171 reports as gpt-5.5's window (272,000 tokens, 95% of them usable); the others' are their
runtime's ``context_window``."""


async def test_a_session_told_its_context_is_filling_up_hands_off_and_its_successor_resumes_at_the_step(
    pt: PolecatTown, town: TownConfig, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's answer says the conversation is at 81% of the window: the witness tells the session (once, at
    the highest share passed) to hand off; the agent runs `gt handoff` and a fresh session goes on from the step it
    was on, every step done once."""
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    name = f"{cli.name}-full"
    bead = await pt.new_bead(f"Long one [model-script:{name}]")
    window = CONTEXT_WINDOWS.get(cli.name) or runtimes.runtime_for(cli.name).context_window
    # Past the witness's 80%, short of where the runtime would compact the conversation itself (OpenCode at its
    # window less its output limit, 84%; Claude Code about 83%).
    full = int(window * 0.81)
    handoff = (
        use(bash("gt handoff --note 'implement is next'", expect="handed off"), prompt="% full. Hand off"),
        say("Handed off."),
    )
    first = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context", expect="load-context: done")),
            say("Working on it."),
            # Its stop hook sent it on; it stops again (never a loop) and waits, its conversation at 81%.
            Turn(text="Still working on it.", prompt="Not done yet", context_tokens=full),
            *handoff,
        ),
    )
    # A fresh conversation counts its turns from 0 again: once the first session waits for the warning, the script
    # is swapped for the successor's, which answers the first's handoff at the same turn.
    successor = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: implement")),
            *finish(first="implement"),
            *handoff,
        ),
    )
    assert len(successor.turns) == len(first.turns), "the handoff stays the first session's next turn"
    async with ModelServer([first]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        await pt.sling(bead)
        await assert_eventually(
            lambda: any(a.script == name and a.turn == 3 and a.status == 200 for a in server.answers), timeout=120
        )
        server.add(successor)
        sessions = await merged(pt, server, bead)
    assert [s.end_reason for s in sessions] == ["handoff", "done"], [(s.id, s.end_reason) for s in sessions]
    assert pt.witness is not None
    told = [n for n in pt.witness.state.nudges.values() if n.session == sessions[0].id]
    assert [n.status for n in told] == ["delivered"], "told once, at the highest share passed"
    assert re.search(r"Your context is 8\d% full", told[0].message), told[0].message
    # Primed with the step it was on: with its first prompt, or (Gemini CLI) right after it.
    later = [r for r in server.turns(name) if r.received_at > told[0].queued_at.timestamp()]
    assert any("Current step: implement" in text for r in later for text in _prompts(r)), "resumed at its step"
    logged = [decode_envelope(data) for _seq, _subject, data in await read_all(pt.nc, "GT_EVT")]
    steps = [msgspec.json.decode(e.data)["step"] for e in logged if e.type == "step.done"]
    assert sorted(steps) == sorted(STEPS), "each step done once: none redone"
