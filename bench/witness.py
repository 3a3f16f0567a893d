"""(h) recovery: kill -9 of an agent -> its fresh session started, (i) spawn rate, (j), (k) the witness's CPU
and memory with many idle sessions.

Everything real: mayor, refinery and witness as their own processes (the witness with its default 5 s patrol),
the reference agent in tmux sessions on a tmux server of the benchmark's own, git worktrees of a real
repository. Agents run ``GT_AGENT_FAULT=hang gt-agent``: they start, then sleep without a heartbeat (idle).

(h): per kill, from ``kill -9`` of the agent process to the arrival of the next session's ``session.started``
    event; p50 and p99 over the kills. Ceiling: starting a tmux session running ``sleep`` and reading its
    pane pid, the least any respawn must do.
(i): sessions started per minute while N beads are slung at once, from the first sling to the last
    ``session.started``. Ceiling: the same number of ``git worktree add`` + ``tmux new-session`` done in a
    plain loop, without events, agents or checks (the median of three runs just before).
(j): the witness's CPU use over a quiet period with N idle sessions (its patrol observes every one of them each
    tick). Ceiling: the CPU one bare observation of N sessions costs (``tmux list-panes`` plus a process
    check per pane), once per patrol.
(k): the witness's resident memory with N sessions vs a bare interpreter that imported the same modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import psutil

from bench import common as common
from shared.bus import commands as bus_commands
from shared.bus.connection import Connection
from shared.core import subjects
from shared.core.config import TownConfig
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.commands import BeadCreate, BeadSling, Command, RigAdd
from shared.model.events import decode_envelope

R = TypeVar("R")

AGENT = "GT_AGENT_FAULT=hang gt-agent"
PATROL_S = 5.0


def make_origin(root: Path) -> Path:
    src = root / "origin-src"
    src.mkdir(parents=True)
    git.git("init", "--quiet", "-b", "main", str(src))
    (src / "README.md").write_text("a project for the benchmark\n")
    git.git("add", ".", cwd=src)
    git.git("commit", "--quiet", "-m", "init", cwd=src)
    origin = root / "origin.git"
    git.git("clone", "--quiet", "--bare", str(src), str(origin))
    return origin


class SessionEvents:
    """``session.started`` events as they arrive (core subscription: no replay, arrival time recorded)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[float, int]] = {}
        """Session id -> (monotonic arrival, pane pid)."""
        self.changed = asyncio.Event()

    async def subscribe(self, nc: Connection) -> None:
        async def on_msg(msg: Any) -> None:
            env = decode_envelope(msg.data)
            if env.type == "session.started":
                data = msgspec.json.decode(env.data)
                self.started[data["session_id"]] = (time.monotonic(), int(data["pane_pid"]))
                self.changed.set()

        await nc.subscribe(subjects.event_subject("session", ">"), cb=on_msg)

    async def wait_started(self, session: str, timeout: float) -> float:
        """Until ``session`` started; its arrival time."""
        await self.wait_for(lambda: session in self.started, timeout)
        return self.started[session][0]

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


async def command(nc: Connection, cmd: Command[R], *, timeout: float = 60) -> R:
    """One command sent as the CLI sends it (``shared.bus.commands.send``), answered by its own outcome (services
    store outcomes of their own commands meanwhile); its result."""
    cmd = msgspec.structs.replace(cmd, cmd_id=f"bench-{uuid.uuid4().hex[:12]}")
    outcome = await bus_commands.send(nc, TownConfig(), cmd, timeout=timeout, wait_if_down=True)
    accepted = outcome.accepted
    if accepted is None:
        raise RuntimeError(f"{cmd} was not accepted: {outcome.rejected or 'no outcome within ' + str(timeout) + 's'}")
    return accepted.result


async def create_and_sling(nc: Connection, rig: str, count: int) -> tuple[list[str], float]:
    """Create ``count`` beads, then sling them all at once; (ids, monotonic time the slings began)."""
    _, _, outcomes = await common.run_commands(nc, [BeadCreate(title=f"idle bead {i}") for i in range(count)])
    ids = [str(o["result"]["id"]) for o in outcomes]
    slings = [BeadSling(id=bead, rig=rig) for bead in ids]
    began = time.monotonic()
    _, _, outcomes = await common.run_commands(nc, slings)
    if any(o["type"] != "cmd.accepted" for o in outcomes):
        raise RuntimeError("a sling was rejected")
    return ids, began


