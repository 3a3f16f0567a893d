"""Token usage of Claude Code sessions: the real ``claude`` in real tmux, driven by the scripted model server, in a
real town. The witness reads each session's transcript and records ``session.usage`` (running totals); the mayor
folds them per bead, rig and convoy; ``gt costs`` shows them. The model server records the usage it sent, which the
recorded events must match exactly, across a witness restart mid-session."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from gt.model_server import ModelServer
from services.witness.settings import WitnessSettings
from services.witness.state import UsageMark
from shared.core.config import TownConfig
from shared.model.usage import TOKEN_FIELDS
from tests.claude_code import usage_recorded, usage_sent
from tests.helpers import assert_eventually
from tests.integration.test_claude_runtime import RUN_DEADLINE_S, polecat_story
from tests.integration.test_cli import Gt
from tests.log_tools import events_of
from tests.witness_town import PolecatTown, polecat_town

SETTINGS = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, usage_interval_s=0.2)
"""The default grace after `gt done` (10 s): Claude Code writes its last answer to its transcript after `gt done`
returned, and a session ended before that would leave the answer's tokens unrecorded."""
PRICES = '{"claude-opus-5-5": {"input": 5, "output": 25}}'


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, claude_witness_env: None) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, SETTINGS) as handle:
        yield handle


async def test_a_claude_sessions_usage_is_recorded_as_the_model_server_sent_it_across_a_witness_restart(
    pt: PolecatTown, town: TownConfig, nc: Client, gt_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", max_polecats=1, stall_after_s=600.0)
    bead = await pt.new_bead("Feature 0 [model-script:story-0]")
    convoy = str((await pt.ok("gt.cmd.convoy.create", title="Usage", beads=[bead]))["id"])
    worktree = str(town.gt_home / "rigs" / "demo" / "polecats" / "ace")
    script = polecat_story("story-0", bead, worktree, 0)
    async with ModelServer([script]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)
        [session] = await assert_eventually(functools.partial(pt.sessions_of, bead), timeout=30)

        def recorded_while_running() -> UsageMark:
            assert pt.witness is not None
            mark = pt.witness.state.usage.get(session.id)
            assert mark is not None, "no usage recorded yet"
            assert mark.models, mark
            assert not mark.final, "the session is still running"
            return mark

        await assert_eventually(recorded_while_running, timeout=RUN_DEADLINE_S, interval=0.05)
        # The witness restarts mid-session: the new one reads the transcript from its start again.
        await pt.stop("witness")
        await pt.start_witness(SETTINGS)

        def final() -> UsageMark:
            assert server.failures == [], server.failures
            assert pt.witness is not None
            mark = pt.witness.state.usage.get(session.id)
            assert mark is not None
            assert mark.final, mark
            return mark

        mark = await assert_eventually(final, timeout=RUN_DEADLINE_S, interval=0.2)
        [ended] = await pt.wait_settled(bead)  # while the model answers the turn after `gt done`
    assert ended.end_reason == "done"
    sent = usage_sent(server, "story-0")
    assert len(server.usage("story-0")) == len(script.turns)
    assert usage_recorded(mark, "claude-opus-5-5") == sent, "the recorded totals are what the model server sent, once"
    assert mark.models[0].messages == len(script.turns)
    usage_events = await events_of(nc, f"gt.evt.usage.{session.id}")
    assert [t for t, _ in usage_events] == ["session.usage"] * len(usage_events)
    assert [d.get("final", False) for _, d in usage_events][-1] is True
    assert sum(1 for _, d in usage_events if d.get("final")) == 1, "one final record"

    gt = Gt({**gt_env, "GT_MODEL_PRICES": PRICES}, town)
    total = sum(sent.values())
    for by, key in (("bead", bead), ("rig", "demo"), ("convoy", convoy)):
        run = await gt("costs", "--by", by, "--json")
        assert run.code == 0, run.err
        shown: dict[str, Any] = run.json()
        [row] = [r for r in shown["rows"] if r["key"] == key]
        assert {name: row[name] for name in TOKEN_FIELDS} == sent
        assert row["tokens"] == total
        expected = (
            sent["input_tokens"] * 5
            + sent["output_tokens"] * 25
            + sent["cache_creation_input_tokens"] * 6.25
            + sent["cache_read_input_tokens"] * 0.5
        ) / 1_000_000
        assert row["cost_usd"] == pytest.approx(expected)
        assert shown["total"]["tokens"] == total or by == "convoy", "a bead in two convoys counts in both"
    table = await gt("costs")
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split()[:2] == ["BEAD", "INPUT"]
    assert lines[1].split()[0] == bead
    assert lines[-1].split()[0] == "total"
    assert str(total) in lines[-1]
    assert "$" in lines[-1]
