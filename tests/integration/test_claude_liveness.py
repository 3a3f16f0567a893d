"""Liveness of agents that never call `gt` (issue 21, point 4), with the real Claude Code CLI in real tmux and the
scripted model server: a session whose model API refuses it (429, 529) for several stall limits while Claude Code
retries is not warranted (its retry status on screen is its sign of life). A busy agent and a stalled model turn
are the runtime contract's, for every runtime: test_runtime_liveness.py."""

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
from tests.log_tools import events_of
from tests.witness_town import FAST, PolecatTown, polecat_town

STALL_S = 6.0
"""The rig's stall limit and the hook lease's TTL: short, so three of them pass in a test."""
BUSY_TURNS = 10
BUSY_SLEEP_S = 2
"""The busy step: BUSY_TURNS Bash calls of ``sleep BUSY_SLEEP_S``, at least 3 x STALL_S without a `gt` call."""
WATCH = DeaconSettings(stale_after_s=5.0, startup_grace_s=60.0, escalate_after_s=600.0, watched=(), tick_s=0.1)
FINISH = (
    "echo done > result.txt && git add result.txt && git commit -q -m result"
    " && gt step done implement && gt step done commit && gt step done self-review && gt step done run-tests"
    " && gt step done submit && gt done"
)


@pytest.fixture
async def pt(
    town: TownConfig,
    nc: Client,
    tmp_path: Path,
    claude_witness_env: None,
) -> AsyncIterator[PolecatTown]:
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, done_exit_grace_s=1.0, hook_lease_ttl_s=STALL_S)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        handle.deacon = DeaconService(town, FAST, deacon=WATCH)
        await handle.start("deacon", handle.deacon)
        yield handle


def busy_story() -> Script:
    """Prime, then a long step of the agent's own tools only (no `gt`), then every step done and `gt done`."""
    sleeps = tuple(use(bash(f"sleep {BUSY_SLEEP_S} && echo slept-{n}", expect=f"slept-{n}")) for n in range(BUSY_TURNS))
    return Script(
        name="busy",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context", expect="load-context: done")),
            *sleeps,
            use(bash(FINISH, expect="merge request")),
            say("Submitted."),
        ),
    )


STORM = (Fault(kind="rate_limited", times=2, retry_after_s=1), Fault(kind="overloaded", times=5))
"""Seven refusals of one request: Claude Code backs off longer after each (observed: about 35 s in all)."""


def storm_story() -> Script:
    """Prime, a step done, then the model API refuses the next request seven times before it answers it."""
    return Script(
        name="storm",
        turns=(
            use(bash("gt prime", expect="Current step: load-context")),
            use(bash("gt step done load-context", expect="load-context: done")),
            use(bash(FINISH, expect="merge request"), faults=STORM),
            say("Submitted."),
        ),
    )


def stuck_story() -> Script:
    """The model stops answering at turn 2 once (the first session hangs there); the next session's turn 2 is
    answered and finishes the bead (turns 0 and 1 run again in it; step load-context is done by then)."""
    return Script(
        name="stuck",
        turns=(
            use(bash("gt prime")),
            use(bash("gt step done load-context || true")),
            use(bash(FINISH, expect="merge request"), faults=[Fault(kind="stall", times=1)]),
            say("Submitted."),
        ),
    )


async def test_a_429_and_529_storm_of_three_stall_limits_is_no_stall_while_claude_retries(
    pt: PolecatTown, monkeypatch: pytest.MonkeyPatch
) -> None:
    await pt.add_rig(agent_command="claude", stall_after_s=STALL_S)
    bead = await pt.new_bead("Storm [model-script:storm]")
    async with ModelServer([storm_story()]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await pt.sling(bead)
        try:
            await pt.wait_merge_requested(bead, timeout=240)
        except AssertionError as exc:
            raise AssertionError(
                exc,
                [(s.id, s.warrant_reason, s.warrant_detail, s.pane_tail) for s in pt.sessions_of(bead)],
                [(r.turn, r.received_at) for r in server.requests],
                [(a.turn, a.status) for a in server.answers],
            ) from exc
        assert server.failures == []
        sessions = await pt.wait_settled(bead, timeout=120)  # while the model answers the turn after `gt done`
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [(None, "done")], [
        (s.warrant_reason, s.warrant_detail) for s in sessions
    ]
    asked = [r for r in server.turns("storm") if r.turn == 2]
    assert [a.status for a in server.answers if a.turn == 2] == [429, 429, 529, 529, 529, 529, 529, 200]
    # The storm (from its first refusal to the answer) outlasted three stall limits, nothing else moving: the
    # session's last `gt` call came before it, and no tool ran while Claude Code retried.
    assert len(asked) == 8
    assert asked[-1].received_at - asked[0].received_at >= 3 * STALL_S
    history = await events_of(pt.nc, f"gt.evt.lease.{hook_lease_name(bead)}")
    assert [t for t, _ in history] == ["lease.acquired", "lease.released"], "the hook lease never lapsed"
