"""``gt dashboard``: serve the live web page of the town (``gt/dashboard``) until Ctrl-C."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from gt.cli.common import EXIT_OK, Subcommands
from gt.cli.progress import Progress
from gt.town_secrets import dashboard_token
from shared.core.aio import wait_event
from shared.core.config import TownConfig

if TYPE_CHECKING:
    from shared.bus.connection import Connection

if TYPE_CHECKING:
    from gt.dashboard.server import Dashboard

DEFAULT_PORT = 8765


def register(sub: Subcommands) -> None:
    d = sub.add_parser("dashboard", help="a live web page of the town (convoys, polecats, merge queue, events)")
    d.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    d.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    d.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name browsers may reach it by (requests naming another host are refused; IPs and localhost "
        "always work)",
    )
    d.set_defaults(handler=_dashboard)


async def _dashboard(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    # Imported here: the server and its page are loaded only by `gt dashboard`, not by every `gt` an agent runs.
    from gt.dashboard.server import Dashboard, serve

    token = dashboard_token(config.gt_home)
    dashboard = Dashboard(nc, config, host=args.host, port=args.port, allowed_hosts=tuple(args.allow_host), token=token)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"gt: the dashboard on {args.host} shows the town to anyone who can reach it", file=sys.stderr)
    shown = asyncio.create_task(_show_replay(dashboard), name="replay-progress")
    try:
        await serve(dashboard)
    finally:
        shown.cancel()
        await dashboard.shutdown()
    return EXIT_OK


async def _show_replay(dashboard: Dashboard) -> None:
    """A progress bar while the dashboard replays the log (a large log takes a while), then its address."""
    await dashboard.listening.wait()
    bar = Progress("replaying the log", 0)
    while not dashboard.replayed.is_set():
        if dashboard.replay_target is not None:
            bar.update(dashboard.state.last_seq, dashboard.replay_target)
        await wait_event(dashboard.replayed, 0.1)
    bar.update(dashboard.state.last_seq, max(dashboard.replay_target or 0, dashboard.state.last_seq))
    bar.finish()
    address = f"http://{dashboard.host}:{dashboard.port}/?token={dashboard.token}"
    print(f"dashboard: {address} (Ctrl-C to stop)", file=sys.stderr, flush=True)
