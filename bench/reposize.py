"""(u) repository size: merge overhead and session start on a 50,000-file repository, against a 100-file one.

Everything real: nats-server, mayor, witness and refinery as their own processes, the reference agent
(``gt-agent``) in real tmux sessions on a tmux server of the benchmark's own, real git. GT_HOME, the origins and
every clone, workspace and temporary directory of the town are on the ordinary disk (``--dir``, default /var/tmp;
a tmpfs is refused): what git does with 50,000 files costs what it costs on a disk, not in memory.

One town, two rigs with the gate ``true``: origins of small files spread over directories as in a monorepo
(``FILES_PER_DIR`` to a directory), one of 100 files and one of 50,000 (5,000 with ``--quick``). Beads are worked
one at a time per rig, the two rigs taking turns (small, large, small, ...) so that any drift of the machine
weighs on both alike; nothing runs at once. The agent makes its small change (a file per formula step, a commit
each) and ends with `gt done`. A rig's next bead is slung once the one before is closed (merged) and its sessions
are cleaned up, so no cleanup of one bead runs under the next one's start. A first bead per rig is not measured: it
makes the rig's clones, once per rig, not per bead, and no workspace was deleted before it (what it took is in the
notes).

Per measured bead, from the event log (GT_EVT, the times the writers gave the events):

- merge overhead less the gates: ``bead.closed`` - ``mr.submitted`` (of the merge request that merged) - the gate
  seconds recorded in ``mr.merged``: queueing, claim, fetch, rebase, push, the merge's workspace, the close;
- session start: ``session.started`` - ``session.requested``, every session of the bead: the workspace, the
  hook lease, the tmux pane and the agent's process.

Deleting a large tree costs more than its own time on ext4: on the machine this was written on, a 50,000-file
checkout takes 1.5 s, and 15-40 s (nearly all of it kernel time) when it comes right after a tree as large was
deleted on the same disk. Code that deletes a workspace after each session and merge and makes a new one for the
next pays that every bead: it is part of what this measures. So that another run's deletions do not count, start
it with no large deletion on that disk just before (the first bead of a rig, not measured, would meet it).

p50 and max per rig. The ceiling of the large rig's figure is the small rig's same figure, measured in the same
town in the same run; the ratio is small / large as for every time (higher is better); the note gives large /
small, what the targets are written in.

python -m bench.reposize             # 50,000 files, 6 beads a rig (and one unmeasured first bead)
python -m bench.reposize --quick     # 5,000 files, 2 beads a rig
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec
import psutil
import structlog

from bench.common import Figure, percentile, provisioned, server, start_service, stop_service, wait_ready
from bench.witness import command
from shared.bus.connection import Connection
from shared.bus.reader import EventReader
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.commands import BeadCreate, BeadSling, RigAdd
from shared.model.events import (
    BeadClosed,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRejected,
    MergeRequestSubmitted,
    SessionCleaned,
    SessionEnded,
    SessionEscalated,
    SessionRequested,
    SessionStarted,
    decode_envelope,
)

E = TypeVar("E", bound=msgspec.Struct)

FILES_PER_DIR = 100
"""Files to a directory in the origins (500 directories of 100 for 50,000 files)."""
SMALL_FILES = 100
GATE = "true"
AGENT = "gt-agent"
SERVICES = ("mayor", "witness", "refinery")
DEFAULT_DIR = Path("/var/tmp")
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
BEAD_TIMEOUT_S = 900.0
"""How long one bead may take from its sling to closed and cleaned up (today's code takes tens of seconds a bead
on 50,000 files)."""
WARMUP = 1
"""Beads per rig worked first and not measured: the rig's clones are made then."""
PROBLEMS = (
    MergeRequestFailed.TYPE,
    MergeRequestConflicted.TYPE,
    MergeRequestRejected.TYPE,
    SessionEscalated.TYPE,
)
"""Events that mean a bead will not get through on its own (the gate is ``true``, changes never conflict): the
benchmark stops at once rather than wait out its deadline."""


