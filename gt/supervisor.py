"""``gt up`` and ``gt down``: an embedded NATS server plus the services, supervised as child processes.

The supervisor writes ``$GT_HOME/run/town.json``: its own identity, the NATS URL, each child's identity
(pid and start time), and whether the town is ready. ``gt down`` signals the supervisor, which stops the
services in reverse dependency order, then NATS. A service that dies is restarted with exponential
backoff; one that keeps dying (more than 5 restarts within 15 minutes) is left down and reported.

If a supervisor was killed outright, its children keep running; the next ``gt up`` finds them through
``town.json`` and stops them (after checking each is still the very process recorded) before it starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog

from gt.cli import client
from gt.cli.progress import Progress
from shared import git, processes, subjects
from shared import logging as gt_logging
from shared.aio import wait_event
from shared.bus import commands as bus_commands
from shared.bus import streams
from shared.bus.connection import connect
from shared.bus.errors import BusError
from shared.bus.query import ask
from shared.bus.topology import provision
from shared.commands import EscalationRaise, SessionStop
from shared.config import TownConfig
from shared.embedded import EmbeddedServer
from shared.errors import AppendFailedError, GastownError, PermissionDeniedError, QueryError
from shared.events import ServiceDown, decode_envelope
from shared.privacy import hide_environment, private_files
from shared.processes import ProcessRef
from shared.queries import Status, witness
from shared.tmux import Tmux, TmuxError

log = structlog.get_logger("gt.up")

START_ORDER = ("mayor", "witness", "refinery", "deacon")
"""Dependency order: services start in this order."""
STOP_ORDER = ("refinery", "witness", "mayor", "deacon")
"""Merges and sessions stop first, the mayor after them (it answers their last commands), the deacon last
(it records the others stopping); then NATS."""
CRASH_LOOP_RESTARTS = 5
CRASH_LOOP_WINDOW_S = 15 * 60
MAX_BACKOFF_S = 30.0
READY_TIMEOUT_S = 120.0
DOWN_TIMEOUT_S = 90.0
DEFAULT_TMUX_SOCKET = "gastown"
"""As the witness's (services.witness.settings): the CLI does not import a service."""
POLECAT_TMUX_PREFIX = "gt-"
"""Polecat tmux sessions are named ``gt-<rig>-<polecat>`` (services.witness.plan.scope)."""


class TownState(msgspec.Struct, kw_only=True):
    """What ``run/town.json`` holds."""

    supervisor: ProcessRef
    nats_url: str
    nats: ProcessRef | None = None
    """The embedded nats-server, when the supervisor started one."""
    services: dict[str, ProcessRef | None] = {}
    gave_up: list[str] = []
    """Services left down after a crash loop."""
    ready: bool = False
    replay: dict[str, tuple[int, int]] = {}
    """While starting: per service, the last sequence it has applied and the log's last sequence when the
    services started (what ``gt up -d`` draws its progress bar from)."""


def state_path(config: TownConfig) -> Path:
    return config.gt_home / "run" / "town.json"


def read_state(config: TownConfig) -> TownState | None:
    """The recorded town, or None when there is none or the file is unreadable."""
    try:
        return msgspec.json.decode(state_path(config).read_bytes(), type=TownState)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def running_town(config: TownConfig) -> TownState | None:
    """The recorded town if its supervisor still runs."""
    state = read_state(config)
    if state is not None and processes.is_alive(state.supervisor):
        return state
    return None


def _write_state(config: TownConfig, state: TownState) -> None:
    path = state_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state), indent=2))
    tmp.replace(path)


