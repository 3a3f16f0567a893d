"""``gt up`` (foreground, detached, on a town already running, one service restarted) and ``gt down``, and what
they say of a town that is not well."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from gt.cli.progress import Progress
from gt.embedded_nats import read_since
from gt.town.policy import DOWN_TIMEOUT_S, HEALTH_PATIENCE_S, NATS, READY_TIMEOUT_S, START_ORDER
from gt.town.sessions import (
    clean_worktrees,
    end_sessions_without_town,
    polecat_tmux_sessions,
    sessions_left_running,
    stop_sessions,
)
from gt.town.state import TownState, read_state, restart_requests_dir, running_town, state_path
from gt.town.supervisor import Supervisor
from gt.town_secrets import as_operator
from shared.bus.connection import close_quietly, connect
from shared.bus.errors import BusError
from shared.bus.query import ask
from shared.core import logging as gt_logging
from shared.core.config import TownConfig
from shared.core.errors import (
    GastownError,
    NatsUnavailableError,
    QueryError,
)
from shared.host import processes
from shared.host.privacy import hide_environment, private_files
from shared.model.queries import Status


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
    if warning := gate_user_warning(os.environ, os.geteuid()):
        print(f"gt: warning: {warning}", file=sys.stderr)
    reaped = reap_leftovers(config)
    if reaped:
        print(f"stopped leftovers of a town whose supervisor died: {', '.join(reaped)}", file=sys.stderr)
    if args.detach:
        return _detach(args, config, embedded=embedded)
    gt_logging.configure("gt-up")
    try:
        return asyncio.run(Supervisor(config, services, args.port, embedded=embedded, runners=args.runners).run())
    except GastownError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return 3


def gate_user_warning(env: Mapping[str, str], euid: int) -> str | None:
    """What `gt up` says when agents run as their own user but the merge gates, which run the code those agents
    wrote, would run as root; None when that is not so."""
    if euid != 0 or not env.get("GT_AGENT_USER", "").strip() or env.get("GT_GATE_USER", "").strip():
        return None
    return (
        "GT_AGENT_USER keeps agents off your files, but the merge queue's gates run the code they wrote, and "
        "without GT_GATE_USER they run it as root: an agent's test file would own the machine. Set GT_GATE_USER to "
        'another unprivileged user (docs/deployment.md, "Agents as another OS user")'
    )


def _detach(args: argparse.Namespace, config: TownConfig, *, embedded: bool) -> int:
    logs = config.gt_home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "gt.cli.main", "up", "--port", str(args.port), "--services", args.services]
    cmd += ["--runners", str(args.runners)]
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
        if sessions and (ended := end_sessions_without_town(config)):
            # Nobody to record it: the next `gt up`'s witness finds the panes gone, a death of each session, and
            # gives its bead a fresh one.
            print(
                f"ended {ended} polecat session{'s' if ended != 1 else ''} left running without a town (their "
                "processes with them); the next `gt up` gives their beads fresh sessions"
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