def disk_root(where: Path) -> Path:
    """``where`` (made if missing), refused when it is on a filesystem in memory."""
    where.mkdir(parents=True, exist_ok=True)
    resolved = where.resolve()
    mounts = [p for p in psutil.disk_partitions(all=True) if resolved.is_relative_to(p.mountpoint)]
    mount = max(mounts, key=lambda p: len(p.mountpoint), default=None)
    if mount is not None and mount.fstype in MEMORY_FILESYSTEMS:
        raise ValueError(f"{where} is on {mount.fstype} ({mount.mountpoint}): the town must be on a disk (--dir)")
    return resolved


def module_path(index: int) -> str:
    return f"pkg{index // FILES_PER_DIR:04d}/mod{index % FILES_PER_DIR:03d}.py"


def make_monorepo(root: Path, name: str, files: int) -> Path:
    """A bare origin of ``files`` small files, each different, ``FILES_PER_DIR`` to a directory, one commit on
    main (written with ``git fast-import``: no work tree to make and delete)."""
    origin = root / f"{name}.git"
    git.git("init", "--quiet", "--bare", "-b", "main", str(origin))
    parts: list[bytes] = []
    for i in range(files):
        body = (
            f'"""Module {i} of a monorepo for the benchmark."""\n\nVALUE = {i}\n\n\n'
            f"def value() -> int:\n    return VALUE + {i % 7}\n"
        ).encode()
        parts.append(b"blob\nmark :%d\ndata %d\n%b\n" % (i + 1, len(body), body))
    readme = f"a monorepo of {files:,} files for the benchmark\n".encode()
    message = f"{files:,} files".encode()
    parts.append(
        b"commit refs/heads/main\ncommitter Bench <bench@test.invalid> 1767225600 +0000\ndata %d\n%b\n"
        % (len(message), message)
    )
    parts.append(b"M 100644 inline README.md\ndata %d\n%b\n" % (len(readme), readme))
    parts += [b"M 100644 :%d %b\n" % (i + 1, module_path(i).encode()) for i in range(files)]
    parts.append(b"done\n")
    subprocess.run(
        ["git", "fast-import", "--quiet", "--done"],
        cwd=origin,
        input=b"".join(parts),
        env=git.git_environment(),
        capture_output=True,
        check=True,
    )
    tree = git.git("ls-tree", "-r", "--name-only", "refs/heads/main", cwd=origin).split()
    if len(tree) != files + 1:
        raise RuntimeError(f"{origin}: {len(tree)} files on main, {files + 1} wanted")
    return origin


@dataclass
class BeadTrail:
    """What the log says of one bead: its sessions, its merge requests, and the events met on the way."""

    sessions: list[str] = field(default_factory=list)
    mrs: list[str] = field(default_factory=list)
    closed: datetime | None = None
    seen: list[str] = field(default_factory=list)
    """The event types, in log order (for a message when it does not get through)."""
    problems: list[str] = field(default_factory=list)


