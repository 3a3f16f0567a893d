"""A rig switched to another runtime (`gt rig update --agent`): its next bead is worked by the new one while the
session already running keeps its own (the witness reads its screen, activity and usage as its runtime's). And one
bead slung with a runtime of its own (`gt sling --agent`): its session runs that one, not the rig's. Real Claude
Code and Codex CLI in real tmux, the scripted model server in both vendors' APIs, a real town."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from gt.model_server import ModelServer, Script, bash, say, use
from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.model.commands import BeadSling, RigUpdate
from shared.model.usage import TOKEN_FIELDS
from tests.agent_runtimes import CLAUDE, CODEX
from tests.helpers import assert_eventually
from tests.integration.test_claude_runtime import final_usage
from tests.witness_town import PolecatTown, polecat_town

STEPS = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")
DEADLINE_S = 240.0


@pytest.fixture
async def pt(
    town: TownConfig, nc: Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[PolecatTown]:
    monkeypatch.delenv("GT_AGENT_ENV", raising=False)
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        yield handle


def story(name: str, bead: str, file: str, *, wait_for: Path | None = None) -> Script:
    """Commit a file and hand in; ``wait_for``: first wait until that file exists (the session still runs when
    the rig changes runtime)."""
    waiting = [use(bash(f"while [ ! -e {wait_for} ]; do sleep 0.2; done; echo go", expect="go"))] if wait_for else []
    return Script(
        name=name,
        turns=(
            *waiting,
            use(bash(f"echo {name} > {file} && git add {file} && git commit -qm '{bead}: {file}' && echo ok")),
            use(bash(" && ".join(f"gt step done {s}" for s in STEPS) + " && gt done", expect="merge request")),
            say("Handed in."),
        ),
    )


async def test_a_rig_switched_to_another_runtime_works_its_next_bead_with_it_the_running_session_keeps_its_own(
    pt: PolecatTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = tmp_path / "go"
    await pt.add_rig(agent_command="claude", max_polecats=2, stall_after_s=600.0)
    first = await pt.new_bead("Worked by Claude Code [model-script:first]")
    second = await pt.new_bead("Worked by Codex CLI [model-script:second]")
    scripts = [story("first", first, "first.txt", wait_for=go), story("second", second, "second.txt")]
    async with ModelServer(scripts) as server:
        for cli in (CLAUDE, CODEX):
            for name, value in cli.witness_env(server.base_url).items():
                monkeypatch.setenv(name, value)
        await pt.sling(first)

        def first_waits() -> bool:
            assert any(a.script == "first" and a.turn == 0 and a.status == 200 for a in server.answers), "not yet"
            return True

        await assert_eventually(first_waits, timeout=DEADLINE_S)  # told to run its first command: wait for `go`
        await pt.send(RigUpdate(name="demo", agent_command="codex"))
        await pt.sling(second)

        def both_merged() -> bool:
            assert server.failures == [], server.failures
            assert pt.refinery is not None
            merged = {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
            if {r.script for r in server.requests if r.script == "second" and r.kind == "turn"}:
                go.touch()  # the second bead's session talks: let the first go on
            assert {first, second} <= merged, [(s.id, s.status) for b in (first, second) for s in pt.sessions_of(b)]
            return True

        await assert_eventually(both_merged, timeout=DEADLINE_S, interval=0.5)
        [one] = await pt.wait_settled(first)
        [two] = await pt.wait_settled(second)
    assert (one.agent, two.agent) == ("claude", "codex")
    assert {r.dialect for r in server.requests if r.script == "first" and r.kind == "turn"} == {"anthropic"}
    assert {r.dialect for r in server.requests if r.script == "second" and r.kind == "turn"} == {"openai-responses"}
    assert [one.end_reason, two.end_reason] == ["done", "done"], "neither was taken for a failed start or a stall"
    # Each session's usage was read where its own runtime writes it (Claude Code's transcripts, Codex's rollouts).
    for session, name in ((one, "first"), (two, "second")):
        mark = await assert_eventually(functools.partial(final_usage, pt, session.id), timeout=DEADLINE_S)
        sent = [a.usage for a in server.answers if a.script == name and a.kind == "turn" and a.usage is not None]
        recorded = {field: sum(getattr(m, field) for m in mark.models) for field in TOKEN_FIELDS}
        assert recorded == {field: sum(u[field] for u in sent) for field in TOKEN_FIELDS}, (name, mark.models)


async def test_a_bead_slung_with_another_runtime_than_its_rigs_is_worked_by_the_one_it_was_slung_with(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", stall_after_s=600.0)
    bead = await pt.new_bead("Worked by Codex CLI on a Claude Code rig [model-script:chosen]")
    async with ModelServer([story("chosen", bead, "chosen.txt")]) as server:
        for name, value in CODEX.witness_env(server.base_url).items():  # Claude Code is not even reachable
            monkeypatch.setenv(name, value)
        await pt.send(BeadSling(id=bead, rig="demo", agent="codex"))

        def merged() -> bool:
            assert server.failures == [], server.failures
            assert pt.refinery is not None
            done = {m.bead for m in pt.refinery.projection.state.mrs.values() if m.status == "merged"}
            assert bead in done, [(s.id, s.status, s.end_reason) for s in pt.sessions_of(bead)]
            return True

        await assert_eventually(merged, timeout=DEADLINE_S, interval=0.5)
        [session] = await pt.wait_settled(bead)
    assert (session.agent, session.end_reason) == ("codex", "done")
    assert {r.dialect for r in server.requests if r.script == "chosen" and r.kind == "turn"} == {"openai-responses"}
