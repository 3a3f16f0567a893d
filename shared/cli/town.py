"""``gt up`` and ``gt down``: an embedded NATS server plus the services, supervised as child processes.

The supervisor writes ``$GT_HOME/run/town.json`` (its pid, the NATS URL, each service's pid, ready or
not). ``gt down`` signals the supervisor, which stops the services in reverse dependency order, then NATS.
A service that dies is restarted with exponential backoff; one that keeps dying (5 restarts within
15 minutes) is left down and reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from shared import logging as gt_logging
from shared.bus.connection import connect
from shared.bus.topology import provision
from shared.cli.client import query
from shared.config import TownConfig
from shared.embedded import EmbeddedServer
from shared.errors import GastownError, QueryError

log = structlog.get_logger("gt.up")

START_ORDER = ("mayor", "witness", "refinery", "deacon")
CRASH_LOOP_RESTARTS = 5
CRASH_LOOP_WINDOW_S = 15 * 60
MAX_BACKOFF_S = 30.0
READY_TIMEOUT_S = 120.0


def state_path(config: TownConfig) -> Path:
    return config.gt_home / "run" / "town.json"


def read_state(config: TownConfig) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_path(config).read_text())
    except (OSError, ValueError):
        return None
    return state


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ChildService:
    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts: list[float] = []
        self.next_start = 0.0
        self.gave_up = False

    def start(self) -> None:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", f"services.{self.name}", "--log-json"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
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
        log.info("service_stopped", name=self.name)

    def check(self, now: float) -> None:
        """Restart a dead child with backoff; give up on a crash loop."""
        if self.gave_up:
            return
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:
            code = self.proc.returncode
            self.proc = None
            self.restarts = [t for t in self.restarts if now - t < CRASH_LOOP_WINDOW_S] + [now]
            if len(self.restarts) > CRASH_LOOP_RESTARTS:
                self.gave_up = True
                log.error("service_crash_loop", name=self.name, restarts=len(self.restarts), exit_code=code)
                return
            delay = min(MAX_BACKOFF_S, 0.5 * 2 ** (len(self.restarts) - 1))
            self.next_start = now + delay
            log.warning("service_died", name=self.name, exit_code=code, restart_in_s=delay)
        if now >= self.next_start:
            self.start()


class Supervisor:
    def __init__(self, config: TownConfig, services: list[str], port: int) -> None:
        self.config = config
        self.services_wanted = services
        self.port = port
        self.home = config.gt_home
        self.server: EmbeddedServer | None = None
        self.children: list[ChildService] = []
        self.nats_url = config.nats_url
        self._stop = asyncio.Event()
        self.ready = False

    def write_state(self) -> None:
        path = state_path(self.config)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "pid": os.getpid(),
            "nats_url": self.nats_url,
            "embedded_nats": self.server is not None,
            "nats_pid": self.server.proc.pid if self.server and self.server.proc else None,
            "services": {c.name: (c.proc.pid if c.proc else None) for c in self.children},
            "gave_up": [c.name for c in self.children if c.gave_up],
            "ready": self.ready,
        }
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(path)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        try:
            if "NATS_URL" not in os.environ:
                self.server = EmbeddedServer(
                    self.home / "nats", port=self.port, log_file=self.home / "logs" / "nats-server.log"
                )
                self.server.start()
                self.nats_url = self.server.url
                log.info("nats_started", url=self.nats_url, store=str(self.server.store_dir))
            config = self._config()
            nc = await connect(config, name="gt-up", connect_attempts=50)
            try:
                await provision(nc.jetstream(), config)
                env = {**os.environ, "NATS_URL": self.nats_url, "GT_HOME": str(self.home)}
                for name in START_ORDER:
                    if name in self.services_wanted:
                        child = ChildService(name, env, self.home / "logs")
                        child.start()
                        self.children.append(child)
                self.write_state()
                await self._wait_ready(nc)
                self.ready = True
                self.write_state()
                log.info("town_ready", nats_url=self.nats_url, services=[c.name for c in self.children])
                while not self._stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), timeout=0.5)
                    now = time.monotonic()
                    before = {c.name: c.proc.pid if c.proc else None for c in self.children}
                    for child in self.children:
                        child.check(now)
                    if before != {c.name: c.proc.pid if c.proc else None for c in self.children}:
                        self.write_state()
            finally:
                await nc.close()
        finally:
            self.shutdown()
        return 0

    def _config(self) -> TownConfig:
        from msgspec.structs import replace

        return replace(self.config, nats_url=self.nats_url)

    async def _wait_ready(self, nc: Any) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = {c.name for c in self.children}
        while pending and time.monotonic() < deadline and not self._stop.is_set():
            for name in sorted(pending):
                with contextlib.suppress(QueryError):
                    status = await query(nc, name, "status", {}, timeout=1)
                    if status.get("caught_up"):
                        pending.discard(name)
            for child in self.children:
                child.check(time.monotonic())
            if pending:
                await asyncio.sleep(0.2)
        if pending:
            log.warning("services_not_ready", services=sorted(pending))

    def shutdown(self) -> None:
        for child in reversed(self.children):
            child.stop()
        if self.server is not None:
            self.server.stop()
            log.info("nats_stopped")
        with contextlib.suppress(OSError):
            state_path(self.config).unlink()


def up(args: argparse.Namespace, config: TownConfig) -> int:
    existing = read_state(config)
    if existing and pid_alive(int(existing["pid"])):
        print(f"town already up (supervisor pid {existing['pid']}, NATS {existing['nats_url']})")
        return 0
    services = [s.strip() for s in args.services.split(",") if s.strip()]
    unknown = sorted(set(services) - set(START_ORDER))
    if unknown:
        print(f"gt: unknown services {unknown}; choose from {', '.join(START_ORDER)}", file=sys.stderr)
        return 2
    if args.detach:
        return _detach(args, config)
    gt_logging.configure("gt-up")
    try:
        return asyncio.run(Supervisor(config, services, args.port).run())
    except GastownError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return 3


def _detach(args: argparse.Namespace, config: TownConfig) -> int:
    logs = config.gt_home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "shared.cli.main", "up", "--port", str(args.port), "--services", args.services]
    with (logs / "town.log").open("ab") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"gt: the town failed to start (exit {proc.returncode}); see {logs / 'town.log'}", file=sys.stderr)
            return 3
        state = read_state(config)
        if state and state.get("ready") and state.get("pid") == proc.pid:
            print(f"town up: NATS {state['nats_url']}, services {', '.join(state['services'])} (logs in {logs})")
            return 0
        time.sleep(0.1)
    print("gt: the town did not become ready in time; see the logs", file=sys.stderr)
    return 3


def down(config: TownConfig) -> int:
    state = read_state(config)
    if not state or not pid_alive(int(state["pid"])):
        print("no town is running")
        with contextlib.suppress(OSError):
            state_path(config).unlink()
        return 0
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            print("town down")
            return 0
        time.sleep(0.1)
    print(f"gt: the supervisor (pid {pid}) did not stop within 90s", file=sys.stderr)
    return 1
