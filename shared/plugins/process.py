"""What every plugin's ``__main__`` does: common flags, logging once, signals, run until told to stop."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable

import structlog

from shared.core import config as town_config
from shared.core import logging as gt_logging
from shared.core.arguments import non_negative_int, positive_float
from shared.host.privacy import private_files
from shared.plugins.sdk import Plugin
from shared.service.lifecycle import stop_on_signals

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
__all__ = ["non_negative_int", "plugin_parser", "positive_float", "run_plugin"]


def plugin_parser(name: str, description: str) -> argparse.ArgumentParser:
    """A parser with the flags every plugin takes; add the plugin's own to it."""
    parser = argparse.ArgumentParser(prog=f"gt-plugin-{name}", description=description)
    parser.add_argument("--nats-url", help="NATS server URL(s), comma-separated (env NATS_URL)")
    parser.add_argument("--gt-home", help="town directory (env GT_HOME)")
    parser.add_argument("--log-level", default=os.environ.get("GT_LOG_LEVEL", "INFO"))
    parser.add_argument("--log-json", action="store_true", default=None, help="JSON logs even on a TTY")
    return parser


def run_plugin(name: str, args: argparse.Namespace, build: Callable[[town_config.TownConfig], Plugin]) -> int:
    """Configure logging and the town from ``args`` and the environment, build the plugin and run it until
    SIGTERM/SIGINT; returns the process exit code (1: it failed, 2: bad configuration)."""
    env = dict(os.environ)
    if args.nats_url:
        env["NATS_URL"] = args.nats_url
    if args.gt_home:
        env["GT_HOME"] = args.gt_home
    gt_logging.configure(f"plugin-{name}", json=args.log_json, level=args.log_level)
    log = structlog.get_logger(f"services.plugins.{name}")
    try:
        private_files(env)  # its archives, marks and files under GT_HOME
        cfg = town_config.load(env)
        plugin = build(cfg)
    except ValueError as exc:
        log.error("bad_configuration", error=str(exc))
        return EXIT_USAGE
    town_config.forget_secrets()  # read: nothing the plugin starts inherits its NATS password

    async def serve() -> None:
        stop_on_signals(plugin.shutdown)
        log.info("plugin_starting", nats_url=cfg.nats_url, pid=os.getpid(), position_key=plugin.settings.position_key)
        await plugin.run()
        log.info("plugin_stopped", **plugin.status())

    try:
        asyncio.run(serve())
    except Exception:
        # Exiting non-zero; a supervisor restarts the plugin, which resumes from its recorded position.
        log.exception("plugin_failed")
        return EXIT_FAILED
    return EXIT_OK
