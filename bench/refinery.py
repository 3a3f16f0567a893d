"""(l) the merge queue in serial and batch mode, (m) from `gt done` to merged, less the gates.

Everything real: mayor, witness and refinery as their own processes, real git repositories, a real gate
command (``sleep`` 1 s in full runs, then a check that fails when the change added a FAIL_TESTS file).

(l): N merge requests of disjoint changes (one of them failing its tests) are submitted at once, the way
    `gt done` submits them, to a fresh town per mode: serial (``GT_MQ_BATCH=1``), and batch mode with K=4 and
    K=N (``GT_MQ_BATCH_WAIT`` lets a batch fill). Gate runs are counted by the refinery; wall time is from the
    first submit to the last merged/failed event. The ceiling of batch mode is serial mode in the same run
    (ratio = serial / batch, so 2 means half the gate runs); the ceiling of serial mode's wall time is the time
    its gates alone took.
(m): the reference agent works beads one after the other in real tmux sessions and finishes each with
    `gt done`. Per bead: from its ``session.done_intent`` event (the first thing `gt done` stores) to its
    ``mr.merged`` event, less the gate seconds recorded in ``mr.merged``. Ceiling: the git a merge must do in
    a plain loop (fetch, worktree add, rebase, fast-forward push, ls-remote, worktree remove).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from bench.common import Figure, percentile, provisioned, run_commands, server, start_service, stop_service, wait_ready
from bench.witness import command, make_origin
from shared.bus.connection import Connection
from shared.bus.query import ask_json
from shared.core import subjects
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.commands import BeadCreate, BeadSling, MergeRequestSubmit, RigAdd
from shared.model.events import decode_envelope
from shared.model.queries import Status


def gate(seconds: float) -> str:
    return f"sleep {seconds:g}; test ! -e FAIL_TESTS"


IDENTITY = ("-c", "user.name=Bench", "-c", "user.email=bench@test.invalid")


class MergeEvents:
    """The merge request and session events that matter here, as they arrive (core subscription)."""

    def __init__(self) -> None:
        self.settled: dict[str, tuple[float, str]] = {}
        """Merge request -> (monotonic arrival, merged or failed)."""
        self.merged: dict[str, dict[str, Any]] = {}
        """Bead -> its mr.merged payload, with the event's time as ``ts``."""
        self.done_intent: dict[str, datetime] = {}
        """Session -> when `gt done` began."""
        self.bead_of_mr: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def subscribe(self, nc: Connection) -> None:
        async def on_msg(msg: Any) -> None:
            env = decode_envelope(msg.data)
            data = msgspec.json.decode(env.data)
            if env.type == "mr.submitted":
                self.bead_of_mr[data["mr_id"]] = data["bead"]
            elif env.type in ("mr.merged", "mr.failed"):
                self.settled[data["mr_id"]] = (time.monotonic(), env.type)
                if env.type == "mr.merged" and data["mr_id"] in self.bead_of_mr:
                    self.merged[self.bead_of_mr[data["mr_id"]]] = {**data, "ts": env.ts}
            elif env.type == "session.done_intent":
                self.done_intent[data["session_id"]] = env.ts
            self.changed.set()

        await nc.subscribe(subjects.event_subject("mr", ">"), cb=on_msg)
        await nc.subscribe(subjects.event_subject("session", ">"), cb=on_msg)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


def push_branches(root: Path, origin: Path, beads: list[str], failing: int) -> list[tuple[str, str]]:
    """One branch per bead off main, each adding its own file (``failing`` adds FAIL_TESTS too); (branch, head)."""
    clone = root / "pusher"
    git.git("clone", "--quiet", str(origin), str(clone))
    out = []
    for n, bead in enumerate(beads):
        branch = f"polecat/bench/{bead}"
        git.git("checkout", "--quiet", "-B", branch, "origin/main", cwd=clone)
        (clone / f"work-{n:02d}.txt").write_text(f"change {n}\n")
        if n == failing:
            (clone / "FAIL_TESTS").write_text("this change breaks the tests\n")
        git.git("add", ".", cwd=clone)
        git.git(*IDENTITY, "commit", "--quiet", "-m", f"{bead}: change {n}", cwd=clone)
        out.append((branch, git.git("rev-parse", "HEAD", cwd=clone).strip()))
    git.git("push", "--quiet", "origin", *(f"{b}:refs/heads/{b}" for b, _ in out), cwd=clone)
    return out


