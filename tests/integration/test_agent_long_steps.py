"""The reference agent's long steps, with real parts (witness, deacon, mayor, refinery, tmux, git, gt-agent): a
test suite that runs several times the rig's stall limit is heartbeated through and the bead lands in one session;
an agent that stops while its suite runs is still caught by the stall limit; a suite that hangs is stopped by the
agent at ``GT_AGENT_COMMAND_TIMEOUT`` and the bead goes to a fresh session."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError

from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from shared.core.config import TownConfig
from shared.core.ids import hook_lease_name
from tests.helpers import assert_eventually
from tests.log_tools import events_of
from tests.witness_town import FAST, TEST_COMMAND, PolecatTown, polecat_town

STALL_S = 15.0
"""The rig's stall limit, and so its hook leases' TTL: short, and long enough for the reference agent's quiet
stretches on a loaded machine. Between two signs of life it starts a `gt` process, commits, and waits for the
mayor to record its step: on CI's two busy cores that took more than 6 s (three sessions stalled in a row)."""
WATCH = DeaconSettings(stale_after_s=5.0, startup_grace_s=60.0, escalate_after_s=600.0, watched=(), tick_s=0.1)
"""The deacon expiring hook leases not renewed within their TTL, as in a town."""


def slow_tests(seconds: int, *, attempts: str = "") -> str:
    """A rig test command that runs ``seconds`` in the agent's session (only on attempt ``attempts``, if given), then
    the usual check. The refinery's gate runs it too, outside any session: quickly, so the merge does not wait."""
    when = f'[ "$GT_ATTEMPT" = {attempts} ]' if attempts else "true"
    return f'if [ -n "${{GT_SESSION:-}}" ] && {when}; then sleep {seconds}; fi; {TEST_COMMAND}'


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path) as handle:
        handle.deacon = DeaconService(town, FAST, deacon=WATCH)
        await handle.start("deacon", handle.deacon)
        yield handle


async def heartbeat_note(pt: PolecatTown, session: str) -> str:
    """The note of the session's last heartbeat (empty before its first)."""
    kv = await pt.nc.jetstream().key_value(pt.config.heartbeat_bucket)
    try:
        entry = await kv.get(session)
    except KeyNotFoundError:
        return ""
    return str(json.loads(entry.value or b"{}").get("note", ""))


async def seconds_running(pt: PolecatTown, bead: str) -> float:
    """How long the agent says its tests have been running in its last heartbeat (0: not running them)."""
    sessions = pt.sessions_of(bead)
    if not sessions:
        return 0.0
    note = await heartbeat_note(pt, sessions[-1].id)
    prefix = "running the tests: running for "
    return float(note.removeprefix(prefix).removesuffix(" s")) if note.startswith(prefix) else 0.0


def running(command: str) -> list[psutil.Process]:
    """The ``sh -c COMMAND`` processes running now (not the copy of one that sh forked to start ``sleep``, which has
    its parent's command line until it execs)."""
    found = {
        proc.pid: proc
        for proc in psutil.process_iter(["cmdline", "ppid"])
        if proc.info["cmdline"] == ["sh", "-c", command]
    }
    return [proc for proc in found.values() if proc.info["ppid"] not in found]


def gone(proc: psutil.Process) -> bool:
    """The process ended (a zombie waiting for its parent to reap it counts as ended)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_tests_running_four_stall_limits_are_heartbeated_through_and_the_bead_lands_in_one_session(
    pt: PolecatTown,
) -> None:
    await pt.add_rig(stall_after_s=STALL_S, test_command=slow_tests(int(4 * STALL_S)))
    bead = await pt.new_bead("A project whose suite is slow")
    await pt.sling(bead)
    said: list[float] = []  # how long the agent's heartbeats say its suite has run, as they come

    async def watch_heartbeats() -> None:
        while True:
            said.append(await seconds_running(pt, bead))
            await asyncio.sleep(0.2)

    def first_ended() -> bool:
        sessions = pt.sessions_of(bead)
        return bool(sessions) and sessions[0].status == "ended"

    watcher = asyncio.create_task(watch_heartbeats())
    try:
        await assert_eventually(first_ended, timeout=180, interval=0.2)
    finally:
        watcher.cancel()
    first = pt.sessions_of(bead)[0]
    assert (first.warrant_reason, first.end_reason) == (None, "done"), pt.endings([first])
    await pt.wait_merge_requested(bead)
    sessions = await pt.wait_settled(bead)
    assert [s.id for s in sessions] == [first.id], "one session did it all"
    assert max(said) >= 3 * STALL_S, "its heartbeats went on well past the stall limit into the suite"
    history = await events_of(pt.nc, f"gt.evt.lease.{hook_lease_name(bead)}")
    assert [t for t, _ in history] == ["lease.acquired", "lease.released"], "renewed throughout, never expired"
    assert pt.mayor is not None
    mayor = pt.mayor
    await assert_eventually(lambda: mayor.projection.state.beads[bead].status == "closed", timeout=60)


async def test_an_agent_stopped_while_its_tests_run_is_still_caught_by_the_stall_limit(pt: PolecatTown) -> None:
    tests = slow_tests(600, attempts="1")
    await pt.add_rig(stall_after_s=STALL_S, test_command=tests)
    bead = await pt.new_bead("The agent freezes in its test step")
    await pt.sling(bead)
    (suite,) = await assert_eventually(lambda: running(tests), timeout=120)

    async def beating() -> float:
        return await seconds_running(pt, bead)

    ran: float = await assert_eventually(beating, timeout=60, interval=0.2)
    assert ran > 0, "the agent heartbeats while its suite runs"
    agent = suite.parent()
    assert agent is not None
    # The agent freezes; the suite it started runs on. Only the agent's own beats kept the session alive.
    agent.send_signal(signal.SIGSTOP)

    await pt.wait_merge_requested(bead, timeout=120)
    sessions = await pt.wait_settled(bead)
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [("stalled", "stalled"), (None, "done")], pt.endings(
        sessions
    )
    await assert_eventually(
        lambda: gone(suite), timeout=30, message="the warranted session's suite was stopped with it"
    )


async def test_a_suite_that_hangs_is_stopped_at_the_command_limit_and_a_fresh_session_lands_the_bead(
    pt: PolecatTown,
) -> None:
    tests = slow_tests(600, attempts="1")
    limit = 3 * STALL_S
    await pt.add_rig(
        stall_after_s=STALL_S, test_command=tests, agent_command=f"GT_AGENT_COMMAND_TIMEOUT={limit:g} gt-agent"
    )
    bead = await pt.new_bead("The suite hangs on the first attempt")
    await pt.sling(bead)
    (suite,) = await assert_eventually(lambda: running(tests), timeout=120)
    await pt.wait_merge_requested(bead, timeout=180)
    sessions = await pt.wait_settled(bead)
    assert [(s.warrant_reason, s.end_reason) for s in sessions] == [("zombie", "zombie"), (None, "done")], pt.endings(
        sessions
    )
    said = f"giving up: running the tests ran for more than {limit:g} s (GT_AGENT_COMMAND_TIMEOUT): stopped"
    assert said in sessions[0].pane_tail, "heartbeated while the suite hung, then stopped it and said why"
    await assert_eventually(lambda: gone(suite), timeout=30, message="the agent stopped the hung suite")
