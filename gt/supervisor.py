"""``gt up`` and ``gt down``: an embedded NATS server plus the services, supervised as child processes.

The supervisor writes ``$GT_HOME/run/town.json``: its own identity, the NATS URL, each child's identity
(pid and start time), and whether the town is ready. ``gt down`` signals the supervisor, which stops the
services in reverse dependency order, then NATS. A service that dies is restarted with exponential
backoff; one that keeps dying (more than 5 restarts within 15 minutes) is left down and escalated. The
embedded nats-server is supervised the same way: restarted on its port with its store, and left down (and
escalated once a NATS answers again) when it keeps dying.

A crash loop's escalation is written to ``$GT_HOME/run/escalations/`` first and sent from there, so one raised
while NATS is unreachable (the embedded server's own crash loop) reaches the mayor once a town's NATS answers,
from this supervisor or the next ``gt up``'s.

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
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import structlog

from gt.cli import client
from gt.cli.progress import Progress
from gt.embedded_nats import EmbeddedServer, accounts_conf, adopt_unaccounted_store, free_port, read_since
from gt.town_secrets import TownSecrets, as_operator, as_user
from gt.town_secrets import ensure as ensure_town_secrets
from shared.bus import commands as bus_commands
from shared.bus import streams
from shared.bus.connection import close_quietly, connect
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.bus.query import ask
from shared.bus.topology import provision
from shared.core import logging as gt_logging
from shared.core import subjects
from shared.core.aio import wait_event
from shared.core.config import TownConfig, town_mark
from shared.core.errors import (
    EXIT_LOG_LOST,
    AppendFailedError,
    GastownError,
    NatsUnavailableError,
    PermissionDeniedError,
    QueryError,
)
from shared.host import git, processes
from shared.host.privacy import hide_environment, private_files
from shared.host.processes import ProcessRef
from shared.host.tmux import Tmux, TmuxError
from shared.model import heartbeats
from shared.model.commands import EscalationRaise, SessionStop
from shared.model.events import ServiceDown, decode_envelope
from shared.model.queries import Status, witness
from shared.model.runtimes import SESSION_TOWN_PATIENCE_S

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
NATS = "nats"
"""The embedded nats-server's name in ``town.json``'s ``gave_up`` and in crash-loop escalations."""
HUNG_CONFIRM_S = 2.0
"""A service recorded down whose process runs is killed as hung once it did not beat this long after we learnt."""
OUTAGE_GRACE_S = 10.0
"""Nor before this long after the supervisor's connection to NATS came back: every service was silent meanwhile."""
HEALTH_PATIENCE_S = 10.0
"""How long ``gt up -d`` on a running town waits for it to be healthy before it says what is wrong: a child
restarted a moment ago is back within a few seconds."""


class TownState(msgspec.Struct, kw_only=True):
    """What ``run/town.json`` holds."""

    supervisor: ProcessRef
    nats_url: str
    nats: ProcessRef | None = None
    """The embedded nats-server, when the supervisor started one and it runs."""
    embedded: bool = False
    """The supervisor runs an embedded nats-server (and restarts it when it dies)."""
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


class Restarts:
    """When a child that died may start again: exponential backoff (0.5 s doubling to ``MAX_BACKOFF_S``); more
    than ``CRASH_LOOP_RESTARTS`` deaths within ``CRASH_LOOP_WINDOW_S`` is a crash loop, and it is left down."""

    def __init__(self, generation: int = 0) -> None:
        self.deaths: list[float] = []
        self.next_start = 0.0
        self.gave_up = False
        self.last_exit: int | None = None
        self.escalated = False
        self.generation = generation
        """Times the child was started afresh by hand (``gt up --service``): a new crash loop is a new escalation."""

    def afresh(self) -> Restarts:
        """The count of a child started again by hand: no deaths, due at once."""
        return Restarts(self.generation + 1)

    def died(self, now: float, code: int | None) -> float | None:
        """Record a death at ``now``; the delay before the next start, or None when it is a crash loop."""
        self.last_exit = code
        self.deaths = [t for t in self.deaths if now - t < CRASH_LOOP_WINDOW_S] + [now]
        if len(self.deaths) > CRASH_LOOP_RESTARTS or code == EXIT_LOG_LOST:
            # (A service that found the town's log lost is not restarted: it would only refuse again.)
            self.gave_up = True
            return None
        delay: float = min(MAX_BACKOFF_S, 0.5 * 2.0 ** (len(self.deaths) - 1))
        self.next_start = now + delay
        return delay


