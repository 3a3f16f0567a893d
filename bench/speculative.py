"""(v) speculative gating on gate runners, against the refinery gating alone (serial mode).

Everything real: nats-server, mayor, witness, refinery and the gate runners (``gt-runner``) as their own processes,
real git, a real gate command (``sleep`` 5 s in full runs, then a check that fails when the change added a
FAIL_TESTS file).

N merge requests of disjoint changes (the one in the middle failing its gate) are submitted at once, the way
`gt done` submits them, to a fresh town per mode:

- serial: ``GT_MQ_BATCH=1`` and no runners, the refinery runs each gate itself, one after the other;
- R runners: ``GT_MQ_RUNNERS=R`` and R runner processes, with batches of R (the default) and of N
  (``GT_MQ_BATCH=N``). The refinery gates the prefixes of a batch R at a time, each a job on its own runner
  (``services.refinery.effects.merger._land_in_rounds``); on red it runs the failing gate once on the target too
  (whose fault is it), takes the culprit out and gates what stood behind it again.

``GT_MQ_BATCH_WAIT`` lets a batch fill (the submissions all arrive within a fraction of a second). Wall time is
from the first submit to the last ``mr.merged``/``mr.failed`` event (their arrival here). The ceiling of a runner
mode is serial mode in the same run (ratio = serial / runners: the target, runners / serial at most 0.35, is a
ratio of at least 2.86); the ceiling of serial mode's wall time is the time its gates alone took. The notes give
what the log says of the gate jobs: how many, in how many rounds, the wait from ``gate.requested`` to
``gate.started`` (a runner taking it), the gates' own seconds, and the time the refinery spent between rounds.

python -m bench.speculative            # 16 merge requests, gate 5 s, 4 runners
python -m bench.speculative --quick    # 4 merge requests, gate 0.5 s, 2 runners
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import structlog

from bench.common import LOG_DIR, Figure, provisioned, run_commands, server, start_service, wait_ready
from bench.refinery import MergeEvents, gate, push_branches, status_of
from bench.reposize import stop_all
from bench.witness import command, make_origin
from shared.bus.connection import Connection
from shared.bus.reader import EventReader
from shared.core import subjects
from shared.host import git
from shared.model.commands import BeadCreate, MergeRequestSubmit, RigAdd
from shared.model.events import decode_envelope

SERVICES = ("mayor", "witness", "refinery")
READY_TIMEOUT_S = 120.0
GATE_EVENTS = subjects.event_subject("gate", "")


def runner_name(n: int) -> str:
    return f"bench-{n}"


def start_runners(count: int, url: str, env: dict[str, str], stamp: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """``count`` gate runners as processes (``python -m services.runner``, default settings), each with its log."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    out = []
    for n in range(count):
        log_path = LOG_DIR / f"runner-{runner_name(n)}-{stamp}.log"
        proc = start_service("runner", url, log_path=log_path, env={**env, "GT_RUNNER_NAME": runner_name(n)})
        out.append((proc, log_path))
    return out


