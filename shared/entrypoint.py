"""What every ``python -m services.<name>`` does: flags, logging, signals, run until told to stop."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence

import structlog

from shared import config as town_config
from shared import logging as gt_logging
from shared.errors import GastownError
from shared.service import Service, ServiceSettings


def main(name: str, factory: Callable[[town_config.TownConfig, ServiceSettings], Service], argv: Sequence[str] | None = None) -> int:  # type: ignore[type-arg]
    parser = argparse.ArgumentParser(prog=f"gt-{name}", description=f"Run the {name} service.")
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated (env NATS_URL)")
    parser.add_argument("--gt-home", help="town directory (env GT_HOME)")
    parser.add_argument("--patrol-interval", type=float, default=5.0, help="seconds between patrol ticks")
    parser.add_argument("--no-snapshots", action="store_true", help="always rebuild the projection from the log")
    parser.add_argument("--log-level", default=os.environ.get("GT_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if args.nats_url:
        env["NATS_URL"] = args.nats_url
    if args.gt_home:
        env["GT_HOME"] = args.gt_home
    gt_logging.configure(name, json=args.log_json, level=args.log_level)
    log = structlog.get_logger(f"services.{name}")
    cfg = town_config.load(env, service=name)
    settings = ServiceSettings(patrol_interval=args.patrol_interval, use_snapshots=not args.no_snapshots)
    service = factory(cfg, settings)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(service.shutdown()))
        log.info("service_starting", nats_url=cfg.nats_url)
        await service.run()
        log.info("service_stopped")

    try:
        asyncio.run(serve())
    except GastownError as exc:
        log.error("service_failed", error=str(exc))
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