class ChildService:
    """One service process under supervision."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ref: ProcessRef | None = None
        self.restarts = Restarts()

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
        if self.restarts.gave_up:
            return False
        if self.proc is not None and self.proc.poll() is None:
            return False
        changed = False
        if self.proc is not None:
            code = self.proc.returncode
            self.proc = None
            self.ref = None
            changed = True
            delay = self.restarts.died(now, code)
            if delay is None:
                log.error("service_crash_loop", name=self.name, restarts=len(self.restarts.deaths), exit_code=code)
                return True
            log.warning("service_died", name=self.name, exit_code=code, restart_in_s=delay)
        if now >= self.restarts.next_start:
            self.start()
            changed = True
        return changed


class SupervisedNats:
    """The embedded nats-server under supervision, like a service: one that dies is started again on the same
    port with the same store (clients reconnect to where they were; JetStream recovers its store), with the
    services' backoff, and left down after a crash loop."""

    name = NATS

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.log_path = server.log_file
        self.restarts = Restarts()

    @property
    def ref(self) -> ProcessRef | None:
        proc = self.server.proc
        return processes.ref_of(proc.pid) if proc is not None and proc.poll() is None else None

    async def check(self, now: float) -> bool:
        """Restart a dead server with backoff, give up on a crash loop; True when something changed."""
        if self.restarts.gave_up:
            return False
        proc = self.server.proc
        if proc is not None and proc.poll() is None:
            return False
        changed = False
        if proc is not None:
            self.server.proc = None
            changed = True
            if not self._died(now, proc.returncode, None):
                return True
        if now < self.restarts.next_start:
            return changed
        # Its monitoring port may have been taken while it was down; nothing but a person looks there.
        self.server.http_port = free_port()
        try:
            await asyncio.to_thread(self.server.start)
        except GastownError as exc:
            # It did not come up (its port taken, its store unreadable): a death like any other.
            code = self.server.proc.poll() if self.server.proc is not None else None
            await asyncio.to_thread(self.server.kill)
            self._died(time.monotonic(), code, str(exc))
            return True
        assert self.server.proc is not None
        log.info("nats_restarted", url=self.server.url, pid=self.server.proc.pid, restarts=len(self.restarts.deaths))
        return True

    def _died(self, now: float, code: int | None, error: str | None) -> bool:
        """Record a death; False when it was one too many (a crash loop: left down)."""
        delay = self.restarts.died(now, code)
        if delay is None:
            log.error(
                "nats_crash_loop",
                restarts=len(self.restarts.deaths),
                exit_code=code,
                error=error,
                log=str(self.log_path),
            )
            return False
        log.warning("nats_died", exit_code=code, error=error, restart_in_s=delay, log=str(self.log_path))
        return True