async def runners_ready(runners: list[tuple[subprocess.Popen[bytes], Path]], timeout: float = READY_TIMEOUT_S) -> None:
    """Until every runner logged ``service_ready`` (runners share one query name: their status says not which)."""
    deadline = time.monotonic() + timeout
    for proc, log_path in runners:
        while '"service_ready"' not in (log_path.read_text(errors="replace") if log_path.exists() else ""):
            if proc.poll() is not None:
                raise RuntimeError(f"runner exited {proc.returncode} before it was ready (see {log_path})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"runner not ready within {timeout:g}s (see {log_path})")
            await asyncio.sleep(0.05)


@dataclass
class GateJobTrail:
    """One gate job as the log tells it (the events' own times)."""

    stack: list[str]
    requested: datetime
    started: list[tuple[datetime, str]] = field(default_factory=list)
    """(when, runner) of each take."""
    finished: datetime | None = None
    passed: bool = False
    results: list[dict[str, Any]] = field(default_factory=list)
    cancelled: datetime | None = None


class GateLog:
    """The gate job events stored in the log (``read``: what a core subscription would see includes the takes that
    lost their race and were refused), by job, in request order."""

    def __init__(self) -> None:
        self.jobs: dict[str, GateJobTrail] = {}

    def apply(self, _seq: int, subject: str, data: bytes) -> None:
        if not subject.startswith(GATE_EVENTS):
            return
        env = decode_envelope(data)
        payload = msgspec.json.decode(env.data)
        job_id = payload["job_id"]
        if env.type == "gate.requested":
            self.jobs[job_id] = GateJobTrail(stack=list(payload.get("stack", [])), requested=env.ts)
            return
        job = self.jobs.get(job_id)
        if job is None:
            return
        if env.type == "gate.started":
            job.started.append((env.ts, payload["runner"]))
        elif env.type == "gate.finished":
            job.finished, job.passed, job.results = env.ts, bool(payload["passed"]), list(payload.get("results", []))
        elif env.type == "gate.cancelled" and job.cancelled is None:
            job.cancelled = env.ts

    @classmethod
    async def read(cls, nc: Connection, stream: str) -> GateLog:
        """Every gate job event stored in ``stream`` so far."""
        found = cls()
        reader = EventReader(nc, stream, found.apply)
        task = asyncio.create_task(reader.run())
        try:
            last = await reader.stream_last_seq()
            await reader.wait_for_seq(last, timeout=60)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return found

    def rounds(self) -> list[list[GateJobTrail]]:
        """Jobs requested together (within 0.5 s of the round's first), in order."""
        out: list[list[GateJobTrail]] = []
        for job in sorted(self.jobs.values(), key=lambda j: j.requested):
            if out and (job.requested - out[-1][0].requested).total_seconds() < 0.5:
                out[-1].append(job)
            else:
                out.append([job])
        return out

    def summary(self, first_submit: datetime) -> str:
        """What the log says of the jobs: the rounds (jobs requested together, how long until the last of them
        answered), the wait for a runner to take a job, a job's time on its runner beyond its gates (fetch,
        workspace), and the refinery's time between one round's answer and the next round's requests (settling,
        restacking, pushing the candidates' refs)."""
        jobs = list(self.jobs.values())
        rounds = self.rounds()
        if not rounds:
            return "no gate jobs"
        waits = [(j.started[0][0] - j.requested).total_seconds() for j in jobs if j.started]
        gates = [float(r["seconds"]) for j in jobs if j.finished is not None for r in j.results]
        beyond = [
            (j.finished - j.started[-1][0]).total_seconds() - sum(float(r["seconds"]) for r in j.results)
            for j in jobs
            if j.finished is not None and j.started
        ]
        shape, gaps = [], []
        answered: datetime | None = None
        for batch in rounds:
            if answered is not None:
                gaps.append((batch[0].requested - answered).total_seconds())
            ends = [j.finished for j in batch if j.finished is not None]
            answered = max(ends, default=None) or max((j.cancelled for j in batch if j.cancelled), default=None)
            red = sum(1 for j in batch if j.finished is not None and not j.passed)
            what = "the target" if all(not j.stack for j in batch) else f"{len(batch)}"
            took = f" {(answered - batch[0].requested).total_seconds():.1f}s" if answered is not None else ""
            shape.append(what + (f" ({red} red)" if red else "") + took)
        to_first = (rounds[0][0].requested - first_submit).total_seconds()
        cancelled = sum(1 for j in jobs if j.cancelled is not None and j.finished is None)
        retaken = sum(1 for j in jobs if len(j.started) > 1)
        return (
            f"{len(jobs)} jobs in {len(rounds)} rounds [{', '.join(shape)}]"
            + (f", {cancelled} cancelled before their end" if cancelled else "")
            + (f", {retaken} taken twice" if retaken else "")
            + f"; first submit to first request {to_first:.2f}s"
            + f"; request to a runner's take p50 {_p50(waits) * 1000:.0f} ms, max {max(waits, default=0) * 1000:.0f} ms"
            + f"; a gate {_p50(gates):.2f}s p50, a job's runner time beyond its gates {_p50(beyond):.2f}s p50"
            + (f"; refinery between rounds {', '.join(f'{g:.2f}' for g in gaps)}s" if gaps else "")
        )


def _p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2] if ordered else 0.0


@dataclass
class ModeRun:
    mode: str
    runners: int
    batch: int
    gate_runs: int
    gate_seconds: float
    wall_s: float
    jobs: str
    """What the log says of the gate jobs (runner modes)."""
    load: str
    """The machine's load average around the run (other work on it weighs on every figure)."""