class ChildService:
    """One service process under supervision."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ref: ProcessRef | None = None
        self.restarts: list[float] = []
        self.next_start = 0.0
        self.gave_up = False
        self.last_exit: int | None = None
        self.escalated = False

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.name}", "--log-json"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C at the terminal reaches the supervisor only; it stops us in order
            )
        self.ref = processes.ref_of(self.proc.pid)
        log.info("service_started", name=self.name, pid=self.proc.pid)

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("service_kill", name=self.name)
            proc.kill()
            proc.wait()
        log.info("service_stopped", name=self.name, exit_code=proc.returncode)

    def kill_if_hung(self, instance: str) -> bool:
        """The deacon saw this service's heartbeats stop while its process runs: kill it (verified to be the
        very process whose heartbeats those were), so ``check`` restarts it. True when killed."""
        pid = instance.split("-", 1)[0]
        if self.proc is None or self.ref is None or self.proc.poll() is not None or str(self.proc.pid) != pid:
            return False
        log.warning("service_hung", name=self.name, pid=self.proc.pid)
        # A hung process may ignore SIGTERM; SIGKILL goes only to the re-verified process (pid + start time).
        return processes.send_signal(self.ref, signal.SIGKILL)

    def check(self, now: float) -> bool:
        """Restart a dead child with backoff, give up on a crash loop; True when something changed."""
        if self.gave_up:
            return False
        if self.proc is not None and self.proc.poll() is None:
            return False
        changed = False
        if self.proc is not None:
            code = self.proc.returncode
            self.last_exit = code
            self.proc = None
            self.ref = None
            changed = True
            self.restarts = [t for t in self.restarts if now - t < CRASH_LOOP_WINDOW_S] + [now]
            if len(self.restarts) > CRASH_LOOP_RESTARTS:
                self.gave_up = True
                log.error("service_crash_loop", name=self.name, restarts=len(self.restarts), exit_code=code)
                return True
            delay = min(MAX_BACKOFF_S, 0.5 * 2 ** (len(self.restarts) - 1))
            self.next_start = now + delay
            log.warning("service_died", name=self.name, exit_code=code, restart_in_s=delay)
        if now >= self.next_start:
            self.start()
            changed = True
        return changed


class Supervisor:
    """Runs the town in the foreground until SIGTERM/SIGINT."""

    def __init__(self, config: TownConfig, services: list[str], port: int, *, embedded: bool) -> None:
        self.config = config
        self.services_wanted = services
        self.port = port
        self.embedded = embedded
        self.home = config.gt_home
        self.server: EmbeddedServer | None = None
        self.children: list[ChildService] = []
        self.nats_url = config.nats_url
        self.ready = False
        self.replay: dict[str, tuple[int, int]] = {}
        self._stop = asyncio.Event()
        self._me = processes.ref_of(os.getpid())

    def write_state(self) -> None:
        assert self._me is not None
        server_ref = None
        if self.server is not None and self.server.proc is not None:
            server_ref = processes.ref_of(self.server.proc.pid)
        _write_state(
            self.config,
            TownState(
                supervisor=self._me,
                nats_url=self.nats_url,
                nats=server_ref,
                services={c.name: c.ref for c in self.children},
                gave_up=[c.name for c in self.children if c.gave_up],
                ready=self.ready,
                replay=self.replay,
            ),
        )

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            if self.embedded:
                self.server = EmbeddedServer(self.home / "nats", port=self.port, log_file=logs / "nats-server.log")
                await asyncio.to_thread(self.server.start)
                self.nats_url = self.server.url
                log.info("nats_started", url=self.nats_url, store=str(self.server.store_dir))
            config = msgspec.structs.replace(self.config, nats_url=self.nats_url)
            self.write_state()
            nc = await connect(config, name="gt-up", connect_attempts=50)
            try:
                await provision(nc, config)
                env = {**os.environ, "NATS_URL": self.nats_url, "GT_HOME": str(self.home)}
                for name in START_ORDER:
                    if name in self.services_wanted:
                        child = ChildService(name, env, logs)
                        child.start()
                        self.children.append(child)
                self.write_state()
                await self._wait_ready(nc)
                if self._stop.is_set():
                    return 0
                self.ready = True
                self.write_state()
                log.info("town_ready", nats_url=self.nats_url, services=[c.name for c in self.children])
                async with streams.live(nc, subjects.event_subject("service", "*"), self._on_service_event):
                    await self._supervise(nc)
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(self.shutdown)
        return 0

    async def _supervise(self, nc: Any) -> None:
        while not self._stop.is_set():
            await wait_event(self._stop, 0.5)
            now = time.monotonic()
            changed = [child.check(now) for child in self.children]  # every child, no short-circuit
            if any(changed):
                self.write_state()
            for child in self.children:
                if child.gave_up and not child.escalated:
                    child.escalated = await self._escalate_crash_loop(nc, child)

    async def _on_service_event(self, data: bytes) -> None:
        try:
            env = decode_envelope(data)
            if env.type != "service.down":
                return
            down = msgspec.json.decode(env.data, type=ServiceDown)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("service_event_unreadable", error=str(exc))
            return
        for child in self.children:
            if child.name == down.service and down.instance:
                child.kill_if_hung(down.instance)

    async def _escalate_crash_loop(self, nc: Any, child: ChildService) -> bool:
        """Tell a person (the mayor stores the escalation; the command waits in GT_CMD if the mayor is down)."""
        assert self._me is not None
        message = (
            f"service {child.name} crashed {len(child.restarts)} times within {CRASH_LOOP_WINDOW_S // 60} minutes "
            f"(last exit code {child.last_exit}); `gt up` stopped restarting it. See {child.log_path}, fix the cause, "
            "then restart the town."
        )
        cmd = EscalationRaise(
            severity="critical",
            message=message,
            source=f"supervisor/{child.name}",
            cmd_id=f"crash-loop-{child.name}-{self._me.pid}-{int(self._me.started)}",
            actor="supervisor",
        )
        try:
            # One attempt: the supervise loop tries again on its next round.
            await bus_commands.store(nc, self.config.cmd_stream, cmd, deadline_s=0)
        except PermissionDeniedError as exc:
            # Trying again cannot help: the supervisor's NATS user may not send it (logged as it happened).
            log.error("crash_loop_escalation_denied", name=child.name, user=exc.user)
            return True
        except (BusError, TimeoutError, AppendFailedError) as exc:
            log.warning("crash_loop_escalation_failed", name=child.name, error=repr(exc))
            return False
        log.error("service_quarantined", name=child.name, restarts=len(child.restarts))
        return True

    async def _wait_ready(self, nc: Any) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = {c.name for c in self.children}
        target = await streams.last_seq(nc, self.config.evt_stream)
        self.replay = dict.fromkeys(sorted(pending), (0, target))
        while pending and time.monotonic() < deadline and not self._stop.is_set():
            for name in sorted(pending):
                with contextlib.suppress(QueryError):
                    status = await ask(nc, Status(service=name), timeout=1)
                    applied = status.last_seq
                    self.replay[name] = (applied, max(target, applied))
                    if status.caught_up:
                        pending.discard(name)
            self.write_state()
            for child in self.children:
                child.check(time.monotonic())
                if child.gave_up:
                    pending.discard(child.name)  # quarantined: the town runs without it (and says so)
            if pending:
                await wait_event(self._stop, 0.2)
        if pending:
            log.warning("services_not_ready", services=sorted(pending))

    def shutdown(self) -> None:
        for child in sorted(self.children, key=lambda c: STOP_ORDER.index(c.name)):
            child.stop()
        if self.server is not None:
            self.server.stop()
            log.info("nats_stopped")
        with contextlib.suppress(OSError):
            state_path(self.config).unlink()


def reap_leftovers(config: TownConfig) -> list[str]:
    """Stop what a killed supervisor left running (each only if it is still the recorded process)."""
    state = read_state(config)
    if state is None or processes.is_alive(state.supervisor):
        return []
    reaped = []
    refs = [(name, ref) for name, ref in reversed(state.services.items()) if ref is not None]
    if state.nats is not None:
        refs.append(("nats-server", state.nats))
    for name, ref in refs:
        if processes.is_alive(ref):
            processes.stop(ref)
            reaped.append(name)
    with contextlib.suppress(OSError):
        state_path(config).unlink()
    return reaped


def up(args: argparse.Namespace, config: TownConfig, *, embedded: bool) -> int:
    """``gt up``: run the town (in the foreground, or detached with ``-d``)."""
    private_files()  # inherited by the supervisor, the services and nats-server (`gt` checked GT_UMASK already)
    hide_environment()  # the supervisor's environment is the services' (passwords included)
    existing = running_town(config)
    if existing is not None:
        print(f"town already up (supervisor pid {existing.supervisor.pid}, NATS {existing.nats_url})")
        return 0
    services = [s.strip() for s in args.services.split(",") if s.strip()]
    unknown = sorted(set(services) - set(START_ORDER))
    if unknown:
        print(f"gt: unknown services {unknown}; choose from {', '.join(START_ORDER)}", file=sys.stderr)
        return 2
    reaped = reap_leftovers(config)
    if reaped:
        print(f"stopped leftovers of a town whose supervisor died: {', '.join(reaped)}", file=sys.stderr)
    if args.detach:
        return _detach(args, config, embedded=embedded)
    gt_logging.configure("gt-up")
    try:
        return asyncio.run(Supervisor(config, services, args.port, embedded=embedded).run())
    except GastownError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return 3


def _detach(args: argparse.Namespace, config: TownConfig, *, embedded: bool) -> int:
    logs = config.gt_home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "gt.cli.main", "up", "--port", str(args.port), "--services", args.services]
    env = dict(os.environ)
    if embedded:
        env.pop("NATS_URL", None)
    else:
        env["NATS_URL"] = config.nats_url
    env["GT_HOME"] = str(config.gt_home)
    with (logs / "town.log").open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    bar = Progress("replaying the log", 0)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"gt: the town failed to start (exit {proc.returncode}); see {logs / 'town.log'}", file=sys.stderr)
            return 3
        state = read_state(config)
        if state is not None and state.replay and state.supervisor.pid == proc.pid:
            bar.update(sum(a for a, _ in state.replay.values()), sum(t for _, t in state.replay.values()))
        if state is not None and state.ready and state.supervisor.pid == proc.pid:
            if state.replay:
                bar.update(sum(t for _, t in state.replay.values()))
                bar.finish()
            names = ", ".join(s for s in state.services if s not in state.gave_up)
            print(f"town up: NATS {state.nats_url}, services {names} (GT_HOME {config.gt_home}, logs in {logs})")
            if state.gave_up:
                quarantined = ", ".join(state.gave_up)
                print(
                    f"gt: {quarantined} kept crashing on start and is left down (escalated); see {logs}",
                    file=sys.stderr,
                )
            return 0
        time.sleep(0.1)
    print(f"gt: the town did not become ready within {READY_TIMEOUT_S:g}s; see {logs}", file=sys.stderr)
    return 3


def down(config: TownConfig, *, clean: bool = False, sessions: bool = False) -> int:
    """``gt down``: ask the supervisor to stop the town and wait until it has; ``sessions`` first has the
    witness stop every polecat session (recorded, and respawned by the next ``gt up``), else the sessions
    still running are counted; ``clean`` then removes the polecat worktrees that hold nothing unsaved."""
    state = running_town(config)
    if state is None:
        reaped = reap_leftovers(config)
        print("no town is running" + (f" (stopped leftovers: {', '.join(reaped)})" if reaped else ""))
    else:
        if sessions:
            town = msgspec.structs.replace(config, nats_url=state.nats_url)
            try:
                stopped = asyncio.run(stop_sessions(town))
            except (GastownError, BusError, OSError, TimeoutError) as exc:
                print(
                    f"gt: could not stop the polecat sessions through the witness ({exc}); the town stays up",
                    file=sys.stderr,
                )
                return 1
            print(f"stopped {stopped} polecat session{'s' if stopped != 1 else ''}")
        if not processes.stop(state.supervisor, timeout=DOWN_TIMEOUT_S):
            print(f"gt: the supervisor (pid {state.supervisor.pid}) did not stop", file=sys.stderr)
            return 1
        print("town down")
    running = polecat_tmux_sessions()
    if running:
        print(
            f"{len(running)} polecat session{'s keep' if len(running) != 1 else ' keeps'} running in tmux "
            f"(`tmux -L {tmux_socket()} ls`); they go on working and report in when the town is up again. "
            "`gt down --sessions` stops them with the town."
        )
    if clean:
        return clean_worktrees(config)
    return 0


def tmux_socket() -> str:
    """The tmux server polecat sessions run on (the witness's ``GT_TMUX_SOCKET``)."""
    return os.environ.get("GT_TMUX_SOCKET") or DEFAULT_TMUX_SOCKET


def polecat_tmux_sessions() -> list[str]:
    """Names of the polecat tmux sessions running now (none when tmux is not there)."""
    try:
        panes = Tmux(tmux_socket()).snapshot()
    except (TmuxError, OSError):
        return []
    return sorted(name for name, pane in panes.items() if name.startswith(POLECAT_TMUX_PREFIX) and not pane.dead)


async def stop_sessions(config: TownConfig) -> int:
    """Have the witness stop every active polecat session (``gt.cmd.session.stop``: a warrant, a kill re-verified
    against the recorded process, ``session.ended`` with reason ``stopped``) and wait until each has ended;
    how many there were."""
    nc = await connect(config, name="gt-down", connect_attempts=2)
    try:
        active = await ask(nc, witness.Sessions(), timeout=10)
        ids = [s.id for s in active]
        for session_id in ids:
            cmd = SessionStop(session=session_id, cmd_id=f"stop-{session_id}-{secrets.token_hex(4)}")
            outcome = await client.send(nc, config, cmd, timeout=30)
            if outcome.type == "cmd.rejected":
                raise GastownError(f"session {session_id}: {outcome.data.get('message')}")
        deadline = time.monotonic() + DOWN_TIMEOUT_S
        while True:
            left = {s.id for s in await ask(nc, witness.Sessions(), timeout=10)} & set(ids)
            if not left:
                return len(ids)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"sessions still running after {DOWN_TIMEOUT_S:g}s: {', '.join(sorted(left))}")
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


def clean_worktrees(config: TownConfig) -> int:
    """Remove every polecat worktree that is clean and fully pushed; keep and list the rest. The town is down,
    so nothing is working in them."""
    rigs = config.gt_home / "rigs"
    removed, kept = 0, []
    for rig in sorted(rigs.iterdir()) if rigs.exists() else []:
        bare = rig / "repo.git"
        polecats = rig / "polecats"
        if not polecats.is_dir() or not bare.exists():
            continue
        for path in sorted(polecats.iterdir()):
            try:
                state = git.worktree_state(path, "main")
                if not state.exists:
                    continue
                busy = processes.working_in(path)
                if busy:
                    users = ", ".join(f"{name} (pid {pid})" for pid, name in busy)
                    kept.append(f"worktree {path} is in use by {users}; it is kept")
                    continue
                git.remove_worktree(bare, path, "main")
                removed += 1
            except git.WorktreeNotEmptyError as exc:
                kept.append(str(exc))
            except git.GitError as exc:
                kept.append(f"worktree {path} could not be removed ({exc}); it is kept")
    print(f"removed {removed} clean worktree(s)")
    for line in kept:
        print(f"gt: {line}", file=sys.stderr)
    return 0