class TownLog:
    """The events of the beads, their sessions and merge requests, read from GT_EVT in order (``EventReader``:
    nothing lost, however slow this process is); the times are the events' own."""

    def __init__(self) -> None:
        self.beads: dict[str, BeadTrail] = {}
        self.bead_of: dict[str, str] = {}
        """Session or merge request -> its bead."""
        self.requested: dict[str, datetime] = {}
        self.started: dict[str, datetime] = {}
        self.ended: set[str] = set()
        self.cleaned: set[str] = set()
        self.submitted: dict[str, datetime] = {}
        self.merged: dict[str, tuple[datetime, MergeRequestMerged]] = {}
        self.undecodable = 0
        self.changed = asyncio.Event()
        self.follower: asyncio.Task[None] | None = None
        """The task reading the log into this: its end (a failure) ends every wait."""

    def follow(self, reader: EventReader) -> None:
        self.follower = asyncio.create_task(reader.run())
        self.follower.add_done_callback(lambda _task: self.changed.set())

    async def stop(self) -> None:
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.follower

    def trail(self, bead: str) -> BeadTrail:
        return self.beads.setdefault(bead, BeadTrail())

    def apply(self, _seq: int, _subject: str, data: bytes) -> None:
        try:
            self._apply(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.undecodable += 1  # not the benchmark's to judge: the services read the same log
        self.changed.set()

    def _apply(self, data: bytes) -> None:
        env = decode_envelope(data)
        kind, ts = env.type, env.ts

        def payload(cls: type[E]) -> E:
            return msgspec.json.decode(env.data, type=cls)

        if kind == SessionRequested.TYPE:
            requested = payload(SessionRequested)
            self.bead_of[requested.session_id] = requested.bead
            self.trail(requested.bead).sessions.append(requested.session_id)
            self.requested[requested.session_id] = ts
        elif kind == MergeRequestSubmitted.TYPE:
            submitted = payload(MergeRequestSubmitted)
            self.bead_of[submitted.mr_id] = submitted.bead
            self.trail(submitted.bead).mrs.append(submitted.mr_id)
            self.submitted.setdefault(submitted.mr_id, ts)
        elif kind == BeadClosed.TYPE:
            self.trail(payload(BeadClosed).bead_id).closed = ts
        aggregate = msgspec.json.decode(env.data, type=dict[str, Any])
        own = aggregate.get("session_id") or aggregate.get("mr_id") or aggregate.get("bead_id")
        bead = self.bead_of.get(str(own), str(own)) if own is not None else None
        if bead is None or bead not in self.beads:
            return
        trail = self.beads[bead]
        trail.seen.append(kind)
        if kind == SessionStarted.TYPE:
            self.started[payload(SessionStarted).session_id] = ts
        elif kind == SessionEnded.TYPE:
            self.ended.add(payload(SessionEnded).session_id)
        elif kind == SessionCleaned.TYPE:
            self.cleaned.add(payload(SessionCleaned).session_id)
        elif kind == MergeRequestMerged.TYPE:
            merged = payload(MergeRequestMerged)
            self.merged[merged.mr_id] = (ts, merged)
        elif kind in PROBLEMS:
            trail.problems.append(f"{kind} {msgspec.json.encode(aggregate).decode()[:600]}")

    def finished(self, bead: str) -> bool:
        """Closed, every session of it ended and cleaned up. Raises when it will not get there on its own."""
        trail = self.trail(bead)
        if trail.problems:
            raise RuntimeError(f"bead {bead} ran into trouble: {'; '.join(trail.problems)}")
        return (
            trail.closed is not None
            and bool(trail.sessions)
            and all(s in self.ended and s in self.cleaned for s in trail.sessions)
        )

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    if self.follower is not None and self.follower.done():
                        cause = None if self.follower.cancelled() else self.follower.exception()
                        raise RuntimeError(f"{what}: the log reader stopped") from cause
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise TimeoutError(f"{what}: not within {timeout:g}s") from None


@dataclass
class BeadTimes:
    bead: str
    merge_s: float
    """bead.closed - mr.submitted - the gate seconds of mr.merged."""
    gate_s: float
    session_s: list[float]
    """session.started - session.requested of each of its sessions."""


def times_of(log: TownLog, bead: str) -> BeadTimes:
    trail = log.trail(bead)
    merged = [mr for mr in trail.mrs if mr in log.merged]
    if trail.closed is None or not merged:
        raise RuntimeError(f"bead {bead}: closed {trail.closed}, merged {merged} (events: {trail.seen})")
    mr = merged[-1]
    _, event = log.merged[mr]
    merge_s = (trail.closed - log.submitted[mr]).total_seconds() - event.gate_seconds
    starts = [(log.started[s] - log.requested[s]).total_seconds() for s in trail.sessions if s in log.started]
    if not starts:
        raise RuntimeError(f"bead {bead}: no session started (events: {trail.seen})")
    return BeadTimes(bead=bead, merge_s=merge_s, gate_s=event.gate_seconds, session_s=starts)


@dataclass
class Rig:
    name: str
    files: int
    origin: Path
    measured: list[BeadTimes] = field(default_factory=list)
    first: list[BeadTimes] = field(default_factory=list)

    def merges(self) -> list[float]:
        return [t.merge_s for t in self.measured]

    def starts(self) -> list[float]:
        return [s for t in self.measured for s in t.session_s]


async def work_one(nc: Connection, log: TownLog, rig: Rig, n: int, timeout: float) -> BeadTimes:
    """One bead slung to ``rig`` and worked by the reference agent to merged, closed and cleaned up; its times."""
    bead = (await command(nc, BeadCreate(title=f"{rig.name} change {n}", prefix=rig.name))).id
    log.trail(bead)  # known before its first event can arrive
    began = time.monotonic()
    await command(nc, BeadSling(id=bead, rig=rig.name))
    what = f"bead {bead} on {rig.name} closed and its sessions cleaned up"
    try:
        await log.wait_for(lambda: log.finished(bead), timeout, what)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; its events so far: {', '.join(log.trail(bead).seen)}") from None
    times = times_of(log, bead)
    starts = ", ".join(f"{s:.2f}" for s in times.session_s)
    print(
        f"  {rig.name} ({rig.files:,} files) {bead}: merge overhead {times.merge_s:.3f}s (gate {times.gate_s:.3f}s), "
        f"session start {starts}s; {time.monotonic() - began:.1f}s sling to cleaned",
        flush=True,
    )
    return times


def stop_all(procs: dict[str, subprocess.Popen[bytes]], socket: str) -> None:
    """Every service stopped and the tmux server (its agents with it) gone, each tried whatever the others did;
    the first failure raised after."""
    errors: list[BaseException] = []
    for proc in procs.values():
        try:
            stop_service(proc)
        except Exception as exc:  # the rest are still stopped; raised below
            errors.append(exc)
    try:
        Tmux(socket).kill_server()
    except Exception as exc:
        errors.append(exc)
    if errors:
        raise errors[0]


async def measure(large: int, beads: int, where: Path, timeout: float = BEAD_TIMEOUT_S) -> tuple[Rig, Rig]:
    """The town, its two rigs, ``WARMUP`` + ``beads`` beads a rig; the rigs with their times."""
    socket = f"gt-bench-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="gt-bench-reposize-", dir=disk_root(where)) as tmp, server() as srv:
        root = Path(tmp)
        began = time.monotonic()
        small = Rig("small", SMALL_FILES, await asyncio.to_thread(make_monorepo, root, "small", SMALL_FILES))
        big = Rig("large", large, await asyncio.to_thread(make_monorepo, root, "large", large))
        print(f"  origins of {SMALL_FILES:,} and {large:,} files made in {time.monotonic() - began:.1f}s", flush=True)
        (root / "tmp").mkdir()
        env = {"GT_HOME": str(root / "home"), "GT_TMUX_SOCKET": socket, "TMPDIR": str(root / "tmp")}
        nc, town = await provisioned(srv.url)
        log = TownLog()
        log.follow(EventReader(nc, town.evt_stream, log.apply))
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for name in SERVICES:
                procs[name] = start_service(name, srv.url, env=env)
            for name in SERVICES:
                await wait_ready(nc, name, timeout=120)
            for rig in (small, big):
                await command(nc, RigAdd(name=rig.name, repo=str(rig.origin), agent_command=AGENT, test_command=GATE))
            for n in range(WARMUP + beads):
                for rig in (small, big):
                    times = await work_one(nc, log, rig, n, timeout)
                    (rig.measured if n >= WARMUP else rig.first).append(times)
            if log.undecodable:
                raise RuntimeError(f"{log.undecodable} events in the log could not be decoded")
        finally:
            await log.stop()
            try:
                await asyncio.to_thread(stop_all, procs, socket)
            finally:
                await nc.close()
    return small, big


def p50(values: list[float]) -> float:
    return percentile(values, 50)


STATS: tuple[tuple[str, Callable[[list[float]], float]], ...] = (("p50", p50), ("max", max))


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1000:.0f}" for v in values) + " ms"


