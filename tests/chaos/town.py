"""The town-wide chaos run: the whole town as real processes, agents that fail, services killed with SIGKILL.

``python -m tests.chaos.town`` (or ``./dev town-chaos``; ``--help`` lists the knobs) starts a nats-server of
its own, the four services as processes (started again after each kill, as ``gt up`` or a container's restart
policy would), a rig on a real git origin whose tests really run (a unittest suite over the files the agents
write) and files N beads in convoys. Each bead is worked in real tmux and git worktrees by ``gt-agent`` with
faults drawn per bead and attempt (``chaos_agent.py``): crashes at random steps, hangs, dirty worktrees,
failing tests. Meanwhile a random service is killed with SIGKILL every few seconds, and NATS is killed and
started again once. With ``--cluster`` NATS is three clustered nodes (streams with three replicas): the whole
cluster is killed and started again once, and later the node leading GT_EVT is killed alone and rejoins.

At the end it checks, from the log alone (``invariants.py``): every bead closed exactly once with its change on
``main``; no backward transition; no done step redone; no bead with two live sessions; every convoy closed
once; every command with one outcome; and, from the running town: each service's projection equals a fresh
replay, and no tmux session or agent process is left. It prints a report and exits 1 when anything failed,
naming the bead and the events involved.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
import psutil
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.deacon.projection import new_projection as deacon_projection
from services.mayor.projection import new_projection as mayor_projection
from services.refinery.projection import new_projection as refinery_projection
from services.runner.projection import new_projection as runner_projection
from services.witness.projection import new_projection as witness_projection
from shared.core import subjects
from shared.core.arguments import from_args
from shared.core.subjects import parse_js_reply
from shared.host import git
from shared.host.tmux import Tmux
from shared.model.events import decode_envelope
from shared.service.projection import Projection
from tests.chaos import chaos_agent
from tests.chaos.invariants import Logged, Violation, check_all
from tests.chaos.nats_nodes import NatsNodes
from tests.service_process import ServiceProcess

EVENT_STREAM = "GT_EVT"

SERVICES = ("mayor", "witness", "refinery", "deacon")
PROJECTIONS: dict[str, Callable[[], Projection[Any]]] = {
    "mayor": mayor_projection,
    "witness": witness_projection,
    "refinery": refinery_projection,
    "deacon": deacon_projection,
}
RIG = "chaos"
WORK_DIR = ".gastown-work"
GATE = "python3 -m unittest discover -q -s checks -t ."
AGENT_SCRIPT = Path(chaos_agent.__file__).resolve()
RIG_TESTS = '''"""The rig's own tests: the merge queue runs them on every merge, each agent before it submits."""

import pathlib
import re
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEP_FILE = re.compile(r"^step [a-z0-9-]+: .+\\n$")


class Work(unittest.TestCase):
    def test_nothing_marked_to_fail(self) -> None:
        self.assertFalse((ROOT / "FAIL_TESTS").exists(), "FAIL_TESTS is present")

    def test_every_step_file_is_well_formed(self) -> None:
        for path in sorted((ROOT / ".gastown-work").glob("*/*.txt")):
            self.assertRegex(path.read_text(), STEP_FILE, str(path))


if __name__ == "__main__":
    unittest.main()
