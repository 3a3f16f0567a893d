"""`gt gc [--ttl SECONDS]`: ask the deacon for a garbage collection sweep now."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gt.cli.common import Subcommands, UsageError, send
from shared.core.config import TownConfig
from shared.model.commands import GcSweep
from shared.model.results import GcResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    gc = sub.command(
        "gc",
        _gc,
        help="sweep the projections now: closed molecules, wisps, sessions and finished merge requests older "
        "than the TTL leave them (the log is never edited)",
    )
    gc.add_argument(
        "--ttl",
        type=float,
        default=None,
        metavar="SECONDS",
        help="collect what finished more than this long ago (default: the deacon's GT_GC_TTL, a week)",
    )


def _swept(result: GcResult) -> str:
    return (
        f"swept: what finished before {(result.cutoff or '-').replace('T', ' ')[:19]} "
        f"(TTL {result.ttl_s:g} s) leaves the projections; the log keeps it"
    )


async def _gc(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    if args.ttl is not None and args.ttl < 0:
        raise UsageError(f"--ttl must be 0 or more seconds, got {args.ttl:g}")
    return await send(nc, args, config, GcSweep(ttl_s=args.ttl), _swept)