async def _queue(n: int, gate_s: float, *, runners: int, batch: int) -> ModeRun:
    """A fresh town; N merge requests (the one in the middle failing) submitted at once; until all settled."""
    mode = "serial" if runners == 0 else f"{runners} runners, batch of {batch}"
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:4]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-spec-") as tmp, server() as srv:
        root = Path(tmp)
        origin = make_origin(root)
        nc, town = await provisioned(srv.url)
        env = {
            "GT_HOME": str(root / "home"),
            "GT_TMUX_SOCKET": f"gt-bench-{uuid.uuid4().hex[:8]}",
            "GT_MQ_BATCH": str(batch),
            "GT_MQ_BATCH_WAIT": "60",
            **({"GT_MQ_RUNNERS": str(runners)} if runners else {}),
        }
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        procs = {
            name: start_service(name, srv.url, env=env, log_path=LOG_DIR / f"{name}-spec-{stamp}.log")
            for name in SERVICES
        }
        runner_procs = start_runners(runners, srv.url, env, stamp)
        events = MergeEvents()
        try:
            for name in SERVICES:
                await wait_ready(nc, name, timeout=READY_TIMEOUT_S)
            await runners_ready(runner_procs)
            await events.subscribe(nc)
            await command(nc, RigAdd(name="spec", repo=str(origin), test_command=gate(gate_s)))
            _, _, outcomes = await run_commands(nc, [BeadCreate(title=f"change {i}", prefix="spec") for i in range(n)])
            beads = [str(o["result"]["id"]) for o in outcomes]
            branches = await asyncio.to_thread(push_branches, root, origin, beads, n // 2)
            submits = [
                MergeRequestSubmit(bead=bead, rig="spec", branch=branch, head=head)
                for bead, (branch, head) in zip(beads, branches, strict=True)
            ]
            load_before = os.getloadavg()[0]
            first_submit = datetime.now(UTC)
            began = time.monotonic()
            _, _, outcomes = await run_commands(nc, submits)
            ids = [str(o["result"]["id"]) for o in outcomes]
            await events.wait_for(lambda: all(i in events.settled for i in ids), timeout=1800)
            wall = max(events.settled[i][0] for i in ids) - began
            kinds = sorted(events.settled[i][1] for i in ids)
            if kinds != ["mr.failed"] + ["mr.merged"] * (n - 1):
                raise RuntimeError(f"{mode}: expected one failure and {n - 1} merges, got {kinds}")
            tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=origin).split()
            if "FAIL_TESTS" in tree or len([f for f in tree if f.startswith("work-")]) != n - 1:
                raise RuntimeError(f"{mode}: main holds {tree}")
            status = await status_of(nc, "refinery")
            await asyncio.sleep(0.2)  # the last gate events (cancellations) in
            jobs = await GateLog.read(nc, town.evt_stream)
            summary = jobs.summary(first_submit) if runners else f"{status['batches']} batches"
            run = ModeRun(
                mode=mode, runners=runners, batch=batch, gate_runs=status["gate_runs"],
                gate_seconds=status["gate_seconds"], wall_s=wall, jobs=summary,
                load=f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
            )  # fmt: skip
            print(
                f"  {mode}: {wall:.2f}s, {run.gate_runs} gate runs ({run.gate_seconds:.1f}s); {summary}; {run.load}",
                flush=True,
            )
            return run
        finally:
            everything = {**procs, **{f"runner-{n}": p for n, (p, _) in enumerate(runner_procs)}}
            try:
                await asyncio.to_thread(stop_all, everything, env["GT_TMUX_SOCKET"])
            finally:
                await nc.close()


async def measure(mrs: int, gate_s: float, runners: int) -> tuple[ModeRun, list[ModeRun]]:
    serial = await _queue(mrs, gate_s, runners=0, batch=1)
    batches = sorted({runners, mrs})
    return serial, [await _queue(mrs, gate_s, runners=runners, batch=b) for b in batches]


def figures_of(mrs: int, gate_s: float, serial: ModeRun, modes: list[ModeRun]) -> list[Figure]:
    what = f"(v) speculative gating, {mrs} MRs (1 failing), gate {gate_s:g} s"
    figures = [
        Figure(
            name=f"{what}, serial (the refinery's own gates): wall time",
            value=serial.wall_s,
            unit="s",
            ceiling=serial.gate_seconds,
            ceiling_name="its gates alone",
            higher_is_better=False,
            notes=[f"{serial.gate_runs} gate runs (a failure is run again on the target); {serial.jobs}", serial.load],
        )
    ]
    for run in modes:
        figures.append(
            Figure(
                name=f"{what}, {run.runners} runners, batch of {run.batch}: wall time",
                value=run.wall_s,
                unit="s",
                ceiling=serial.wall_s,
                ceiling_name="serial mode (a baseline: the ratio is the speed-up over it)",
                target="runners/serial <= 0.35 (ratio >= 2.86)",
                higher_is_better=False,
                notes=[
                    f"runners/serial = {run.wall_s / serial.wall_s:.2f}",
                    f"{run.gate_runs} gate runs ({run.gate_seconds:.1f} s of gates on {run.runners} runners)",
                    run.jobs,
                    run.load,
                ],
            )
        )
    return figures


async def run(mrs: int = 16, gate_s: float = 5.0, runners: int = 4) -> list[Figure]:
    serial, modes = await measure(mrs, gate_s, runners)
    figures = figures_of(mrs, gate_s, serial, modes)
    for figure in figures:
        print(figure.line(), flush=True)
        print(f"    {'; '.join(figure.notes)}", flush=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speculative", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 merge requests, gate 0.5 s, 2 runners: a smoke run")
    parser.add_argument("--mrs", type=int, help="merge requests (default 16; 4 quick)")
    parser.add_argument("--gate", type=float, help="seconds the gate sleeps (default 5; 0.5 quick)")
    parser.add_argument("--runners", type=int, help="gate runners (default 4; 2 quick)")
    args = parser.parse_args()
    mrs = args.mrs or (4 if args.quick else 16)
    gate_s = args.gate if args.gate is not None else (0.5 if args.quick else 5.0)
    runners = args.runners or (2 if args.quick else 4)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    started = time.perf_counter()
    asyncio.run(run(mrs, gate_s, runners))
    print(f"{time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