class Measure(NamedTuple):
    """One of the two things measured per rig: how its figures are named and noted."""

    name: str
    """What the figure is, as its name starts."""
    per: str
    """What one value is of (``beads``, ``sessions``), in the name and the per-value note."""
    target: str
    """The acceptance target, on the p50 figure."""
    how: str
    """How one value is taken from the log."""
    values: Callable[[Rig], list[float]]
    first: Callable[[BeadTimes], list[float]]
    """The values of a rig's first, unmeasured bead."""


MEASURES = (
    Measure(
        name="merge overhead less the gates",
        per="beads",
        target="< 500 ms and <= 1.5x the 100-file figure (ratio >= 0.67)",
        how="bead.closed - mr.submitted - gate seconds of mr.merged (gate `true`)",
        values=lambda rig: rig.merges(),
        first=lambda t: [t.merge_s],
    ),
    Measure(
        name="session start",
        per="sessions",
        target="<= 2x the 100-file figure (ratio >= 0.5)",
        how="session.started - session.requested: workspace, hook lease, tmux pane, agent process",
        values=lambda rig: rig.starts(),
        first=lambda t: t.session_s,
    ),
)


def figures_of(small: Rig, big: Rig) -> list[Figure]:
    size = f"{big.files:,}-file repository"
    versus = f"the {small.files:,}-file repository, same town and run"
    label = f"{big.files // 1000:,}k/{small.files:,}" if big.files % 1000 == 0 else f"{big.files:,}/{small.files:,}"
    out: list[Figure] = []
    for measure in MEASURES:
        firsts = "; ".join(
            f"{rig.files:,} files: {_ms([v for t in rig.first for v in measure.first(t)])}" for rig in (small, big)
        )
        big_values, small_values = measure.values(big), measure.values(small)
        for stat, pick in STATS:
            value, ceiling = pick(big_values), pick(small_values)
            out.append(
                Figure(
                    name=f"(u) {measure.name}, {size}, {stat} over {len(big_values)} {measure.per}",
                    value=value * 1000,
                    unit="ms",
                    ceiling=ceiling * 1000,
                    ceiling_name=f"{versus}, {stat}",
                    target=measure.target if stat == "p50" else "",
                    higher_is_better=False,
                    notes=[
                        f"{label} = {value / ceiling:.2f}",
                        measure.how,
                        f"per {measure.per[:-1]}: {big.files:,} files {_ms(big_values)}; "
                        f"{small.files:,} files {_ms(small_values)}",
                        *(
                            [f"first bead of each rig, not measured (it makes the rig's clones): {firsts}"]
                            if stat == "max"
                            else []
                        ),
                    ],
                )
            )
    return out