async def status_of(nc: Connection, service: str) -> dict[str, Any]:
    """The service's status with its own counters (the refinery's gate runs and batches)."""
    result: dict[str, Any] = await ask_json(nc, Status(service=service), timeout=10)
    return result


class QueueRun(msgspec.Struct, frozen=True, kw_only=True):
    batch: int
    gate_runs: int
    gate_seconds: float
    wall_s: float


async def _queue(n: int, batch: int, gate_s: float) -> QueueRun:
    """A fresh town; N merge requests (the one in the middle failing) submitted at once; until all settled."""
    with tempfile.TemporaryDirectory(prefix="gt-bench-mq-") as tmp, server() as srv:
        root = Path(tmp)
        origin = make_origin(root)
        nc, _town = await provisioned(srv.url)
        env = {
            "GT_HOME": str(root / "home"),
            "GT_TMUX_SOCKET": f"gt-bench-{uuid.uuid4().hex[:8]}",
            "GT_MQ_BATCH": str(batch),
            "GT_MQ_BATCH_WAIT": "60",
        }
        procs = {name: start_service(name, srv.url, env=env) for name in ("mayor", "witness", "refinery")}
        events = MergeEvents()
        try:
            for name in procs:
                await wait_ready(nc, name)
            await events.subscribe(nc)
            await command(nc, RigAdd(name="mq", repo=str(origin), test_command=gate(gate_s)))
            _, _, outcomes = await run_commands(nc, [BeadCreate(title=f"change {i}", prefix="mq") for i in range(n)])
            beads = [str(o["result"]["id"]) for o in outcomes]
            branches = await asyncio.to_thread(push_branches, root, origin, beads, n // 2)
            submits = [
                MergeRequestSubmit(bead=bead, rig="mq", branch=branch, head=head)
                for bead, (branch, head) in zip(beads, branches, strict=True)
            ]
            began = time.monotonic()
            _, _, outcomes = await run_commands(nc, submits)
            ids = [str(o["result"]["id"]) for o in outcomes]
            await events.wait_for(lambda: all(i in events.settled for i in ids), timeout=1800)
            wall = max(events.settled[i][0] for i in ids) - began
            kinds = sorted(events.settled[i][1] for i in ids)
            if kinds != ["mr.failed"] + ["mr.merged"] * (n - 1):
                raise RuntimeError(f"batch {batch}: expected one failure and {n - 1} merges, got {kinds}")
            tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=origin).split()
            if "FAIL_TESTS" in tree or len([f for f in tree if f.startswith("work-")]) != n - 1:
                raise RuntimeError(f"batch {batch}: main holds {tree}")
            status = await status_of(nc, "refinery")
            return QueueRun(
                batch=batch, gate_runs=status["gate_runs"], gate_seconds=status["gate_seconds"], wall_s=wall
            )
        finally:
            for proc in procs.values():
                stop_service(proc)
            Tmux(env["GT_TMUX_SOCKET"]).kill_server()
            await nc.close()


def git_floor(root: Path, origin: Path, runs: int) -> list[float]:
    """Seconds of the git one merge needs, done bare in a loop (branches pushed beforehand, untimed)."""
    bare = root / "floor.git"
    git.ensure_bare_clone(str(origin), bare)
    branches = push_branches(root, origin, [f"floor-{i}" for i in range(runs)], failing=-1)
    times = []
    for i, (branch, _head) in enumerate(branches):
        work = root / f"floor-work-{i}"
        began = time.perf_counter()
        git.fetch(bare)
        git.git("worktree", "add", "--quiet", "--detach", str(work), f"refs/remotes/origin/{branch}", cwd=bare)
        git.git("rebase", "--quiet", "refs/remotes/origin/main", cwd=work)
        tip = git.git("rev-parse", "HEAD", cwd=work).strip()
        git.git("push", "--quiet", "origin", f"{tip}:refs/heads/main", cwd=work)
        git.git("ls-remote", "origin", "refs/heads/main", cwd=work)
        git.force_remove(work)
        git.git("worktree", "prune", cwd=bare)
        times.append(time.perf_counter() - began)
    return times


