"""What every ``python -m services.<name>`` does: flags, logging, signals, run until told to stop."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from shared.core import config as town_config
from shared.core import logging as gt_logging
from shared.core.aio import task_stacks
from shared.core.arguments import from_args
from shared.core.errors import EXIT_LOG_LOST, ActivityLostError, EventLogLostError
from shared.host import git
from shared.host.privacy import hide_environment, private_files
from shared.model.activity import MIN_TTL_S
from shared.service import Service, ServiceSettings
from shared.service import heap as runtime
from shared.service.lifecycle import stop_on_signals

ServiceFactory = Callable[[town_config.TownConfig, ServiceSettings], Service[Any]]
EXIT_FAILED = 1


def build_parser(name: str) -> argparse.ArgumentParser:
    defaults = ServiceSettings()
    parser = argparse.ArgumentParser(prog=f"gt-{name}", description=f"Run the {name} service.")
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated (env NATS_URL)")
    parser.add_argument("--gt-home", help="town directory (env GT_HOME)")
    parser.add_argument(
        "--patrol-interval",
        type=float,
        default=float(os.environ.get("GT_PATROL_INTERVAL", defaults.patrol_interval)),
        help="seconds between patrol ticks (env GT_PATROL_INTERVAL)",
    )
    parser.add_argument("--no-snapshots", action="store_true", help="always rebuild the projection from the log")
    parser.add_argument(
        "--snapshot-every",
        type=int,
        default=defaults.snapshot_every,
        help="store a snapshot after this many new events (0: only at shutdown)",
    )
    parser.add_argument(
        "--snapshot-check-interval",
        type=float,
        default=defaults.snapshot_check_interval,
        help="seconds between checks whether a snapshot is due",
    )
    parser.add_argument("--max-in-flight", type=int, default=defaults.max_in_flight, help="commands settled at once")
    parser.add_argument(
        "--heartbeat-interval",
        type=float,
        default=defaults.heartbeat_interval,
        help="seconds between heartbeats in the GT_SERVICES bucket (0: none)",
    )
    parser.add_argument(
        "--active-ttl",
        type=float,
        default=None,
        help="seconds of this service scope's activity key: with several instances, one acts and the others stand "
        f"by and take over within about this long once it is gone (env GT_ACTIVE_TTL, default {defaults.active_ttl:g})",
    )
    parser.add_argument("--log-level", default=os.environ.get("GT_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    return parser


def _active_ttl(flag: float | None, env: dict[str, str], service: str) -> float:
    """``--active-ttl``, else ``<SERVICE>_GT_ACTIVE_TTL``, else ``GT_ACTIVE_TTL``, else the default; raises
    ValueError naming a bad value."""
    if flag is None:
        key = f"{service.upper()}_GT_ACTIVE_TTL"  # like MAYOR_NATS_URL: the service's own wins
        if not env.get(key):
            key = "GT_ACTIVE_TTL"
        return town_config.env_number(env, key, ServiceSettings().active_ttl, minimum=MIN_TTL_S)
    if flag < MIN_TTL_S:
        raise ValueError(f"--active-ttl must be at least {MIN_TTL_S:g} seconds, got {flag:g}")
    return flag


def main(name: str, factory: ServiceFactory, argv: Sequence[str] | None = None) -> int:
    """Run service ``name`` until SIGTERM/SIGINT; returns the process exit code."""
    hide_environment()  # its NATS password, from the gates and agents it starts (the same OS user)
    args = build_parser(name).parse_args(argv)
    env = dict(os.environ)
    if args.nats_url:
        env["NATS_URL"] = args.nats_url
    if args.gt_home:
        env["GT_HOME"] = args.gt_home
    gt_logging.configure(name, json=args.log_json, level=args.log_level)
    runtime.tune_gc()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: thread stacks to stderr
    log = structlog.get_logger(f"services.{name}")
    try:
        private_files(env)  # what it creates under GT_HOME (clones, worktrees, logs), and what it starts
        cfg = town_config.load(env, service=name)
        active_ttl = _active_ttl(args.active_ttl, env, name)
        git.git_env_names(env)  # GT_GIT_ENV: refused now, not at the first git
    except ValueError as exc:
        log.error("bad_configuration", error=str(exc))
        return EXIT_FAILED
    settings = from_args(ServiceSettings, args, use_snapshots=not args.no_snapshots, active_ttl=active_ttl)
    try:
        service = factory(cfg, settings)
    except ValueError as exc:  # a service's own setting (GT_GATE_USER, ...) that cannot be used
        log.error("bad_configuration", error=str(exc))
        return EXIT_FAILED
    # Everything is read (the town's config above, the service's own settings in its factory: the witness's
    # session keys and agent credentials): the secrets leave the environment, so nothing this process starts
    # (git and its hooks, gates, automations, tmux, agents) inherits them.
    forgotten = town_config.forget_secrets()

    async def serve() -> None:
        stop_on_signals(service.shutdown)
        # `kill -USR2 <pid>` logs what every task is waiting on: for a service that seems stuck.
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGUSR2, lambda: log.warning("task_dump", tasks=task_stacks())
        )
        log.info("service_starting", nats_url=cfg.nats_url, pid=os.getpid(), secrets_forgotten=forgotten)
        try:
            await service.run()
        except ActivityLostError as exc:
            # Another instance acts for this scope now (or may, any moment). Out at once: asyncio.run would wait
            # for the threads still running a step (git, tmux, a gate); they end with the process instead.
            # Started again, this process comes back as a standby.
            log.error("service_stopped_not_active", why=exc.why)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_FAILED)
        log.info("service_stopped")

    try:
        asyncio.run(serve())
    except EventLogLostError as exc:
        # Never an empty town over a lost one: out, saying why; an operator restores the log or starts over.
        log.error("event_log_lost", stream=exc.stream, why=exc.why, error=str(exc))
        return EXIT_LOG_LOST
    except Exception:
        # The process is about to exit non-zero; its supervisor (gt up, docker) restarts it.
        log.exception("service_failed")
        return EXIT_FAILED
    return 0