async def run(
    files: int = 50_000, beads: int = 6, where: Path = DEFAULT_DIR, timeout: float = BEAD_TIMEOUT_S
) -> list[Figure]:
    small, big = await measure(files, beads, where, timeout)
    figures = figures_of(small, big)
    for figure in figures:
        print(figure.line(), flush=True)
        print(f"    {'; '.join(figure.notes)}", flush=True)
    return figures


async def _main(files: int, beads: int, where: Path, timeout: float) -> None:
    """``run``, stopped by SIGTERM as by Ctrl-C: cancelled, through its ``finally`` blocks (services, tmux, the
    temporary directory)."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        await run(files, beads, where, timeout)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reposize", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5,000 files and 2 beads a rig, for a smoke run")
    parser.add_argument("--files", type=int, help="files in the large rig's origin (default 50,000; 5,000 quick)")
    parser.add_argument("--beads", type=int, help="measured beads a rig (default 6; 2 quick)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the town goes: a disk, not a tmpfs")
    parser.add_argument(
        "--timeout", type=float, default=BEAD_TIMEOUT_S, help="seconds a bead may take, sling to cleaned up"
    )
    args = parser.parse_args()
    files = args.files or (5_000 if args.quick else 50_000)
    beads = args.beads or (2 if args.quick else 6)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    started = time.perf_counter()
    try:
        asyncio.run(_main(files, beads, args.dir, args.timeout))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(f"stopped after {time.perf_counter() - started:.1f}s; services, tmux and files cleaned up", flush=True)
        return 1
    print(f"{time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
