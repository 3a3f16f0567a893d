"""The ``gt up`` supervisor: it starts the embedded nats-server and the services, restarts what dies, escalates
a crash loop, and stops them all in order on ``gt down``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from datetime import datetime
from typing import Any

import msgspec
import structlog

from gt.embedded_nats import EmbeddedServer, accounts_conf, adopt_unaccounted_store
from gt.town.children import ChildService, SupervisedNats
from gt.town.policy import (
    CRASH_LOOP_WINDOW_S,
    HUNG_CONFIRM_S,
    NATS,
    OUTAGE_GRACE_S,
    READY_TIMEOUT_S,
    RUNNER,
    START_ORDER,
    module_of,
    runner_names,
    start_rank,
    stop_rank,
)
from gt.town.state import TownState, escalations_dir, restart_requests_dir, state_path, write_state
from gt.town_secrets import TownSecrets, as_user
from gt.town_secrets import ensure as ensure_town_secrets
from shared.bus import commands as bus_commands
from shared.bus import streams
from shared.bus.connection import connect
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.bus.query import ask
from shared.bus.topology import provision
from shared.core import subjects
from shared.core.aio import wait_event
from shared.core.config import TownConfig
from shared.core.errors import (
    EXIT_LOG_LOST,
    AppendFailedError,
    PermissionDeniedError,
    QueryError,
)
from shared.host import processes
from shared.model import heartbeats
from shared.model.commands import EscalationRaise
from shared.model.events import ServiceDown, decode_envelope
from shared.model.queries import Status

log = structlog.get_logger("gt.up")


class Supervisor:
    """Runs the town in the foreground until SIGTERM/SIGINT."""

    def __init__(self, config: TownConfig, services: list[str], port: int, *, embedded: bool, runners: int = 0) -> None:
        self.config = config
        self.services_wanted = services
        self.runners = runners
        """Gate runners to start beside the services (``runner-1`` ...)."""
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
        write_state(
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
                    # Off unless asked for: unauthenticated, it would show an agent every connection and stream.
                    monitor=os.environ.get("GT_NATS_MONITOR", "") == "1",
                )
                await asyncio.to_thread(self.server.start)
                self.nats = SupervisedNats(self.server)
                self.nats_url = self.server.url
                log.info(
                    "nats_started",
                    url=self.nats_url,
                    store=str(self.server.store_dir),
                    monitoring=f"http://127.0.0.1:{self.server.http_port}" if self.server.http_port else None,
                )
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
                names = [name for name in START_ORDER if name in self.services_wanted] + runner_names(self.runners)
                for name in sorted(names, key=start_rank):
                    child = ChildService(name, self._child_env(env, name, town_secrets), logs)
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

    def _child_env(self, env: dict[str, str], name: str, town_secrets: TownSecrets | None) -> dict[str, str]:
        """A child's environment: its own login (a runner's, the user ``runner`` all runners share); a runner's name;
        the refinery's gates on the runners (``GT_MQ_RUNNERS``) unless the operator said otherwise."""
        module = module_of(name)
        own = town_secrets.service_env(env, module) if town_secrets is not None else dict(env)
        if module == RUNNER:
            own["GT_RUNNER_NAME"] = name.removeprefix(f"{RUNNER}-")
            # Each runner's home is its own (GT_HOME/runners/<name>): one set for all would be shared by all.
            own.pop("GT_RUNNER_HOME", None)
        elif module == "refinery" and self.runners and not env.get("GT_MQ_RUNNERS"):
            own["GT_MQ_RUNNERS"] = str(self.runners)
        return own

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
        for child in sorted(self.children, key=lambda c: stop_rank(c.name)):
            child.stop()
        if self.server is not None:
            self.server.stop()
            log.info("nats_stopped")
        with contextlib.suppress(OSError):
            state_path(self.config).unlink()
