"""Chaos: kill -9 the witness inside each failure window (docs/failure-behaviour.md), and kill -9 agents from outside.

The witness runs as a real process (``python -m services.witness``) that kills itself with SIGKILL at a named
crash point once (``GT_CRASH_AT`` with a marker file) and is then started again with the same environment.
The mayor and the refinery run in the test's process; agents run in real tmux on the test's own tmux server.

After every restart the town must converge: the bead completes with every step done exactly once, no bead
ever has two sessions at once, each attempt is requested once, the merge request is submitted once, and no
tmux session or agent process is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import psutil
import pytest
from nats.aio.client import Client

from services.witness.projection import new_projection
from services.witness.state import Session, WitnessState
from shared.core.config import TownConfig
from shared.host import git
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually
from tests.log_tools import fresh_replay, read_all
from tests.service_process import ServiceProcess
from tests.witness_town import PolecatTown, polecat_town

pytestmark = pytest.mark.chaos

STEPS = ("load-context", "implement", "commit", "self-review", "run-tests", "submit")
SEED = int(os.environ.get("GT_CHAOS_SEED", "20261123"))


@pytest.fixture
async def chaos_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, with_witness=False) as handle:
        yield handle


def witness_env(gt_env: dict[str, str], pt: PolecatTown, tmp_path: Path, crash_at: str | None) -> dict[str, str]:
    env = {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_HOME": str(pt.config.gt_home),
        "GT_TMUX_SOCKET": pt.socket,
        "GT_KILL_GRACE": "1",
        "GT_MIN_ORPHAN_AGE": "60",
    }
    if crash_at:
        env["GT_CRASH_AT"] = crash_at
        env["GT_CRASH_MARKER"] = str(tmp_path / "crashed")
    return env


@contextlib.contextmanager
def running(witness: ServiceProcess) -> Iterator[ServiceProcess]:
    witness.start()
    try:
        yield witness
    finally:
        witness.stop()


async def replayed(nc: Client) -> WitnessState:
    projection = await fresh_replay(nc, new_projection())
    state: WitnessState = projection.state
    return state


def sessions_of(state: WitnessState, bead: str) -> list[Session]:
    return [state.sessions[s] for s in state.beads[bead].sessions] if bead in state.beads else []


async def wait_for_crash(witness: ServiceProcess, marker: Path, timeout: float = 60) -> None:
    def crashed() -> bool:
        code = witness.returncode()
        assert code is not None, "the witness has not reached its crash point yet"
        assert code == -signal.SIGKILL, f"it exited with {code}, not by its crash point:\n{witness.log_text()}"
        assert marker.exists()
        return True

    await assert_eventually(crashed, timeout=timeout, interval=0.05)


async def wait_converged(nc: Client, beads: list[str], timeout: float = 150) -> WitnessState:
    """Until each bead has its merge request and every session ended and was cleaned; the state then."""

    async def converged() -> WitnessState:
        state = await replayed(nc)
        for bead in beads:
            sessions = sessions_of(state, bead)
            assert sessions, f"{bead} has no session"
            assert state.beads[bead].merge_requested, f"{bead} has no merge request yet"
            unsettled = [(s.id, s.status, s.cleaned) for s in sessions if s.status != "ended" or not s.cleaned]
            assert not unsettled, f"{bead}: sessions not settled: {unsettled}"
        return state

    result: WitnessState = await assert_eventually(converged, timeout=timeout, interval=0.3)
    return result


async def check_invariants(pt: PolecatTown, beads: list[str], state: WitnessState) -> None:
    """What must hold once the town converged, read from the log and the machine."""
    log = [(seq, subject, decode_envelope(data)) for seq, subject, data in await read_all(pt.nc, "GT_EVT")]
    requested: Counter[str] = Counter()
    steps_done: Counter[tuple[str, str]] = Counter()
    submitted: Counter[str] = Counter()
    for _seq, _subject, env in log:
        data = msgspec.json.decode(env.data) if env.type in _COUNTED else None
        if env.type == "session.requested":
            assert data is not None
            requested[data["session_id"]] += 1
        elif env.type == "step.done":
            assert data is not None
            steps_done[(data["bead_id"], data["step"])] += 1
        elif env.type == "mr.submitted":
            assert data is not None
            submitted[data["bead"]] += 1
    duplicates = {session: n for session, n in requested.items() if n > 1}
    assert not duplicates, f"sessions requested more than once: {duplicates}"
    for bead in beads:
        sessions = sessions_of(state, bead)
        assert [s.attempt for s in sessions] == list(range(1, len(sessions) + 1)), [s.id for s in sessions]
        # Never two sessions at once: each attempt was requested only after the one before it ended.
        for before, after in itertools.pairwise(sessions):
            assert before.ended_at is not None, before
            assert before.ended_at <= after.requested_at, (before, after)
        assert submitted[bead] == 1, f"{bead}: {submitted[bead]} merge requests submitted"
        counts = {step: steps_done[(bead, step)] for step in STEPS}
        assert counts == dict.fromkeys(STEPS, 1), f"{bead}: step.done per step {counts}"
        branch = sessions[0].branch
        wanted = [f"{i:02d}-{s}.txt" for i, s in enumerate(STEPS, 1)]

        def every_step_on_main(branch: str = branch, bead: str = bead, wanted: list[str] = wanted) -> bool:
            # Published as a bundle, the branch reaches the rig's repository when it is merged: waited for.
            assert pt.branch_files(branch, bead) == wanted
            return True

        await assert_eventually(every_step_on_main, timeout=60)
    await assert_eventually(lambda: pt.tmux.snapshot() == {}, timeout=30, message="tmux sessions are left")
    await assert_eventually(lambda: not agents_of(pt.config), timeout=30, message="agent processes are left")


_COUNTED = frozenset({"session.requested", "step.done", "mr.submitted"})


def agents_of(town: TownConfig, *, only_agents: bool = False) -> list[int]:
    """Pids of processes started in a polecat session of this town still running (or only the agents)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if only_agents and not any("gt-agent" in part for part in proc.info["cmdline"] or ()):
                continue
            env = proc.environ()
            if env.get("GT_HOME") == str(town.gt_home) and "GT_SESSION" in env:
                found.append(proc.pid)
    return found