class Supervisor:
    """Runs the town in the foreground until SIGTERM/SIGINT."""

    def __init__(self, config: TownConfig, services: list[str], port: int, *, embedded: bool) -> None:
        self.config = config
        self.services_wanted = services
        self.port = port
        self.embedded = embedded
        self.home = config.gt_home
        self.server: EmbeddedServer | None = None
        self.nats: SupervisedNats | None = None
        self.children: list[ChildService] = []
        self.nats_url = config.nats_url
        self.ready = False
        self.replay: dict[str, tuple[int, int]] = {}
        self._stop = asyncio.Event()
        self._me = processes.ref_of(os.getpid())
        self._silent: dict[tuple[str, str], tuple[datetime, float]] = {}
        """Services the deacon recorded down, by (name, instance): when it recorded it, when we learnt it."""

    def write_state(self) -> None:
        assert self._me is not None
        gave_up = [c.name for c in self.children if c.restarts.gave_up]
        if self.nats is not None and self.nats.restarts.gave_up:
            gave_up.append(NATS)
        _write_state(
            self.config,
            TownState(
                supervisor=self._me,
                nats_url=self.nats_url,
                nats=self.nats.ref if self.nats is not None else None,
                embedded=self.nats is not None,
                services={c.name: c.ref for c in self.children},
                gave_up=gave_up,
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
            town_secrets: TownSecrets | None = None
            if self.embedded:
                # The same users and per-session identities as the compose stack (ops/nats/accounts.conf), with
                # credentials kept in GT_HOME/secrets: an agent is no NATS superuser on a laptop either.
                town_secrets = await asyncio.to_thread(ensure_town_secrets, self.home)
                store = self.home / "nats" / "jetstream"
                await asyncio.to_thread(adopt_unaccounted_store, store)
                self.server = EmbeddedServer(
                    self.home / "nats",
                    port=self.port,
                    log_file=logs / "nats-server.log",
                    include=accounts_conf(),
                    env=town_secrets.server_env(dict(os.environ)),
                )
                await asyncio.to_thread(self.server.start)
                self.nats = SupervisedNats(self.server)
                self.nats_url = self.server.url
                log.info("nats_started", url=self.nats_url, store=str(self.server.store_dir))
            config = msgspec.structs.replace(self.config, nats_url=self.nats_url)
            if town_secrets is not None:
                # Provisioning as the admin (once, before the services, which may do it too); then the operator.
                admin = await connect(as_user(config, "admin"), name="gt-up-provision", connect_attempts=50)
                try:
                    await provision(admin, config)
                finally:
                    await admin.close()
                config = as_user(config, "operator")
            self.write_state()
            nc = await connect(config, name="gt-up", connect_attempts=50)
            try:
                if town_secrets is None:
                    await provision(nc, config)
                await self._send_escalations(nc)  # owed by an earlier town (its NATS kept crashing)
                env = {**os.environ, "NATS_URL": self.nats_url, "GT_HOME": str(self.home)}
                for stale in restart_requests_dir(self.config).glob("*.request"):
                    stale.unlink(missing_ok=True)  # asked of an earlier supervisor: this one starts everything
                for name in START_ORDER:
                    if name in self.services_wanted:
                        own = town_secrets.service_env(env, name) if town_secrets is not None else env
                        child = ChildService(name, own, logs)
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

    async def _check_children(self) -> bool:
        """One round of supervision: NATS first (the services need it), then every service (no short-circuit);
        True when something changed."""
        changed = False
        if self.nats is not None:
            changed = await self.nats.check(time.monotonic())
        now = time.monotonic()
        checked = [child.check(now) for child in self.children]  # every child, no short-circuit
        changed = any(checked) or changed
        supervised: list[ChildService | SupervisedNats] = [*self.children]
        if self.nats is not None:
            supervised.append(self.nats)
        for child in supervised:
            if child.restarts.gave_up and not child.restarts.escalated:
                self._owe_escalation(child)
                child.restarts.escalated = True
        if changed:
            self.write_state()
        return changed

    async def _supervise(self, nc: Any) -> None:
        connected_since: float | None = time.monotonic()
        while not self._stop.is_set():
            await wait_event(self._stop, 0.5)
            await self._take_restart_requests()
            await self._check_children()
            if not nc.is_connected:
                connected_since = None
                continue
            if connected_since is None:
                connected_since = time.monotonic()
            await self._send_escalations(nc)
            await self._judge_silent(nc, connected_since)

    async def _take_restart_requests(self) -> None:
        """Carry out each ``gt up --service NAME`` asked for (a file in ``run/restart/``): a service is stopped if
        it runs and started afresh, its crash count cleared (one left down after a crash loop comes back); the
        embedded NATS server left down is started again."""
        folder = restart_requests_dir(self.config)
        for path in sorted(folder.glob("*.request")) if folder.is_dir() else []:
            name = path.stem
            child = next((c for c in self.children if c.name == name), None)
            if child is not None:
                await asyncio.to_thread(child.stop)
                child.restarts = child.restarts.afresh()
                child.start()
                log.info("service_restarted_by_hand", name=name, generation=child.restarts.generation)
            elif name == NATS and self.nats is not None and self.nats.restarts.gave_up:
                self.nats.restarts = self.nats.restarts.afresh()  # started by the next check, at once
                log.info("nats_restarted_by_hand", generation=self.nats.restarts.generation)
            else:
                log.warning("restart_request_ignored", name=name)
            self.write_state()
            path.unlink(missing_ok=True)  # taken: after the state that shows it (what `gt up --service` waits for)

    async def _on_service_event(self, data: bytes) -> None:
        try:
            env = decode_envelope(data)
            if env.type != "service.down":
                return
            down = msgspec.json.decode(env.data, type=ServiceDown)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("service_event_unreadable", error=str(exc))
            return
        if down.instance and any(child.name == down.service for child in self.children):
            self._silent[(down.service, down.instance)] = (env.ts, time.monotonic())

    async def _judge_silent(self, nc: Any, connected_since: float) -> None:
        """Kill each service the deacon recorded down whose process still runs (hung), unless it beat again after
        the deacon recorded it: a NATS outage (the embedded server restarting) silences every service at once,
        and they beat again once NATS is back. Judged ``HUNG_CONFIRM_S`` after the record, and no sooner than
        ``OUTAGE_GRACE_S`` after this supervisor's own connection came back."""
        now = time.monotonic()
        for key, (recorded_at, seen) in list(self._silent.items()):
            if now < max(seen + HUNG_CONFIRM_S, connected_since + OUTAGE_GRACE_S):
                continue
            name, instance = key
            try:
                entry = await Bucket(nc, self.config.service_bucket).get(heartbeats.key_of(name, instance))
                beat = heartbeats.decode(entry.value) if entry is not None else None
            except (BusError, TimeoutError) as exc:
                log.warning("service_heartbeat_unreadable", name=name, error=repr(exc))
                return  # asked again next round
            del self._silent[key]
            if beat is not None and beat.ts > recorded_at:
                log.info("service_beats_again", name=name, instance=instance)
                continue
            for child in self.children:
                if child.name == name:
                    child.kill_if_hung(instance)

    def _owe_escalation(self, child: ChildService | SupervisedNats) -> None:
        """Write the crash loop's escalation to ``run/escalations/``, from where ``_send_escalations`` sends it:
        kept on disk, it outlives a NATS that does not answer (the embedded server's own crash loop) and this
        supervisor."""
        assert self._me is not None
        what = "the embedded NATS server" if child.name == NATS else f"service {child.name}"
        after = (
            "Its clients (the services, gt) cannot reach the town meanwhile. " if child.name == NATS else ""
        ) + f"fix the cause, then `gt up --service {child.name}` starts it again."
        message = (
            f"{what} crashed {len(child.restarts.deaths)} times within {CRASH_LOOP_WINDOW_S // 60} minutes "
            f"(last exit code {child.restarts.last_exit}); `gt up` stopped restarting it. See {child.log_path}, "
            f"{after}"
        )
        if child.name != NATS and child.restarts.last_exit == EXIT_LOG_LOST:
            message = (
                f"{what} refused to start: the town's event log is lost (missing, or not the log this town had; "
                f"`event_log_lost` in {child.log_path} says which). It will not start an empty town over it: "
                "restore the log from a backup, or start the town over on purpose (docs/failure-behaviour.md, "
                '"The log lost").'
            )
        cmd = EscalationRaise(
            severity="critical",
            message=message,
            source=f"supervisor/{child.name}",
            cmd_id=f"crash-loop-{child.name}-{self._me.pid}-{int(self._me.started)}"
            + (f"-{child.restarts.generation}" if child.restarts.generation else ""),
            actor="supervisor",
        )
        folder = escalations_dir(self.config)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{cmd.cmd_id}.tmp"
        tmp.write_bytes(msgspec.json.encode(cmd))
        tmp.replace(folder / f"{cmd.cmd_id}.json")
        log.error("crash_loop_escalation_owed", name=child.name, cmd_id=cmd.cmd_id)

    async def _send_escalations(self, nc: Any) -> None:
        """Send each escalation owed (the mayor stores it; the command waits in GT_CMD if the mayor is down), once:
        its file goes when GT_CMD has it, and its fixed command id makes a resend harmless."""
        folder = escalations_dir(self.config)
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                cmd = msgspec.json.decode(path.read_bytes(), type=EscalationRaise)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("crash_loop_escalation_unreadable", path=str(path), error=repr(exc))
                path.rename(path.with_suffix(".unreadable"))  # kept for a person, never tried again
                continue
            try:
                # One attempt: the supervise loop tries again on its next round.
                await bus_commands.store(
                    nc, self.config.cmd_stream, cmd, evt_stream=self.config.evt_stream, deadline_s=0
                )
            except PermissionDeniedError as exc:
                # Trying again cannot help: the supervisor's NATS user may not send it (logged as it happened).
                log.error("crash_loop_escalation_denied", source=cmd.source, user=exc.user)
            except (BusError, TimeoutError, AppendFailedError) as exc:
                log.warning("crash_loop_escalation_failed", source=cmd.source, error=repr(exc))
                return
            else:
                log.error("service_quarantined", source=cmd.source, cmd_id=cmd.cmd_id)
            path.unlink(missing_ok=True)

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
            await self._check_children()
            for child in self.children:
                if child.restarts.gave_up:
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


def escalations_dir(config: TownConfig) -> Path:
    """Crash-loop escalations written and not yet stored in GT_CMD, one command per file."""
    return config.gt_home / "run" / "escalations"


def restart_requests_dir(config: TownConfig) -> Path:
    """``gt up --service NAME`` asks the running supervisor to restart NAME with a file ``NAME.request`` here."""
    return config.gt_home / "run" / "restart"


def restart_service(config: TownConfig, state: TownState, name: str) -> int:
    """``gt up --service NAME`` on a running town: have its supervisor restart NAME (started afresh when it was
    left down after a crash loop) and wait until it answers, caught up with the log."""
    logs = config.gt_home / "logs"
    if name == NATS:
        if NATS not in state.gave_up:
            print(
                "gt: the town's NATS server is not left down; `gt down` and `gt up -d` restart it with the town",
                file=sys.stderr,
            )
            return 2
    elif name not in state.services:
        print(f"gt: this town runs no {name} (it runs: {', '.join(state.services)})", file=sys.stderr)
        return 2
    before = state.services.get(name)
    folder = restart_requests_dir(config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.request").touch()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        now = running_town(config)
        if now is None or now.supervisor != state.supervisor:
            print(f"gt: the town's supervisor stopped; see {logs / 'town.log'}", file=sys.stderr)
            return 3
        if not (folder / f"{name}.request").exists() and name not in now.gave_up:
            if name == NATS:
                if now.nats is not None and not asyncio.run(town_problems(config, now)):
                    print(f"nats is up again (pid {now.nats.pid})")
                    return 0
            else:
                ref = now.services.get(name)
                if ref is not None and ref != before and asyncio.run(_caught_up(config, now, name)):
                    print(f"{name} is up again (pid {ref.pid}); its crash count starts over")
                    return 0
        elif name in now.gave_up and not (folder / f"{name}.request").exists():
            # Taken, and left down again: it crashed as often as before (the cause is still there).
            print(f"gt: {name} kept crashing and is left down again; see {logs / (name + '.log')}", file=sys.stderr)
            return 3
        time.sleep(0.2)
    print(f"gt: {name} did not come back within {READY_TIMEOUT_S:g}s; see {logs}", file=sys.stderr)
    return 3


async def _caught_up(config: TownConfig, state: TownState, name: str) -> bool:
    """Whether the town's ``name`` answers, connected and caught up with the log."""
    town = as_operator(msgspec.structs.replace(config, nats_url=state.nats_url))
    try:
        nc = await connect(town, name="gt-up-service", connect_attempts=1)
    except NatsUnavailableError:
        return False
    try:
        status = await ask(nc, Status(service=name), timeout=2)
    except QueryError:
        return False
    finally:
        await close_quietly(nc)
    return status.connected and status.caught_up


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
    service = getattr(args, "service", None)
    if service is not None:
        if existing is None:
            print(
                f"gt: no town is running in GT_HOME ({config.gt_home}) to restart {service} in; `gt up -d` starts "
                "the whole town",
                file=sys.stderr,
            )
            return 3
        return restart_service(config, existing, service)
    if existing is not None:
        return _already_up(config, existing)
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
        started_at = out.tell()
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    bar = Progress("replaying the log", 0)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            why = _said_by_supervisor(logs / "town.log", started_at)
            print(
                f"gt: the town failed to start (exit {proc.returncode})"
                + (f": {why}" if why else f"; see {logs / 'town.log'}"),
                file=sys.stderr,
            )
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


def _said_by_supervisor(town_log: Path, since: int) -> str | None:
    """The last error the supervisor printed (``gt: ...``) to ``town_log`` after byte ``since``: why a detached
    ``gt up`` failed (e.g. nats-server's own cause: the port taken)."""
    tail = read_since(town_log, since)
    if tail is None:
        return None
    said = [line.removeprefix("gt: ") for line in tail.splitlines() if line.startswith("gt: ")]
    return said[-1] if said else None


def _already_up(config: TownConfig, state: TownState) -> int:
    """``gt up`` on a town that runs: 0 when it is healthy; else what is wrong, exit 3 (as ``gt`` does for an
    unreachable town): a town whose NATS died and was not restarted is no town, whatever ``town.json`` says."""
    if not state.ready:
        started = _wait_ready_elsewhere(config, state)
        if started is None:
            print(f"gt: the town's supervisor stopped while it started; see {config.gt_home / 'logs'}", file=sys.stderr)
            return 3
        state = started
    where = f"supervisor pid {state.supervisor.pid}, NATS {state.nats_url}"
    problems = asyncio.run(town_problems(config, state))
    if not problems:
        print(f"town already up ({where})")
        return 0
    print(f"gt: the town is up ({where}) but not healthy:", file=sys.stderr)
    for problem in problems:
        print(f"gt:   {problem}", file=sys.stderr)
    return 3


def _wait_ready_elsewhere(config: TownConfig, state: TownState) -> TownState | None:
    """A town another ``gt up`` is starting: the state once it is ready (None when its supervisor stopped)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        now = running_town(config)
        if now is None or now.supervisor != state.supervisor:
            return None
        if now.ready:
            return now
        time.sleep(0.2)
    return state


async def town_problems(config: TownConfig, state: TownState) -> list[str]:
    """What keeps a running town from working: a child left down after a crash loop, NATS not answering, a
    service not answering; none when it is healthy. What may pass (a child being restarted) is given
    ``HEALTH_PATIENCE_S`` to pass."""
    deadline = time.monotonic() + HEALTH_PATIENCE_S
    while True:
        now = running_town(config) or state  # the supervisor records restarts as it makes them
        lasting, passing = await _problems_now(config, now)
        if not passing or time.monotonic() >= deadline:
            return lasting + passing
        await asyncio.sleep(0.5)


async def _problems_now(config: TownConfig, state: TownState) -> tuple[list[str], list[str]]:
    """(problems only a person can fix, problems the supervisor may fix by itself)."""
    logs = config.gt_home / "logs"
    lasting = []
    if NATS in state.gave_up:
        lasting.append(
            f"the embedded NATS server kept crashing and is left down (see {logs / 'nats-server.log'}); fix the "
            "cause, then `gt up --service nats` starts it again"
        )
    for name in state.gave_up:
        if name != NATS:
            lasting.append(
                f"{name} kept crashing and is left down (escalated); see {logs / (name + '.log')}; fix the cause, "
                f"then `gt up --service {name}` starts it again"
            )
    passing: list[str] = []
    town = as_operator(msgspec.structs.replace(config, nats_url=state.nats_url))
    try:
        nc = await connect(town, name="gt-up-check", connect_attempts=1)
    except NatsUnavailableError as exc:
        if NATS not in state.gave_up:
            restarting = (
                f"; `gt up` restarts its embedded server (see {logs / 'nats-server.log'} and {logs / 'town.log'})"
                if state.embedded
                else ""
            )
            passing.append(f"{exc}{restarting}")
        return lasting, passing
    try:
        for name in state.services:
            if name in state.gave_up:
                continue
            try:
                status = await ask(nc, Status(service=name), timeout=2)
            except QueryError as exc:
                passing.append(f"{name} does not answer ({exc.code}); see {logs / (name + '.log')}")
                continue
            if not status.connected:
                passing.append(f"{name} is not connected to NATS; see {logs / (name + '.log')}")
    finally:
        await close_quietly(nc)
    return lasting, passing


def supervisor_gone(config: TownConfig, state: TownState) -> str | None:
    """What to say of a recorded town whose supervisor died (``kill -9``): its NATS and services may run on, but
    nothing restarts one that dies; None while the supervisor runs."""
    if processes.is_alive(state.supervisor):
        return None
    return (
        f"the supervisor of the town in GT_HOME ({config.gt_home}) is gone (pid {state.supervisor.pid} died); "
        f"what it started may run on (NATS {state.nats_url}), but nothing restarts a service that dies. "
        "`gt up -d` takes the town over: it stops what is left and starts the town again"
    )


def unreachable_hint(config: TownConfig) -> str | None:
    """Why the NATS of the town ``gt up`` runs in GT_HOME does not answer (NATS_URL not given): no town runs
    there, or its supervisor knows why; None otherwise (also when its supervisor is gone: ``supervisor_gone``
    said so)."""
    recorded = read_state(config)
    if recorded is not None and not processes.is_alive(recorded.supervisor):
        return None
    state = running_town(config)
    if state is None:
        return (
            f"no town is running in GT_HOME ({config.gt_home}): `gt up -d` starts one there; for a town elsewhere "
            "set GT_HOME to its home, or NATS_URL to its NATS server"
        )
    logs = config.gt_home / "logs"
    if NATS in state.gave_up:
        return (
            f"`gt up`'s embedded NATS server kept crashing and is left down (see {logs / 'nats-server.log'}); fix "
            "the cause, then `gt up --service nats` starts it again"
        )
    if state.embedded and state.nats is None:
        return f"`gt up` is restarting its embedded NATS server (see {logs / 'town.log'})"
    return None


def down(config: TownConfig, *, clean: bool = False, sessions: bool = False) -> int:
    """``gt down``: ask the supervisor to stop the town and wait until it has; ``sessions`` first has the
    witness stop every polecat session (recorded, and respawned by the next ``gt up``), else the sessions
    still running are counted; ``clean`` then removes the polecat worktrees that hold nothing unsaved."""
    state = running_town(config)
    if state is None:
        reaped = reap_leftovers(config)
        print(
            f"the town's supervisor was gone; stopped what it left running: {', '.join(reaped)}"
            if reaped
            else "no town is running"
        )
    else:
        if sessions:
            town = as_operator(msgspec.structs.replace(config, nats_url=state.nats_url))
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
    running = polecat_tmux_sessions(config)
    if running:
        print(sessions_left_running(len(running)))
    if clean:
        return clean_worktrees(config)
    return 0


def sessions_left_running(count: int) -> str:
    """What ``gt down`` says of the polecat sessions it leaves running: what really becomes of them."""
    one = count == 1
    return (
        f"{count} polecat session{'' if one else 's'} {'keeps' if one else 'keep'} running in tmux "
        f"(`tmux -L {tmux_socket()} ls`) and {'goes' if one else 'go'} on working; {'its' if one else 'their'} "
        f"`gt` calls wait up to {SESSION_TOWN_PATIENCE_S:g} s for the town (GT_TOWN_PATIENCE; gt-agent's an hour), "
        "so a `gt up` within that loses nothing. A session left longer without the town fails its call and may "
        "stop; once the town is back, the witness gives its bead a fresh session when its hook lease runs out "
        f"(the rig's stall_after). `gt down --sessions` stops {'it' if one else 'them'} with the town."
    )


def tmux_socket() -> str:
    """The tmux server polecat sessions run on (the witness's ``GT_TMUX_SOCKET``)."""
    return os.environ.get("GT_TMUX_SOCKET") or DEFAULT_TMUX_SOCKET


def polecat_tmux_sessions(config: TownConfig) -> list[str]:
    """Names of this town's polecat tmux sessions running now (none when tmux is not there); another town's on the
    same socket are not counted."""
    try:
        panes = Tmux(tmux_socket(), town=town_mark(config)).snapshot()
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
            if (rejected := outcome.rejected) is not None:
                raise GastownError(f"session {session_id}: {rejected.message}")
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
