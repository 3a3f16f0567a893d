"""Liveness, the runtime contract's part, for every runtime with its real binary: a session busy with its own tools
(no `gt` call) for three stall limits is neither warranted nor loses its hook lease; a session whose model stops
answering is warranted after the stall limit, and its bead finishes in the next session. A runtime joins by a row
in ``tests.agent_runtimes.RUNTIMES``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from gt.model_server import Fault, ModelServer, Script, bash, say, use
from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.core.ids import hook_lease_name
from tests.agent_runtimes import RUNTIMES, AgentCli
from tests.log_tools import events_of
from tests.witness_town import FAST, PolecatTown, polecat_town

STALL_S = 15.0
"""The rig's stall limit and the hook lease's TTL: short, so three of them pass in a test, and longer than a
runtime takes to start on a loaded 2-core machine (Gemini CLI up to 12 s: until its first hook the witness has no
sign of life to renew the lease on; ``GT_AGENT_START_TIMEOUT`` watches the start)."""
BUSY_TURNS = 10
BUSY_SLEEP_S = 5
WATCH = DeaconSettings(stale_after_s=5.0, startup_grace_s=60.0, escalate_after_s=600.0, watched=(), tick_s=0.1)
FINISH = (
    "echo done > result.txt && git add result.txt && git commit -q -m result"
    " && gt step done implement && gt step done commit && gt step done self-review && gt step done run-tests"
    " && gt step done submit && gt done"
)


@pytest.fixture(params=RUNTIMES, ids=[cli.name for cli in RUNTIMES])
def cli(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AgentCli:
    agent: AgentCli = request.param
    agent.binary()
    monkeypatch.delenv("GT_AGENT_ENV", raising=False)
    return agent


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path, cli: AgentCli) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, done_exit_grace_s=1.0, hook_lease_ttl_s=STALL_S)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        handle.deacon = DeaconService(town, FAST, deacon=WATCH)
        await handle.start("deacon", handle.deacon)
        yield handle


async def test_a_session_busy_with_its_own_tools_for_three_stall_limits_is_not_warranted(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"{cli.name}-busy"
    sleeps = tuple(use(bash(f"sleep {BUSY_SLEEP_S} && echo slept-{n}", expect=f"slept-{n}")) for n in range(BUSY_TURNS))
    story = Script(
        name=name,
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context", expect="load-context: done")),
            *sleeps,
            use(bash(FINISH, expect="merge request")),
            say("Submitted."),
        ),
    )
    await pt.add_rig(agent_command=cli.name, stall_after_s=STALL_S)
    bead = await pt.new_bead(f"Long step [model-script:{name}]")
    async with ModelServer([story]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        await pt.sling(bead)
        try:
            await pt.wait_merge_requested(bead, timeout=300)
        except AssertionError as exc:  # what the runtime asked the model, and when: a stuck first turn shows here
            asked = [(r.kind, r.script, r.turn, r.path, round(r.received_at, 1)) for r in server.requests]
            raise AssertionError(f"{exc}\nmodel requests: {asked}\nanswers: {server.answers}") from None
        assert server.failures == []
        sessions = await pt.wait_settled(bead, timeout=120)  # while the model answers the turn after `gt done`
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [(None, "done")], [
        (s.warrant_reason, s.warrant_detail) for s in sessions
    ]
    assert BUSY_TURNS * BUSY_SLEEP_S >= 3 * STALL_S
    history = await events_of(pt.nc, f"gt.evt.lease.{hook_lease_name(bead)}")
    assert [t for t, _ in history] == ["lease.acquired", "lease.released"], "the hook lease never lapsed"


async def test_a_session_whose_model_stops_answering_is_warranted_and_the_next_session_finishes(
    pt: PolecatTown, cli: AgentCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model holds a turn unanswered (no status, no byte): every runtime waits on it far longer than the stall
    limit (Claude Code 10 minutes with API_TIMEOUT_MS, Codex CLI without end while it waits for headers, Gemini CLI
    about 65 s per attempt), its screen keeps a spinner going: only the witness's stall limit ends it."""
    monkeypatch.setenv("API_TIMEOUT_MS", "600000")
    name = f"{cli.name}-stuck"
    story = Script(
        name=name,
        turns=(
            use(bash("gt prime")),
            use(bash("gt step done load-context || true")),
            use(bash(FINISH, expect="merge request"), faults=[Fault(kind="stall", times=1)]),
            say("Submitted."),
        ),
    )
    await pt.add_rig(agent_command=cli.name, stall_after_s=STALL_S)
    bead = await pt.new_bead(f"Model hangs [model-script:{name}]")
    async with ModelServer([story]) as server:
        for variable, value in cli.witness_env(server.base_url).items():
            monkeypatch.setenv(variable, value)
        await pt.sling(bead)
        await pt.wait_merge_requested(bead, timeout=240)
        assert server.failures == []
        server.release()
        sessions = await pt.wait_settled(bead, timeout=120)
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [("stalled", "stalled"), (None, "done")]
    assert "activity" in (sessions[0].warrant_detail or "")