# (crash point, agent command, sessions the bead ends up with)
WINDOWS = [
    pytest.param("witness.after_requested", "gt-agent", 1, id="requested-before-tmux-start"),
    pytest.param("witness.before_launch", "gt-agent", 1, id="pane-waiting-before-launch"),
    pytest.param("witness.after_tmux_start", "gt-agent", 1, id="tmux-start-before-started"),
    pytest.param("witness.after_warrant", "GT_AGENT_FAULT=crash-at-step=3@1 gt-agent", 2, id="warrant-before-kill"),
    pytest.param("witness.after_kill", "GT_AGENT_FAULT=crash-at-step=3@1 gt-agent", 2, id="kill-before-ended"),
    pytest.param(
        "witness.after_done_push", "GT_AGENT_FAULT=crash-after-done-intent@1 gt-agent", 1, id="done-push-before-mr"
    ),
    pytest.param(
        "witness.after_mr_submit", "GT_AGENT_FAULT=crash-after-done-intent@1 gt-agent", 1, id="mr-before-ended"
    ),
]


@pytest.mark.parametrize(("crash_at", "agent", "expected_sessions"), WINDOWS)
async def test_witness_killed_in_a_failure_window_converges(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path, crash_at: str, agent: str, expected_sessions: int
) -> None:
    pt = chaos_town
    marker = tmp_path / "crashed"
    witness = ServiceProcess("witness", witness_env(gt_env, pt, tmp_path, crash_at), tmp_path / "witness.log")
    with running(witness):
        await pt.add_rig(agent_command=agent)
        bead = await pt.new_bead("Survive a witness crash")
        await pt.sling(bead)
        await wait_for_crash(witness, marker)

        # What the restarted witness will find, as docs/failure-behaviour.md describes the failure window.
        state = await replayed(pt.nc)
        sessions = sessions_of(state, bead)
        if crash_at == "witness.after_requested":
            assert [s.status for s in sessions] == ["requested"]
            assert pt.tmux.snapshot() == {}
        elif crash_at == "witness.before_launch":
            assert [s.status for s in sessions] == ["requested"]
            assert list(pt.tmux.snapshot()) == [sessions[0].tmux_name], "a pane whose reaper waits for its launch"
            assert not agents_of(pt.config), "no agent was launched"
        elif crash_at == "witness.after_tmux_start":
            assert [s.status for s in sessions] == ["requested"]
            assert list(pt.tmux.snapshot()) == [sessions[0].tmux_name], "a live tmux session nobody recorded"
        elif crash_at == "witness.after_warrant":
            assert sessions[0].warrant_reason is not None
            assert sessions[0].status == "started"
        elif crash_at == "witness.after_kill":
            assert sessions[0].warrant_reason is not None
            assert sessions[0].status == "started"
            assert sessions[0].tmux_name not in pt.tmux.snapshot(), "the kill happened before the crash"
        else:
            assert sessions[0].done_intent_at is not None
            assert sessions[0].status == "started"

        witness.start()
        state = await wait_converged(pt.nc, [bead])
        await check_invariants(pt, [bead], state)
        sessions = sessions_of(state, bead)
        assert len(sessions) == expected_sessions, [(s.id, s.end_reason) for s in sessions]
        assert sessions[-1].end_reason == "done"
        if crash_at == "witness.after_tmux_start":
            assert sessions[0].adopted, "the restarted witness adopts the session it started but did not record"
        if crash_at == "witness.before_launch":
            assert not sessions[0].adopted, "a pane that never launched its agent is opened again, not adopted"
        if crash_at in ("witness.after_done_push", "witness.after_mr_submit"):
            assert sessions[0].end_reason == "done", "a crash during done is finished, not treated as a death"
        assert witness.returncode() is None, witness.log_text()


