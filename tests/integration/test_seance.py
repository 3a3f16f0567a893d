"""``gt seance``: a bead's earlier sessions told from the log, with each one's last words from its runtime's
transcript, for the runtimes that keep one (Claude Code, Codex CLI), each with its real binary in real tmux,
driven by the scripted model server through a real town. Asked by the operator, and by the bead's third session
from inside its pane. That a session cannot ask it of another bead is shown from a pane by the NATS attacks
(``tests/attacks/nats_pane.py``, ``seance_bead`` and ``seance_session``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import msgspec
import pytest

from gt.cli import seance
from gt.model_server import Fault, ModelServer, Script, bash, use
from services.witness.effects import transcript_read
from services.witness.state import Session
from shared.model import runtimes
from tests.agent_runtimes import RUNTIMES, AgentCli
from tests.helpers import assert_eventually
from tests.integration.test_runtime_conformance import agent_processes, finish, merged, pt, runtime_under_test
from tests.witness_town import PolecatTown

__all__ = ["pt"]  # the fixture, with this module's runtimes

TRANSCRIBED = [agent for agent in RUNTIMES if agent.name in ("claude", "codex")]


@pytest.fixture(params=TRANSCRIBED, ids=[agent.name for agent in TRANSCRIBED])
def cli(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AgentCli:
    return runtime_under_test(request, monkeypatch)


def dies_at(name: str, step: str, marker: str) -> Script:
    """A session that is primed at ``step``, does it, says ``marker`` in a command and hangs on its next model
    request until killed."""
    return Script(
        name=name,
        turns=(
            use(bash("gt prime", expect=f"Current step: {step}")),
            use(bash(f"echo {marker} && gt step done {step}", expect=f"{step}: done")),
            use(bash("true"), faults=(Fault(kind="stall", times=None),)),
        ),
    )


async def killed(pt: PolecatTown, server: ModelServer, bead: str, count: int) -> Session:
    """Waits for the bead's ``count``-th session to hang on the model, kills its agent, and waits for its end to be
    recorded with its transcript's tail."""
    await assert_eventually(lambda: server.stalled >= count, timeout=120)
    session = pt.sessions_of(bead)[count - 1]
    for process in agent_processes(session):
        process.kill()

    def cleaned() -> Session:
        [now] = [s for s in pt.sessions_of(bead) if s.id == session.id]
        assert now.cleaned, (now.status, now.end_reason)
        return now

    return await assert_eventually(cleaned, timeout=120)


async def test_a_seance_names_two_dead_sessions_why_they_ended_and_what_each_did_last(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command=cli.name, stall_after_s=600.0)
    name = f"{cli.name}-seance"
    bead = await pt.new_bead(f"Haunted [model-script:{name}]")
    async with ModelServer([dies_at(name, "load-context", "first-words-4711")]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        try:
            await pt.sling(bead)
            first = await killed(pt, server, bead, 1)
            server.add(dies_at(name, "implement", "second-words-4712"))
            second = await killed(pt, server, bead, 2)
            asked_at = time.time()
            # The third session asks about its predecessors from inside its pane, as its agent would.
            server.add(
                Script(
                    name=name,
                    turns=(
                        use(bash("gt prime", expect="Current step: commit")),
                        use(bash(f"gt seance {bead}", expect=f"session {second.id}")),
                        *finish(first="commit"),
                    ),
                )
            )
            sessions = await merged(pt, server, bead)
        finally:
            server.release()
    assert [s.id for s in sessions[:2]] == [first.id, second.id]
    for dead in (first, second):
        assert dead.end_reason in ("dead", "zombie"), (dead.end_reason, dead.warrant_reason)
    assert "first-words-4711" in first.transcript_tail, first.transcript_tail
    assert "second-words-4712" in second.transcript_tail, second.transcript_tail
    assert "gt prime" in first.transcript_tail

    told = await seance.gather(pt.nc, pt.config, bead)
    text = seance.seance_text(told)
    assert [t.session.id for t in told.sessions] == [s.id for s in sessions]
    for dead, marker, step in ((first, "first-words-4711", "load-context"), (second, "second-words-4712", "implement")):
        part = text.split(f"session {dead.id}:")[1].split("\nsession ")[0]
        assert f"ended: {dead.end_reason}" in part, part
        assert marker in part, part
        assert f"steps done: {step}" in part, part
        assert "usage: " in part, part
    assert "ended: done" in text.split(f"session {sessions[-1].id}:")[1]
    # A session of the bead names the same story.
    by_session = await seance.gather(pt.nc, pt.config, second.id)
    assert [t.session.id for t in by_session.sessions] == [s.id for s in sessions]

    # What the third session's pane got back: both predecessors and why each ended.
    answers = [r for r in server.turns(name) if r.received_at > asked_at]
    seen = " ".join(msgspec.json.encode(r.body).decode() for r in answers)
    for told_there in (first.id, second.id, "first-words-4711", "second-words-4712"):
        assert told_there in seen


def test_the_witness_reads_no_transcript_through_an_agents_link_or_fifo(tmp_path: Path) -> None:
    """The agent owns its runtime dir: a transcript it replaced by a link (to a file, or through a linked project
    directory) or by a FIFO gives nothing, and the witness neither follows it nor blocks on it."""
    runtime = runtimes.runtime_for("claude")
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps({"type": "assistant", "message": {"content": "the witness's secret"}}) + "\n")
    session = tmp_path / "session"
    projects = session / "home" / ".claude" / "projects"
    (projects / "p").mkdir(parents=True)
    transcript = projects / "p" / "t.jsonl"
    transcript.write_text(json.dumps({"type": "assistant", "message": {"content": "my own words"}}) + "\n")
    assert transcript_read.last_entries(session, runtime) == "assistant: my own words"
    transcript.unlink()
    transcript.symlink_to(secret)
    assert transcript_read.last_entries(session, runtime) == ""
    transcript.unlink()
    (projects / "linked").symlink_to(tmp_path, target_is_directory=True)
    assert transcript_read.last_entries(session, runtime) == ""
    os.mkfifo(projects / "p" / "fifo.jsonl")
    assert transcript_read.last_entries(session, runtime) == "", "a FIFO is never opened (it would block)"
