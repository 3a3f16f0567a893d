"""Hook leases with real parts (witness, deacon, mayor, refinery, tmux, git, the reference agent): each session
takes its bead's hook lease with the next fencing token, its agent renews it with every `gt` call, the deacon
expires it when the agent goes quiet, the witness replaces the session, and the stale agent is fenced out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from services.witness.settings import WitnessSettings
from services.witness.state import Session
from shared.core.config import TownConfig
from shared.core.ids import hook_lease_name
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.witness_town import FAST, PolecatTown, polecat_town, run_gt

HOOK_TTL_S = 8.0
"""Short, so a quiet agent loses its hook quickly; long enough for a `gt heartbeat` process to start and renew
it on a loaded machine (2 s was not, beside a 1,000-bead chaos run; 4 s was not, with the suite run by three
workers on two cores)."""
WATCH = DeaconSettings(stale_after_s=5.0, startup_grace_s=60.0, escalate_after_s=600.0, watched=(), tick_s=0.1)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    # The rig's stall limit stays at its default (10 minutes): only the lapsed hook lease can catch the hang.
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, hook_lease_ttl_s=HOOK_TTL_S)
    async with polecat_town(town, nc, tmp_path, settings) as handle:
        handle.deacon = DeaconService(town, FAST, deacon=WATCH)
        await handle.start("deacon", handle.deacon)
        yield handle


def session_env(pt: PolecatTown, gt_env: dict[str, str], session: Session, *, token: int) -> dict[str, str]:
    """The environment the witness gave ``session``'s agent (with ``token`` as its hook lease token)."""
    return {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_SESSION": session.id,
        "GT_BEAD": session.bead,
        "GT_RIG": session.rig,
        "GT_WORKTREE": session.worktree,
        "GT_BRANCH": session.branch,
        "GT_LEASE": hook_lease_name(session.bead),
        "GT_LEASE_TOKEN": str(token),
    }


async def test_a_quiet_agent_loses_its_hook_and_is_fenced_out_while_a_fresh_session_lands_the_work(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang@1 gt-agent")
    bead = await pt.new_bead("Renew or be replaced")
    await pt.sling(bead)
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [("stalled", "stalled"), (None, "done")]
    first, second = sessions
    assert (first.lease_token, second.lease_token) == (1, 2)
    lease = hook_lease_name(bead)
    history = await events_of(pt.nc, f"gt.evt.lease.{lease}")
    assert [(t, d["holder"], d["token"]) for t, d in history] == [
        ("lease.acquired", first.id, 1),
        ("lease.expired", first.id, 1),
        ("lease.acquired", second.id, 2),
        ("lease.released", second.id, 2),
    ], "the deacon expired the quiet session's hook; the next session took token 2 and released it when done"
    assert pt.witness is not None
    assert pt.witness.state.hooks[lease].status == "released"

    # The first agent comes back (its process was killed, but anything holding its environment could): every
    # write it tries is refused, and the bead's log does not change.
    stale = session_env(pt, gt_env, first, token=1)
    assert pt.mayor is not None
    mayor = pt.mayor
    await assert_eventually(lambda: mayor.projection.state.beads[bead].status == "closed", timeout=60)
    before = await events_of(pt.nc, f"gt.evt.bead.{bead}")
    beat = await run_gt(stale, "heartbeat", "--note", "still here?")
    assert beat.returncode == 1, beat.stdout + beat.stderr
    assert "no longer holds its hook" in beat.stderr
    assert "token 1" in beat.stderr
    step = await run_gt(stale, "step", "done", "implement")
    assert step.returncode == 1, step.stdout + step.stderr
    assert "fenced" in step.stdout + step.stderr
    assert "token 1" in step.stdout + step.stderr
    claim = await run_gt(stale, "bead", "claim", bead, "--assignee", "demo/ace")
    assert claim.returncode == 1
    assert "fenced" in claim.stdout + claim.stderr
    assert await events_of(pt.nc, f"gt.evt.bead.{bead}") == before, "nothing the stale agent sent was applied"


async def test_a_lost_hook_warrants_a_live_session_and_the_next_one_starts_with_the_next_token(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    """A renewing agent keeps its hook; one whose hook passed on is warranted even though its process lives."""
    await pt.add_rig(agent_command="GT_AGENT_FAULT=hang@1 gt-agent")
    bead = await pt.new_bead("Keep your hook")
    await pt.sling(bead)
    first: Session = await assert_eventually(lambda: _started(pt, bead), timeout=60)
    env = session_env(pt, gt_env, first, token=first.lease_token or 0)
    # Renewing through `gt heartbeat` for more than twice the TTL keeps the hook held and the session alive.
    renew_until = time.monotonic() + 2.5 * HOOK_TTL_S
    while time.monotonic() < renew_until:
        beat = await run_gt(env, "heartbeat", "--note", "thinking")
        assert beat.returncode == 0, beat.stderr
    assert pt.sessions_of(bead)[0].warrant_reason is None
    assert pt.witness is not None
    assert pt.witness.state.hooks[hook_lease_name(bead)].status == "held"
    # Then it stops renewing: the hook lapses and a fresh session takes over with token 2.
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.lease_token for s in sessions] == [1, 2]
    assert "hook lease" in (await _warrant_detail(pt, sessions[0].id))


def _started(pt: PolecatTown, bead: str) -> Session:
    sessions = pt.sessions_of(bead)
    assert sessions
    assert sessions[0].status == "started"
    assert sessions[0].lease_token is not None
    return sessions[0]


async def _warrant_detail(pt: PolecatTown, session: str) -> str:
    for kind, data in await events_of(pt.nc, f"gt.evt.session.{session}"):
        if kind == "session.warranted":
            return str(data.get("detail", ""))
    raise AssertionError(f"session {session} has no warrant")