async def test_agents_and_the_witness_killed_at_random_still_finish_every_bead(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Four beads with slow agents; the test kill -9s agents from outside at random and the witness twice."""
    pt = chaos_town
    rng = random.Random(SEED)
    witness = ServiceProcess("witness", witness_env(gt_env, pt, tmp_path, None), tmp_path / "witness.log")
    with running(witness):
        # Steps slow enough that the beads are still under way at the fifth agent kill: with quicker `gt` calls
        # (the client helper's warm workers), 0.4 s steps let all four finish after one witness kill.
        await pt.add_rig(agent_command="GT_AGENT_STEP_PAUSE=0.8 gt-agent", max_respawns=10, max_polecats=4)
        beads = [await pt.new_bead(f"Chaos bead {i}") for i in range(4)]
        for bead in beads:
            await pt.sling(bead)

        agent_kills = witness_kills = 0
        kill_witness_after = [2, 5]  # agent kills
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while loop.time() < deadline:
            state = await replayed(pt.nc)
            if all(state.beads.get(b) is not None and state.beads[b].merge_requested for b in beads):
                break
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            live = agents_of(pt.config, only_agents=True)
            if live and agent_kills < 8:
                victim = rng.choice(live)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                    agent_kills += 1
            if kill_witness_after and agent_kills >= kill_witness_after[0]:
                kill_witness_after.pop(0)
                witness.kill()
                witness_kills += 1
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                witness.start()
        state = await wait_converged(pt.nc, beads, timeout=180)
        await check_invariants(pt, beads, state)
        assert agent_kills >= 3, f"only {agent_kills} agents were killed: the chaos did not happen"
        assert witness_kills == 2
        deaths = [s for b in beads for s in sessions_of(state, b) if s.end_reason != "done"]
        assert deaths, "no session died: the kills hit nothing"
        assert all(s.end_reason in ("dead", "zombie") for s in deaths), [(s.id, s.end_reason) for s in deaths]


async def test_a_start_tried_again_after_a_crash_never_recycles_the_workspace_its_agent_works_in(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Found by the 200-bead chaos run: the witness killed between a session's pane start and ``session.started``,
    in a workspace recycled from the polecat's previous bead. Restarted, it prepared the workspace again, and since
    the previous bead had released it, recycled it under the agent already at work there: the branch set back to
    the base, the agent's commits gone from it. Every step's commit must reach `main`."""
    pt = chaos_town
    calm = ServiceProcess("witness", witness_env(gt_env, pt, tmp_path, None), tmp_path / "witness-calm.log")
    with running(calm):
        # Each session first commits a file of its own, needing nothing of the town (its witness may be down).
        early = 'echo "$GT_SESSION" > "EARLY-$GT_BEAD.txt" && git add -A && git commit -qm early; exec gt-agent'
        await pt.add_rig(agent_command=early, max_polecats=1)
        first = await pt.new_bead("The polecat's first bead")
        await pt.sling(first)
        await wait_converged(pt.nc, [first])

    marker = tmp_path / "crashed"
    env = witness_env(gt_env, pt, tmp_path, "witness.after_tmux_start")
    witness = ServiceProcess("witness", env, tmp_path / "witness.log")
    with running(witness):
        second = await pt.new_bead("The next bead, its witness killed once its pane started")
        await pt.sling(second)
        await wait_for_crash(witness, marker)
        [session] = sessions_of(await replayed(pt.nc), second)
        assert session.worktree == sessions_of(await replayed(pt.nc), first)[0].worktree, "the same workspace"

        def committed_early() -> bool:
            files = git.git("ls-tree", "--name-only", "HEAD", cwd=Path(session.worktree)).split()
            assert f"EARLY-{second}.txt" in files, "the agent has not committed its first file yet"
            return True

        await assert_eventually(committed_early, timeout=60, interval=0.1)
        witness.start()  # its crash point is spent (the marker): it runs on
        state = await wait_converged(pt.nc, [second])
        await check_invariants(pt, [second], state)
        assert sessions_of(state, second)[0].adopted, "the restarted witness adopted the agent at work"

        def on_main() -> bool:
            files = git.git("ls-tree", "--name-only", "main", cwd=pt.origin).split()
            assert f"EARLY-{second}.txt" in files, "the commit made before the witness came back is not on main"
            return True

        await assert_eventually(on_main, timeout=60)
        assert witness.returncode() is None, witness.log_text()


async def test_an_agent_that_hands_in_its_work_before_its_start_is_recorded_never_gets_a_start_after_its_end(
    chaos_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Found by a 200-bead chaos run: the witness, busy, recorded ``session.started`` only after the agent (fast,
    its calls served by its helper) had done every step, run `gt done` and its session had ended: a start after the
    end in the session's life. A start the agent overtook is not recorded; the session ends as it would have."""
    pt = chaos_town
    held = tmp_path / "hold"
    held.touch()
    env = {
        **witness_env(gt_env, pt, tmp_path, None),
        "GT_HOLD_AT": "witness.before_session_started",
        "GT_HOLD_FILE": str(held),
    }
    witness = ServiceProcess("witness", env, tmp_path / "witness.log")
    with running(witness):
        await pt.add_rig(agent_command="gt-agent")
        bead = await pt.new_bead("A bead worked before the witness records its start")
        await pt.sling(bead)

        async def ended() -> Session:
            sessions = sessions_of(await replayed(pt.nc), bead)
            assert len(sessions) == 1, f"sessions of the bead: {[s.id for s in sessions]}"
            session = sessions[0]
            assert session.status == "ended", f"the session is {session.status}: its agent has not handed in yet"
            return session

        session: Session = await assert_eventually(ended, timeout=120, interval=0.2)
        assert "hold_point_reached" in witness.log_text(), "the start was not held: the test proves nothing"
        held.unlink()

        def start_dropped() -> bool:
            # The bead may have converged before the held start is let go: wait for the witness to drop it.
            assert "session_start_overtaken" in witness.log_text(), "the witness has not yet let its held start go"
            return True

        await assert_eventually(start_dropped, timeout=60, interval=0.1)
        state = await wait_converged(pt.nc, [bead])
        await check_invariants(pt, [bead], state)
        life = [
            logged.type
            for _seq, _subject, data in await read_all(pt.nc, "GT_EVT")
            if (logged := decode_envelope(data)).type.startswith("session.")
            and msgspec.json.decode(logged.data).get("session_id") == session.id
        ]
        assert "session.started" not in life, life
        assert life[0] == "session.requested"
        assert life.index("session.done_intent") < life.index("session.ended") < life.index("session.cleaned")
        assert witness.returncode() is None, witness.log_text()
