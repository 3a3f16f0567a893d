"""`gt convoy create|add|status|list|land`."""

from __future__ import annotations

import argparse
from typing import Any

from nats.aio.client import Client

from shared.cli import render
from shared.cli.common import Subcommands, command_options, read, read_options, send, show
from shared.config import TownConfig


def register(sub: Subcommands) -> None:
    convoy = sub.group("convoy", "convoys: create, add, status, list, land", "convoy_cmd")

    c = convoy.add_parser("create", help="track beads together")
    c.add_argument("title")
    c.add_argument("beads", nargs="*")
    c.add_argument("--owned", action="store_true", help="closes only when landed, not by itself")
    command_options(c)
    c.set_defaults(handler=_create)

    a = convoy.add_parser("add", help="track more beads")
    a.add_argument("convoy")
    a.add_argument("beads", nargs="+")
    command_options(a)
    a.set_defaults(handler=_add)

    s = convoy.add_parser("status", help="a convoy's progress and beads")
    s.add_argument("convoy")
    read_options(s)
    s.set_defaults(handler=_status)

    ls = convoy.add_parser("list", help="open convoys with their progress")
    ls.add_argument("--all", action="store_true", help="closed ones too")
    read_options(ls)
    ls.set_defaults(handler=_list)

    la = convoy.add_parser("land", help="close an owned convoy")
    la.add_argument("convoy")
    la.add_argument("--force", action="store_true", help="even while it tracks open beads")
    command_options(la)
    la.set_defaults(handler=_land)


def _progress_line(result: dict[str, Any]) -> str:
    changed = "" if result.get("changed", True) else " (unchanged)"
    return f"{result.get('id')}: {result.get('status')}{changed}, {result.get('closed')}/{result.get('total')} closed"


async def _create(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    body = {"title": args.title, "beads": args.beads, "owned": args.owned or None}
    return await send(nc, args, config, "gt.cmd.convoy.create", body, _progress_line)


async def _add(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, "gt.cmd.convoy.add", {"id": args.convoy, "beads": args.beads}, _progress_line)


async def _land(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    body = {"id": args.convoy, "force": args.force or None}
    return await send(nc, args, config, "gt.cmd.convoy.land", body, _progress_line)


async def _status(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    return show(args, await read(nc, config, "convoy", {"id": args.convoy}), render.convoy_detail)


async def _list(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    found = await read(nc, config, "convoys", {"include_closed": True} if args.all else {})
    return show(args, found, render.convoy_table)