def merged_bead(events: MergeEvents, bead: str) -> Callable[[], bool]:
    return lambda: bead in events.merged


async def _done_to_merged(runs: int, gate_s: float) -> list[Figure]:
    socket = f"gt-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-done-") as tmp, server() as srv:
        root = Path(tmp)
        origin = make_origin(root)
        floor = await asyncio.to_thread(git_floor, root, make_origin(root / "floor"), runs)
        nc, _town = await provisioned(srv.url)
        env = {"GT_HOME": str(root / "home"), "GT_TMUX_SOCKET": socket}
        procs = {name: start_service(name, srv.url, env=env) for name in ("mayor", "witness", "refinery")}
        events = MergeEvents()
        try:
            for name in procs:
                await wait_ready(nc, name)
            await events.subscribe(nc)
            await command(
                nc, RigAdd(name="done", repo=str(origin), agent_command="gt-agent", test_command=gate(gate_s))
            )
            latencies = []
            for i in range(runs):
                bead = (await command(nc, BeadCreate(title=f"done {i}", prefix="done"))).id
                await command(nc, BeadSling(id=bead, rig="done"))
                await events.wait_for(merged_bead(events, bead), timeout=300)
                merged = events.merged[bead]
                began = min(ts for s, ts in events.done_intent.items() if s.startswith(f"{bead}-"))
                latencies.append((merged["ts"] - began).total_seconds() - merged["gate_seconds"])
        finally:
            for proc in procs.values():
                stop_service(proc)
            Tmux(socket).kill_server()
            await nc.close()
    floor50 = percentile(floor, 50)
    return [
        Figure(
            name=f"(m) `gt done` -> merged, less the gates, p50 over {runs} beads",
            value=percentile(latencies, 50) * 1000,
            unit="ms",
            ceiling=floor50 * 1000,
            ceiling_name="the merge's git alone",
            target="< 2000 ms",
            higher_is_better=False,
            notes=[f"gate {gate_s:g} s subtracted as recorded in mr.merged; push, submit, claim, rebase, merge"],
        ),
        Figure(
            name=f"(m) `gt done` -> merged, less the gates, max over {runs} beads",
            value=max(latencies) * 1000,
            unit="ms",
            ceiling=max(floor) * 1000,
            ceiling_name="the merge's git alone, max",
            target="< 2000 ms",
            higher_is_better=False,
        ),
    ]


async def run(mrs: int = 16, done_runs: int = 5, gate_s: float = 1.0) -> list[Figure]:
    serial = await _queue(mrs, 1, gate_s)
    runs = [await _queue(mrs, k, gate_s) for k in (max(2, mrs // 4), mrs)]
    figures = [
        Figure(
            name=f"(l) merge queue, {mrs} MRs (1 failing), serial: wall time",
            value=serial.wall_s,
            unit="s",
            ceiling=serial.gate_seconds,
            ceiling_name="its gates alone",
            higher_is_better=False,
            notes=[f"{serial.gate_runs} gate runs of {gate_s:g} s (a failure is re-run on the target)"],
        )
    ]
    for r in runs:
        figures += [
            Figure(
                name=f"(l) merge queue, {mrs} MRs (1 failing), batch of {r.batch}: gate runs",
                value=r.gate_runs,
                unit="runs",
                ceiling=serial.gate_runs,
                ceiling_name="serial mode (a baseline: the ratio is the speed-up over it)",
                target="<= half of serial (ratio >= 2)",
                higher_is_better=False,
            ),
            Figure(
                name=f"(l) merge queue, {mrs} MRs (1 failing), batch of {r.batch}: wall time",
                value=r.wall_s,
                unit="s",
                ceiling=serial.wall_s,
                ceiling_name="serial mode (a baseline: the ratio is the speed-up over it)",
                higher_is_better=False,
                notes=[f"gates {r.gate_seconds:.1f} s of it"],
            ),
        ]
    figures += await _done_to_merged(done_runs, gate_s)
    for figure in figures:
        print(figure.line(), flush=True)
    return figures
