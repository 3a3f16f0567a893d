"""`gt bead ...` and `gt ready`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gt.cli import feed, render
from gt.cli.common import (
    Subcommands,
    UsageError,
    key_values,
    limit_option,
    print_id,
    read,
    read_typed,
    send,
    show_reply,
    status_line,
)
from shared.core.arguments import from_args
from shared.core.config import TownConfig
from shared.model.commands import BeadClaim, BeadClose, BeadCreate, BeadUpdate
from shared.model.events.beads import BEAD_TYPES, WORK_TYPES
from shared.model.queries import mayor, witness

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    bead = sub.group("bead", "beads: create, show, list, update, claim, close, deps, history", "bead_cmd")

    c = bead.command("create", _create, help="file a new bead")
    c.add_argument("title")
    c.add_argument(
        "--type", "-t", choices=BEAD_TYPES, metavar="TYPE", help=f"work: {', '.join(WORK_TYPES)} (default task)"
    )
    c.add_argument("--priority", "-p", type=int)
    c.add_argument("--description", "-d")
    c.add_argument("--label", "-l", action="append", dest="labels")
    c.add_argument("--meta", action="append", metavar="KEY=VALUE")
    c.add_argument("--parent")
    c.add_argument("--needs", action="append", help="a blocking dependency (repeatable)")
    c.add_argument("--assignee")
    prefixes = c.add_mutually_exclusive_group()
    prefixes.add_argument("--prefix", help="id prefix (default hq)")
    prefixes.add_argument("--rig", help="file it under the id prefix of this rig (its `gt rig add --prefix`)")

    s = bead.query("show", _show, help="one bead")
    s.add_argument("id")

    ls = bead.query("list", _list, help="beads in creation order (closed ones only with --all or --status closed)")
    for flag in ("--status", "--type", "--label", "--assignee", "--parent", "--rig"):
        ls.add_argument(flag)
    ls.add_argument("--meta", action="append", metavar="KEY=VALUE", help="metadata that must match (repeatable)")
    ls.add_argument("--all", action="store_true", help="include closed beads")
    limit_option(ls)

    u = bead.command("update", _update, help="change a bead's fields and dependencies")
    u.add_argument("id")
    u.add_argument("--title")
    u.add_argument("--type", "-t", choices=BEAD_TYPES, metavar="TYPE", help=f"work: {', '.join(WORK_TYPES)}")
    u.add_argument("--priority", "-p", type=int)
    u.add_argument("--description", "-d")
    u.add_argument("--assignee", help='"" clears it')
    u.add_argument("--parent", help='"" clears it')
    u.add_argument("--label", "-l", action="append", dest="labels", help="add a label")
    u.add_argument("--remove-label", action="append", dest="remove_labels")
    u.add_argument("--meta", action="append", metavar="KEY=VALUE", help="set metadata (merged)")
    u.add_argument("--needs", action="append", help="add a blocking dependency")
    u.add_argument("--remove-needs", action="append", dest="remove_needs", help="drop a dependency")
    u.add_argument("--blocks", action="append", help="make that bead need this one")
    u.add_argument("--status", help="move the status forward (moving backward is refused)")

    cl = bead.command("claim", _claim, help="take a bead: open/hooked -> in_progress")
    cl.add_argument("id")
    cl.add_argument("--assignee", "-a", required=True)

    x = bead.command("close", _close, help="close a bead (closing a closed bead changes nothing)")
    x.add_argument("id")
    x.add_argument("--reason", "-r", default="")

    d = bead.query("deps", _deps, help="what the bead needs (or, with --up, what needs it)")
    d.add_argument("id")
    d.add_argument("--up", action="store_true")

    feed.register_history(bead)

    r = sub.query("ready", _ready, help="open beads with no open blocker")
    limit_option(r)


async def _rig_prefix(nc: Connection, config: TownConfig, name: str) -> str:
    """The bead id prefix of rig ``name``, as the witness knows it."""
    rig = await read_typed(nc, config, witness.Rig(name=name))
    if rig.removed:
        raise UsageError(f"rig {name} was removed; `gt rig list` shows the rigs")
    return rig.prefix


async def _create(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    if args.rig:
        args.prefix = await _rig_prefix(nc, config, args.rig)
    cmd = from_args(BeadCreate, args, metadata=key_values(args.meta, "--meta"))
    return await send(nc, args, config, cmd, print_id)


async def _update(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = from_args(BeadUpdate, args, metadata=key_values(args.meta, "--meta"))
    return await send(nc, args, config, cmd, status_line)


async def _claim(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, BeadClaim(id=args.id, assignee=args.assignee), status_line)


async def _close(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, BeadClose(id=args.id, reason=args.reason), status_line)


async def _show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Get(id=args.id)
    return show_reply(args, query, await read(nc, config, query), render.bead_detail)


async def _list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = from_args(mayor.Beads, args, metadata=key_values(args.meta, "--meta"), include_closed=bool(args.all))
    return show_reply(args, query, await read(nc, config, query), render.bead_table)


async def _ready(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    ready = mayor.Ready(limit=args.limit)
    return show_reply(args, ready, await read(nc, config, ready), render.bead_table)


async def _deps(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Deps(id=args.id, direction="up" if args.up else "down")
    return show_reply(args, query, await read(nc, config, query), render.deps_lines)