def agent_of(pane_pid: int, timeout: float = 30.0) -> psutil.Process:
    """The agent under a pane once it is idle (``sleep``: it has hung as told)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # Below the pane's own process (the session's reaper), the agent's command line's shell.
            for child in psutil.Process(pane_pid).children(recursive=True):
                if child.name() == "sleep":
                    return child
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.01)
    try:
        tree = [f"{c.pid} {c.name()} {c.cmdline()}" for c in psutil.Process(pane_pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = ["(the pane's process is gone)"]
    raise RuntimeError(f"no idle agent under pane pid {pane_pid}: {tree}")


def tmux_start_ceiling(socket: str, runs: int) -> list[float]:
    """Seconds to start a tmux session running ``sleep`` and know its pane pid, ``runs`` times."""
    tmux = Tmux(socket)
    times = []
    for i in range(runs):
        began = time.perf_counter()
        tmux.start(f"ceiling-{i}", "sleep 600", cwd="/", env={"PATH": "/usr/bin:/bin"})
        times.append(time.perf_counter() - began)
        tmux.kill(f"ceiling-{i}")
    return times


def spawn_ceiling(root: Path, origin: Path, socket: str, count: int, runs: int = 3) -> float:
    """Seconds for ``count`` x (``git worktree add`` + ``tmux new-session``) in a plain loop: the median of
    ``runs`` (one run varies by a third on a 2-core machine)."""
    runs_s = [_spawn_loop(root / f"ceiling-{run}", origin, f"{socket}-{run}", count) for run in range(runs)]
    return statistics.median(runs_s)


def _spawn_loop(root: Path, origin: Path, socket: str, count: int) -> float:
    clone = root / "ceiling.git"
    git.git("clone", "--quiet", "--bare", str(origin), str(clone))
    tmux = Tmux(socket)
    began = time.perf_counter()
    for i in range(count):
        worktree = root / "ceiling-worktrees" / f"w{i}"
        git.git("worktree", "add", "--quiet", "-b", f"c{i}", str(worktree), "main", cwd=clone)
        tmux.start(f"spawn-ceiling-{i}", "sleep 600", cwd=str(worktree), env={"PATH": "/usr/bin:/bin"})
    elapsed = time.perf_counter() - began
    tmux.kill_server()
    return elapsed


def observation_cpu(socket: str, rounds: int = 20) -> float:
    """CPU seconds (this process and its tmux client children) of one bare observation of every session."""
    tmux = Tmux(socket)
    me = psutil.Process()
    before = me.cpu_times()
    for _ in range(rounds):
        for pane in tmux.snapshot().values():
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pane.pane_pid).create_time()
    after = me.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    used += (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return float(used) / rounds


def baseline_rss() -> float:
    """Resident memory (MiB) of a bare interpreter that imported what the witness imports."""
    code = (
        "import services.witness.service, shared.service.entrypoint, psutil; print(psutil.Process().memory_info().rss)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out) / 2**20


async def run(kills: int = 50, idle_sessions: int = 200, quiet_s: float = 30.0) -> list[common.Figure]:
    figures: list[common.Figure] = []
    socket = f"gt-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-witness-") as tmp, common.server() as srv:
        root = Path(tmp)
        origin = make_origin(root)
        raw_start = tmux_start_ceiling(f"{socket}-raw", kills)
        Tmux(f"{socket}-raw").kill_server()
        spawn_ceiling_s = spawn_ceiling(root, origin, f"{socket}-spawn", idle_sessions)

        nc, _town = await common.provisioned(srv.url)
        # (h) kills each bead's sessions ten times in a row, a crash loop by the witness's rule, which it would
        # answer with its respawn backoff: the recovery measured is that of one crash (respawned at once).
        env = {"GT_HOME": str(root / "home"), "GT_TMUX_SOCKET": socket, "GT_KILL_GRACE": "1", "GT_RESPAWN_BACKOFF": "0"}
        procs = {name: common.start_service(name, srv.url, env=env) for name in ("mayor", "refinery", "witness")}
        events = SessionEvents()
        try:
            for name in procs:
                await common.wait_ready(nc, name)
            await events.subscribe(nc)
            figures += await _recovery(nc, events, origin, kills, raw_start)
            witness = procs["witness"]
            figures += await _idle(nc, events, origin, idle_sessions, quiet_s, spawn_ceiling_s, witness, socket)
        finally:
            for proc in procs.values():
                common.stop_service(proc)
            Tmux(socket).kill_server()
            await nc.close()
    return figures


async def _recovery(
    nc: Connection, events: SessionEvents, origin: Path, kills: int, raw: list[float]
) -> list[common.Figure]:
    beads_n = 5
    await command(
        nc, RigAdd(name="kills", repo=str(origin), agent_command=AGENT, max_polecats=beads_n, max_respawns=100)
    )
    beads, _ = await create_and_sling(nc, "kills", beads_n)
    current = {bead: f"{bead}-1" for bead in beads}
    await events.wait_for(lambda: all(s in events.started for s in current.values()), timeout=120)
    latencies = []
    for k in range(kills):
        bead = beads[k % beads_n]
        session = current[bead]
        agent = await asyncio.to_thread(agent_of, events.started[session][1])
        attempt = int(session.rsplit("-", 1)[1])
        successor = f"{bead}-{attempt + 1}"
        killed_at = time.monotonic()
        os.kill(agent.pid, signal.SIGKILL)
        latencies.append(await events.wait_started(successor, timeout=60) - killed_at)
        current[bead] = successor
    p50, p99 = common.percentile(latencies, 50), common.percentile(latencies, 99)
    raw50, raw99 = common.percentile(raw, 50), common.percentile(raw, 99)
    out = [
        common.Figure(
            name=f"(h) kill -9 of an agent -> its fresh session started, p50 over {kills} kills",
            value=p50 * 1000,
            unit="ms",
            ceiling=raw50 * 1000,
            ceiling_name="raw tmux new-session",
            higher_is_better=False,
            notes=[f"default patrol {PATROL_S:g}s; the death is seen through a pidfd, not the patrol"],
        ),
        common.Figure(
            name=f"(h) kill -9 of an agent -> its fresh session started, p99 over {kills} kills",
            value=p99 * 1000,
            unit="ms",
            ceiling=raw99 * 1000,
            ceiling_name="raw tmux new-session",
            target="< 2000 ms",
            higher_is_better=False,
            notes=[f"max {max(latencies) * 1000:.0f} ms; includes warrant, kill, re-sling (mayor), worktree reuse"],
        ),
    ]
    for figure in out:
        print(figure.line(), flush=True)
    return out


async def _idle(
    nc: Connection,
    events: SessionEvents,
    origin: Path,
    count: int,
    quiet_s: float,
    spawn_ceiling_s: float,
    witness: subprocess.Popen[bytes],
    socket: str,
) -> list[common.Figure]:
    await command(nc, RigAdd(name="idle", repo=str(origin), agent_command=AGENT, max_polecats=count))
    beads, began = await create_and_sling(nc, "idle", count)
    wanted = [f"{bead}-1" for bead in beads]
    await events.wait_for(lambda: all(s in events.started for s in wanted), timeout=900)
    spawn_s = max(events.started[s][0] for s in wanted) - began
    spawn = common.Figure(
        name=f"(i) sessions started while {count} beads are slung at once",
        value=count / spawn_s * 60,
        unit="sessions/min",
        ceiling=count / spawn_ceiling_s * 60,
        ceiling_name="git worktree add + tmux new-session loop",
        notes=[f"{spawn_s:.1f}s for {count}; each also starts a Python agent and records two events"],
    )
    print(spawn.line(), flush=True)

    await asyncio.sleep(PATROL_S * 2)  # settle: every agent has hung, the start-up work is over
    proc = psutil.Process(witness.pid)
    before, t0 = proc.cpu_times(), time.monotonic()
    await asyncio.sleep(quiet_s)
    after, elapsed = proc.cpu_times(), time.monotonic() - t0
    cpu = ((after.user - before.user) + (after.system - before.system)) / elapsed
    cpu += ((after.children_user - before.children_user) + (after.children_system - before.children_system)) / elapsed
    floor = await asyncio.to_thread(observation_cpu, socket)
    rss = proc.memory_info().rss / 2**20
    base = await asyncio.to_thread(baseline_rss)
    out = [
        spawn,
        common.Figure(
            name=f"(j) witness CPU with {count} idle sessions",
            value=cpu * 100,
            unit="% of a core",
            ceiling=floor / PATROL_S * 100,
            ceiling_name="one bare observation per patrol",
            higher_is_better=False,
            notes=[f"over {elapsed:.0f}s; patrol {PATROL_S:g}s; tmux and git children included"],
        ),
        common.Figure(
            name=f"(k) witness resident memory with {count} sessions",
            value=rss,
            unit="MiB",
            ceiling=base,
            ceiling_name="interpreter with the same imports",
            higher_is_better=False,
            notes=[f"{(rss - base) * 1024 / count:.0f} KiB per session above the interpreter"],
        ),
    ]
    for figure in out[1:]:
        print(figure.line(), flush=True)
    return out


if __name__ == "__main__":
    started = time.perf_counter()
    asyncio.run(run())
    print(f"{time.perf_counter() - started:.1f}s")
