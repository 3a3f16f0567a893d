"""The supervisor's children: a service process and the embedded nats-server, each restarted with backoff and
left down after a crash loop (``Restarts``)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import structlog

from gt.embedded_nats import EmbeddedServer, free_port
from gt.town.policy import CRASH_LOOP_RESTARTS, CRASH_LOOP_WINDOW_S, MAX_BACKOFF_S, NATS, module_of
from shared.core.errors import (
    EXIT_LOG_LOST,
    GastownError,
)
from shared.host import processes
from shared.host.processes import ProcessRef

log = structlog.get_logger("gt.up")


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
    """One service process under supervision: a service (``mayor``) or a gate runner (``runner-2``, running
    ``services.runner``)."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.module = module_of(name)
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ref: ProcessRef | None = None
        self.restarts = Restarts()

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.module}", "--log-json"],
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
        if self.server.monitor:
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