'''


class ChaosSettings(msgspec.Struct, frozen=True, kw_only=True):
    beads: int = 60
    convoy_size: int = 10
    seed: int = 20261123
    rates: str = ",".join(f"{k}={v:g}" for k, v in chaos_agent.DEFAULT_RATES.items())
    kill_every: tuple[float, float] = (3.0, 6.0)
    """Seconds between two service kills, drawn uniformly."""
    restart_after: tuple[float, float] = (0.2, 1.5)
    """Seconds a killed service stays down."""
    nats_restart: bool = True
    cluster: bool = False
    """Three clustered NATS nodes instead of one server; one node (the GT_EVT leader) is killed mid-run."""
    node_down_s: float = 5.0
    """Seconds the killed node stays down."""
    max_polecats: int = 6
    mq_batch: int = 1
    """Merge requests the refinery stacks and gates together (``GT_MQ_BATCH``; 1: one at a time)."""
    runners: int = 0
    """Gate runners (``gt-runner``, ``GT_MQ_RUNNERS``), killed like the services; 0: the refinery gates itself."""
    stall_after: float = 12.0
    """The rig's stall threshold: a hung agent is warranted after this long without heartbeat or progress."""
    deadline_s: float = 1500.0
    """The whole run, beads filed to last check; the run fails when it is not done by then."""


class Report(msgspec.Struct, kw_only=True):
    settings: ChaosSettings
    workdir: str
    seconds: float = 0.0
    beads: int = 0
    beads_closed: int = 0
    convoys: int = 0
    commands: int = 0
    events: int = 0
    kills: Counter[str] = msgspec.field(default_factory=Counter)
    nats_restarts: int = 0
    node_kills: list[str] = []
    """The cluster nodes killed alone, each with the GT_EVT sequence it had to catch up to."""
    faults: Counter[str] = msgspec.field(default_factory=Counter)
    sessions: int = 0
    warrants: int = 0
    merges: int = 0
    gate_failures: int = 0
    escalations: int = 0
    violations: list[str] = []
    problems: list[str] = []
    """Failures outside the log invariants: a projection that differs, an orphan, the deadline."""

    @property
    def ok(self) -> bool:
        return not self.violations and not self.problems

    def render(self) -> str:
        s = self.settings
        lines = [
            "town chaos run: " + ("PASSED" if self.ok else "FAILED"),
            f"  seed {s.seed}, {self.beads} beads in {self.convoys} convoys, rates {s.rates}, "
            f"max {s.max_polecats} polecats, merge batch {s.mq_batch}, "
            + ("NATS: three clustered nodes, " if s.cluster else "NATS: one server, ")
            + f"kill every {s.kill_every[0]:g}-{s.kill_every[1]:g} s",
            f"  {self.seconds:.0f} s, {self.events} events, {self.commands} commands sent by the run",
            f"  kills: {dict(sorted(self.kills.items())) or 'none'}; NATS restarts: {self.nats_restarts}"
            + (f"; node kills: {', '.join(self.node_kills)}" if s.cluster else ""),
            f"  agent faults drawn: {dict(sorted(self.faults.items())) or 'none'}",
            f"  sessions {self.sessions}, warrants {self.warrants}, merges {self.merges}, "
            f"gate failures {self.gate_failures}, escalations {self.escalations}",
            f"  beads closed: {self.beads_closed} of {self.beads}",
            f"  workdir: {self.workdir}",
        ]
        checks = [
            "every bead closed exactly once, its change on main",
            "no backward transition; no done step redone; no step command overtaken; no bead with two live sessions",
            "every convoy closed exactly once; every command with exactly one outcome",
            "each service's projection equals a fresh replay; no orphan tmux session or process",
        ]
        if s.cluster:
            checks.append("the killed node rejoined and holds every event of the log")
        if self.ok:
            lines += [f"  ok  {c}" for c in checks]
        else:
            lines += [f"  FAIL {v}" for v in self.violations[:50]]
            if len(self.violations) > 50:
                lines.append(f"  ... and {len(self.violations) - 50} more")
            lines += [f"  FAIL {p}" for p in self.problems]
        return "\n".join(lines)


# ---- the parts ------------------------------------------------------------------------------------


def make_rig_origin(root: Path) -> Path:
    """A bare repository whose main holds the rig's tests."""
    src = root / "origin-src"
    (src / "checks").mkdir(parents=True)
    git.git("init", "--quiet", "-b", "main", str(src))
    (src / "README.md").write_text("the chaos rig: agents write .gastown-work/<bead>/ and the checks read it\n")
    (src / ".gitignore").write_text("__pycache__/\n")  # the tests' bytecode is nobody's change
    (src / "checks" / "__init__.py").write_text("")
    (src / "checks" / "test_work.py").write_text(RIG_TESTS)
    identity = ("-c", "user.name=Chaos", "-c", "user.email=chaos@gastown.invalid")
    git.git("add", ".", cwd=src)
    git.git(*identity, "commit", "--quiet", "-m", "the rig and its tests", cwd=src)
    origin = root / "origin.git"
    git.git("clone", "--quiet", "--bare", str(src), str(origin))
    return origin


def origin_files(origin: Path, branch: str = "main") -> set[str]:
    out = git.git("ls-tree", "-r", "--name-only", branch, cwd=origin)
    return set(out.splitlines())


class LogFollower:
    """The log as read so far, extended on each ``catch_up`` from where it stopped; survives NATS restarts."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.events: list[Logged] = []
        self.raw: dict[int, bytes] = {}
        """Each event's message data, for replaying it into fresh projections."""
        self.closed: set[str] = set()

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else 0

    async def catch_up(self) -> None:
        js = self.nc.jetstream()
        last = int((await js.stream_info(EVENT_STREAM)).state.last_seq)
        if last <= self.last_seq:
            return
        batch: list[Logged] = []
        raw: dict[int, bytes] = {}
        done = asyncio.Event()
        start = self.last_seq + 1

        async def on_msg(msg: Any) -> None:
            seq = parse_js_reply(msg.reply).stream_seq
            if seq >= start and seq <= last and (not batch or seq > batch[-1].seq):
                env = decode_envelope(msg.data)
                data = msgspec.json.decode(bytes(env.data))
                batch.append(Logged(seq=seq, type=env.type, subject=msg.subject, data=data))
                raw[seq] = msg.data
            if seq >= last:
                done.set()

        sub = await js.subscribe(
            "gt.evt.>",
            stream=EVENT_STREAM,
            cb=on_msg,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start),
        )
        try:
            await asyncio.wait_for(done.wait(), 60)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self.events.extend(batch)
        self.raw.update(raw)
        self.closed.update(str(e.data["bead_id"]) for e in batch if e.type == "bead.closed")


class Town:
    """The running parts of one chaos run."""

    def __init__(self, settings: ChaosSettings, workdir: Path) -> None:
        self.settings = settings
        self.workdir = workdir
        self.rng = random.Random(settings.seed)
        self.nats = NatsNodes(workdir, cluster=settings.cluster)
        self.socket = f"gt-chaos-{uuid.uuid4().hex[:10]}"
        self.tmux = Tmux(self.socket)
        self.home = workdir / "home"
        self.services: dict[str, ServiceProcess] = {}
        self.report = Report(settings=settings, workdir=str(workdir))
        self.sent: list[str] = []
        self.nc: Client | None = None

    def env(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "GT_"))}
        return {
            **base,
            "PATH": f"{bin_dir}:{base.get('PATH', '/usr/bin:/bin')}",
            "NATS_URL": self.nats.url,
            "GT_REPLICAS": str(self.nats.replicas),
            "GT_HOME": str(self.home),
            "GT_TMUX_SOCKET": self.socket,
            "GT_KILL_GRACE": "1",
            "GT_WATCHED_SERVICES": ",".join(SERVICES),
            "GT_MQ_BATCH": str(self.settings.mq_batch),
            "GT_MQ_RUNNERS": str(self.settings.runners),
            # A killed runner's job is taken by another within seconds, not the default 30.
            "GT_RUNNER_HEARTBEAT": "1",
            "GT_RUNNER_STALE": "5",
            "GT_AGENT_CHAOS_SEED": str(self.settings.seed),
            "GT_AGENT_CHAOS_RATES": self.settings.rates,
            "GT_AGENT_CHAOS_AGENT": str(Path(bin_dir) / "gt-agent"),
        }

    def start_services(self) -> None:
        env = self.env()
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for name in SERVICES:
            self.services[name] = ServiceProcess(name, env, logs / f"{name}.log").start()
        for n in range(1, self.settings.runners + 1):
            own = {**env, "GT_RUNNER_NAME": str(n)}
            self.services[f"runner-{n}"] = ServiceProcess("runner", own, logs / f"runner-{n}.log").start()

    def stop_all(self) -> None:
        for proc in self.services.values():
            proc.stop()
        with contextlib.suppress(Exception):
            self.tmux.kill_server()
        self.nats.stop()

    # ---- commands, as the nats CLI would send them ----------------------------------------------

    async def command(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store a command in GT_CMD (resent until stored, the same id) and wait for its outcome in the log."""
        assert self.nc is not None
        js = self.nc.jetstream()
        cmd_id = f"chaos-{uuid.uuid4().hex[:12]}"
        data = json.dumps({**body, "cmd_id": cmd_id, "actor": "chaos"}).encode()
        self.sent.append(cmd_id)
        while True:
            try:
                await js.publish(subject, data, stream="GT_CMD", headers={"Nats-Msg-Id": cmd_id}, timeout=5)
                break
            except (nats.errors.Error, TimeoutError):
                await asyncio.sleep(0.5)
        while True:
            try:
                msg = await js.get_last_msg(EVENT_STREAM, f"gt.evt.cmd.{cmd_id}")
            except nats.js.errors.NotFoundError:
                await asyncio.sleep(0.25)
                continue
            except (nats.errors.Error, TimeoutError):
                await asyncio.sleep(0.5)
                continue
            env = decode_envelope(msg.data or b"")
            outcome: dict[str, Any] = {"type": env.type, **msgspec.json.decode(bytes(env.data))}
            return outcome

    async def accepted(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        outcome = await self.command(subject, body)
        if outcome["type"] != "cmd.accepted":
            raise RuntimeError(f"{subject} {body} was rejected: {outcome.get('code')}: {outcome.get('message')}")
        result: dict[str, Any] = outcome.get("result", {})
        return result

    async def file_work(self, origin: Path) -> tuple[list[str], list[str]]:
        """The rig, then the beads in convoys, each slung: the bead ids and convoy ids."""
        s = self.settings
        await self.accepted(
            "gt.cmd.rig.add",
            {
                "name": RIG,
                "repo": str(origin),
                "test_command": GATE,
                "agent_command": f"{sys.executable} {AGENT_SCRIPT}",
                "max_polecats": s.max_polecats,
                "max_respawns": 2 * chaos_agent.FAULTY_ATTEMPTS + 6,
                "stall_after_s": s.stall_after,
            },
        )
        limit = asyncio.Semaphore(32)

        async def bounded(subject: str, body: dict[str, Any]) -> dict[str, Any]:
            async with limit:
                return await self.accepted(subject, body)

        beads: list[str] = []
        convoys: list[str] = []
        for start in range(0, s.beads, s.convoy_size):
            count = min(s.convoy_size, s.beads - start)
            created = await asyncio.gather(
                *(bounded("gt.cmd.bead.create", {"title": f"Chaos bead {start + i + 1}"}) for i in range(count))
            )
            ids = [str(r["id"]) for r in created]
            convoy = await bounded("gt.cmd.convoy.create", {"title": f"Chaos convoy {len(convoys) + 1}", "beads": ids})
            convoys.append(str(convoy["id"]))
            await asyncio.gather(*(bounded("gt.cmd.bead.sling", {"id": b, "rig": RIG, "no_convoy": True}) for b in ids))
            beads.extend(ids)
        return beads, convoys

    # ---- chaos ----------------------------------------------------------------------------------

    async def kill_services(self, stop: asyncio.Event) -> None:
        low, high = self.settings.kill_every
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(low, high))
            if stop.is_set():
                return
            name = self.rng.choice(sorted(self.services))
            self.services[name].kill()
            self.report.kills[name] += 1
            await asyncio.sleep(self.rng.uniform(*self.settings.restart_after))
            self.services[name].start()

    def restart_nats(self) -> None:
        """SIGKILL of every NATS node at once, started again a second later."""
        self.nats.kill_all_and_restart(down_s=1.0)
        self.report.nats_restarts += 1

    async def kill_a_node(self, min_seq: int) -> str:
        """SIGKILL of the node leading GT_EVT (the hard case: an election, and the most to catch up), started
        again after ``node_down_s``; returns its name."""
        assert self.nc is not None
        victim = "nats-1"
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            info = await self.nc.jetstream().stream_info(EVENT_STREAM)
            if info.cluster is not None and info.cluster.leader in self.nats.nodes:
                victim = str(info.cluster.leader)
        await asyncio.to_thread(self.nats.kill, victim)
        await asyncio.sleep(self.settings.node_down_s)
        await asyncio.to_thread(self.nats.start_node, victim)
        self.report.node_kills.append(f"{victim} (at seq {min_seq})")
        return victim

    async def node_caught_up(self, name: str, last_seq: int) -> bool:
        state = await asyncio.to_thread(self.nats.stream_state, name, EVENT_STREAM)
        return state is not None and int(state.get("last_seq", 0)) >= last_seq

    def restart_dead_services(self) -> None:
        for proc in self.services.values():
            if proc.returncode() is not None:
                proc.start()

    # ---- the end --------------------------------------------------------------------------------

    async def projection_problems(self, log: LogFollower) -> list[str]:
        assert self.nc is not None
        problems = []
        runners = {f"runner-{n}": runner_projection for n in range(1, self.settings.runners + 1)}
        for name, factory in {**PROJECTIONS, **runners}.items():
            answer = await self._digest(name, log.last_seq)
            if answer is None:
                problems.append(f"projection: {name} did not answer its digest")
                continue
            if answer["last_seq"] > log.last_seq:
                # The town wrote on after the run read the log (a restarted service's service.up, say): read
                # on, so the fresh replay covers what the service has applied.
                await log.catch_up()
            if answer["last_seq"] > log.last_seq:
                problems.append(f"projection: {name} is at seq {answer['last_seq']}, the log read has {log.last_seq}")
                continue
            replayed = factory()
            for event in log.events:
                if event.seq > answer["last_seq"]:
                    break
                replayed.apply(event.seq, event.subject, log.raw[event.seq])
            if hashlib.sha256(replayed.serialize_state()).hexdigest() != answer["sha256"]:
                problems.append(f"projection: {name} at seq {answer['last_seq']} differs from a fresh replay")
        return problems

    async def _digest(self, name: str, min_seq: int) -> dict[str, Any] | None:
        assert self.nc is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                # A runner's scope (runner-<n>) answers on runner.<n> (subjects.scope_tokens).
                subject = f"gt.q.{subjects.scope_tokens(name)}.digest"
                reply = await self.nc.request(subject, json.dumps({"min_seq": min_seq}).encode(), 10)
                answer = json.loads(reply.data)
                if answer.get("ok"):
                    result: dict[str, Any] = answer["result"]
                    return result
            except (nats.errors.Error, TimeoutError):
                pass
            await asyncio.sleep(0.5)
        return None


def orphans(town: Town) -> list[str]:
    """Tmux sessions still alive on the run's server, and processes still running in its worktrees."""
    found = []
    with contextlib.suppress(Exception):
        for name in town.tmux.snapshot():
            found.append(f"orphan tmux session {name}")
    home = str(town.home)
    service_pids = {p.pid for p in town.services.values() if p.returncode() is None}
    for proc in psutil.process_iter(["pid", "cwd", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid in service_pids or proc.pid == os.getpid():
                continue
            cwd = proc.info.get("cwd") or ""
            if cwd.startswith(home):
                found.append(f"orphan process {proc.pid} in {cwd}: {' '.join(proc.info.get('cmdline') or [])[:120]}")
    return found


async def _quiet(exc: Exception) -> None:
    """The run's own client reconnects through the NATS restart; its connection errors are expected."""


async def wait_until(predicate: Callable[[], Any], deadline: float, interval: float = 1.0) -> bool:
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            if await predicate():
                return True
        await asyncio.sleep(interval)
    return False


@contextlib.asynccontextmanager
async def running_town(settings: ChaosSettings, workdir: Path) -> AsyncIterator[Town]:
    town = Town(settings, workdir)
    await asyncio.to_thread(town.nats.start)
    try:
        town.start_services()
        town.nc = await nats.connect(
            servers=town.nats.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2, error_cb=_quiet
        )
        try:
            yield town
        finally:
            await town.nc.close()
    finally:
        town.stop_all()


async def run_chaos(settings: ChaosSettings, workdir: Path, progress: Callable[[str], None] = print) -> Report:
    """One chaos run in ``workdir``; the report says whether every invariant held."""
    started = time.monotonic()
    deadline = started + settings.deadline_s
    origin = make_rig_origin(workdir)
    async with running_town(settings, workdir) as town:
        report = town.report
        assert town.nc is not None
        log = LogFollower(town.nc)
        stop = asyncio.Event()
        killer = asyncio.create_task(town.kill_services(stop), name="kill-services")
        victim: str | None = None
        try:
            beads, convoys = await asyncio.wait_for(town.file_work(origin), settings.deadline_s)
            report.beads, report.convoys = len(beads), len(convoys)
            progress(f"filed {len(beads)} beads in {len(convoys)} convoys after {time.monotonic() - started:.0f}s")
            restart_nats_at = len(beads) // 3 if settings.nats_restart else None
            kill_node_at = 2 * len(beads) // 3 if settings.cluster else None
            last_said = -1

            async def all_closed() -> bool:
                nonlocal restart_nats_at, kill_node_at, last_said, victim
                await log.catch_up()
                closed = len(log.closed & set(beads))
                if restart_nats_at is not None and closed >= restart_nats_at:
                    restart_nats_at = None
                    progress(f"restarting NATS with {closed} beads closed")
                    await asyncio.to_thread(town.restart_nats)
                if kill_node_at is not None and closed >= kill_node_at:
                    kill_node_at = None
                    victim = await town.kill_a_node(log.last_seq)
                    progress(f"killed NATS node {victim} with {closed} beads closed, started it again")
                if closed // 10 != last_said // 10:
                    last_said = closed
                    progress(f"{closed}/{len(beads)} beads closed after {time.monotonic() - started:.0f}s")
                return closed == len(beads)

            finished = await wait_until(all_closed, deadline, interval=2.0)
        finally:
            stop.set()
            await killer
        town.restart_dead_services()
        if not finished:
            report.problems.append(f"deadline: not every bead closed within {settings.deadline_s:g}s")

        # Quiet: every convoy closed, every session ended and cleaned up, nothing left in tmux.
        async def quiet() -> bool:
            await log.catch_up()
            closed_convoys = {e.data["convoy_id"] for e in log.events if e.type == "convoy.closed"}
            requested = {e.data["session_id"] for e in log.events if e.type == "session.requested"}
            ended = {e.data["session_id"] for e in log.events if e.type == "session.ended"}
            return set(convoys) <= closed_convoys and requested <= ended and not orphans(town)

        if finished and not await wait_until(quiet, time.monotonic() + 120, interval=1.0):
            progress("the town did not quiet down within 120 s")
        await log.catch_up()
        # First the digests (they may read the log on, to what the services have applied), then the log checks
        # over all of it.
        report.problems += await town.projection_problems(log)
        report.events = len(log.events)
        report.commands = len(town.sent)
        report.beads_closed = len(log.closed & set(beads))
        report.violations = [str(v) for v in check_all(log.events, beads, convoys, town.sent)]
        report.violations += [str(v) for v in changes_on_main(origin, beads)]
        report.problems += orphans(town)
        if victim is not None:

            async def victim_caught_up() -> bool:
                assert victim is not None
                return await town.node_caught_up(victim, log.last_seq)

            if not await wait_until(victim_caught_up, time.monotonic() + 60, interval=1.0):
                state = town.nats.stream_state(victim, EVENT_STREAM) or {}
                report.problems.append(
                    f"cluster: node {victim} holds GT_EVT up to seq {state.get('last_seq')}, the log has {log.last_seq}"
                )
        _count_what_happened(report, log.events, beads, settings)
        report.seconds = time.monotonic() - started
    return report


def changes_on_main(origin: Path, beads: Sequence[str]) -> list[Violation]:
    """Every bead's files are on main, each added by exactly one commit (a change landed twice adds them twice)."""
    files = origin_files(origin)
    added = Counter(
        line
        for line in git.git("log", "main", "--format=", "--diff-filter=A", "--name-only", cwd=origin).splitlines()
        if line.startswith(f"{WORK_DIR}/")
    )
    out = []
    for bead in beads:
        mine = sorted(f for f in files if f.startswith(f"{WORK_DIR}/{bead}/"))
        if not mine:
            out.append(Violation(invariant="change not on main", subject=bead, detail=f"no {WORK_DIR}/{bead}/ on main"))
        twice = [f for f in mine if added[f] > 1]
        if twice:
            detail = f"added by {max(added[f] for f in twice)} commits: {twice}"
            out.append(Violation(invariant="change landed twice", subject=bead, detail=detail))
    return out


def _count_what_happened(report: Report, log: list[Logged], beads: Sequence[str], settings: ChaosSettings) -> None:
    rates = chaos_agent.parse_rates(settings.rates)
    attempts = Counter(str(e.data["bead"]) for e in log if e.type == "session.requested")
    for bead in beads:
        for attempt in range(1, min(attempts[bead], chaos_agent.FAULTY_ATTEMPTS) + 1):
            fault = chaos_agent.faults_for(settings.seed, bead, attempt, rates)
            if fault:
                report.faults[fault.split("=")[0].split("@")[0]] += 1
    kinds = Counter(e.type for e in log)
    report.sessions = kinds["session.requested"]
    report.warrants = kinds["session.warranted"]
    report.merges = sum(1 for e in log if e.type == "mr.merged" and not e.data.get("already"))
    report.gate_failures = kinds["mr.failed"]
    report.escalations = kinds["escalation.raised"]


# ---- the command line -----------------------------------------------------------------------------


def _pair(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    try:
        pair = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not seconds or a range like 3-6") from None
    if pair[0] < 0 or pair[1] < pair[0]:
        raise argparse.ArgumentTypeError(f"{text!r}: a range goes from low to high, both >= 0")
    return pair


def parse_args(argv: Sequence[str]) -> tuple[ChaosSettings, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.town", description=__doc__.split("\n\n")[0])
    default = ChaosSettings()
    parser.add_argument("--beads", type=int, default=1000, help="beads to file (default 1000; CI runs 60)")
    parser.add_argument("--convoy-size", type=int, default=default.convoy_size)
    parser.add_argument("--seed", type=int, default=default.seed)
    parser.add_argument("--rates", default=default.rates, help=f"agent fault rates (default {default.rates})")
    parser.add_argument("--kill-every", type=_pair, default=default.kill_every, help="seconds, like 3-6")
    parser.add_argument("--no-nats-restart", action="store_true")
    parser.add_argument(
        "--cluster", action="store_true", help="three clustered NATS nodes; kills the GT_EVT leader once mid-run"
    )
    parser.add_argument("--max-polecats", type=int, default=default.max_polecats)
    parser.add_argument("--stall-after", type=float, default=default.stall_after)
    parser.add_argument(
        "--mq-batch", type=int, default=4, help="merge requests gated together (default 4; the suite's run uses 1)"
    )
    parser.add_argument(
        "--runners", type=int, default=0, help="gate runners (GT_MQ_RUNNERS), killed like the services (default 0)"
    )
    parser.add_argument("--deadline", type=float, default=None, help="seconds for the whole run")
    parser.add_argument("--runs", type=int, default=1, help="run this many times in a row, seeds counting up")
    parser.add_argument("--workdir", type=Path, default=None, help="kept after the run (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    if min(args.beads, args.convoy_size, args.max_polecats, args.runs, args.mq_batch) < 1:
        parser.error("--beads, --convoy-size, --max-polecats, --mq-batch and --runs must be at least 1")
    try:
        chaos_agent.parse_rates(args.rates)
    except ValueError as exc:
        parser.error(str(exc))
    deadline = args.deadline if args.deadline is not None else max(600.0, 6.0 * args.beads)
    settings = from_args(ChaosSettings, args, nats_restart=not args.no_nats_restart, deadline_s=deadline)
    return settings, args


def main(argv: Sequence[str] | None = None) -> int:
    settings, args = parse_args(sys.argv[1:] if argv is None else argv)
    failed = 0
    for run in range(args.runs):
        run_settings = msgspec.structs.replace(settings, seed=settings.seed + run)
        root = args.workdir / f"run-{run + 1}" if args.workdir else Path(tempfile.mkdtemp(prefix="gt-chaos-"))
        root.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run_chaos(run_settings, root, progress=lambda line: print(line, flush=True)))
        print(msgspec.json.encode(report).decode() if args.json else report.render(), flush=True)
        if report.ok and args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
        failed += not report.ok
    if args.runs > 1:
        print(f"{args.runs - failed} of {args.runs} runs passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
