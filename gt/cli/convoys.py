"""`gt convoy create|add|status|list|land`."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, Literal

import msgspec

from gt.cli import client, render
from gt.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Subcommands,
    key_values,
    limit_option,
    print_id,
    read,
    read_typed,
    send,
    show,
    show_reply,
)
from gt.cli.progress import Progress
from shared.bus.query import ask, reply_of
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.model.commands import BeadSling, ConvoyAdd, ConvoyCreate, ConvoyLand
from shared.model.queries import mayor, refinery
from shared.model.queries.refinery import PausedQueue
from shared.model.results import UNSET, ConvoyResult, SlingResult, UnsetType

if TYPE_CHECKING:
    from shared.bus.connection import Connection

SLING_CONCURRENCY = 16
REFINERY_QUERY_TIMEOUT_S = 3.0


def register(sub: Subcommands) -> None:
    convoy = sub.group("convoy", "convoys: create, add, status, list, land, sling", "convoy_cmd")

    c = convoy.command("create", _create, help="track beads together")
    c.add_argument("title")
    c.add_argument("beads", nargs="*")
    c.add_argument("--owned", action="store_true", help="closes only when landed, not by itself")

    a = convoy.command("add", _add, help="track more beads")
    a.add_argument("convoy")
    a.add_argument("beads", nargs="+")

    s = convoy.query("status", _status, help="a convoy's progress and beads")
    s.add_argument("convoy")

    ls = convoy.query("list", _list, help="open convoys with their progress")
    ls.add_argument("--all", action="store_true", help="closed ones too")
    limit_option(ls)

    la = convoy.command("land", _land, help="close an owned convoy")
    la.add_argument("convoy")
    la.add_argument("--force", action="store_true", help="even while it tracks open beads")

    sl = convoy.add_parser(
        "sling",
        help="sling every open bead of a convoy to a rig, cooking each one's molecule; a bead with open blockers "
        "is held, and the mayor slings it once they are closed (in waves)",
    )
    sl.add_argument("convoy")
    sl.add_argument("rig")
    sl.add_argument("--formula", help="formula to cook (default: the rig's)")
    sl.add_argument("--var", action="append", metavar="KEY=VALUE", help="formula var (repeatable)")
    sl.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each bead's outcome")
    sl.add_argument("--json", action="store_true", help="print what became of each bead as JSON")
    sl.set_defaults(handler=_sling)


def _progress_line(result: ConvoyResult) -> str:
    changed = "" if result.changed else " (unchanged)"
    return f"{result.id}: {result.status}{changed}, {result.closed}/{result.total} closed"


class SlungBead(msgspec.Struct, kw_only=True):
    """What became of one bead of a convoy's sling (``--json`` prints them by bead)."""

    status: Literal["slung", "held", "rejected", "pending"]
    result: SlingResult | UnsetType = UNSET
    code: str | UnsetType = UNSET
    message: str | UnsetType = UNSET


async def _create(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = ConvoyCreate(title=args.title, beads=args.beads, owned=args.owned)
    return await send(nc, args, config, cmd, print_id)


async def _add(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, ConvoyAdd(id=args.convoy, beads=args.beads), _progress_line)


async def _land(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, ConvoyLand(id=args.convoy, force=args.force), _progress_line)


async def _status(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Convoy(id=args.convoy)
    answer = await read(nc, config, query)
    convoy = reply_of(query, answer)
    waiting = await _waiting_in_paused_queues(nc)
    for bead in answer.get("bead_details", []):  # in the JSON too: its merge waits for `gt mq resume <rig>`
        if (queue := waiting.get(bead["id"])) is not None and bead.get("status") != "closed":
            bead["queue_paused"] = {"rig": queue.rig, "reason": queue.reason}
    return show(args, answer, lambda _: render.convoy_detail(convoy, waiting))


async def _waiting_in_paused_queues(nc: Connection) -> dict[str, PausedQueue]:
    """Bead -> the paused merge queue its merge request waits in; nothing when the refinery does not answer (the
    convoy is shown without it)."""
    try:
        waiting: dict[str, PausedQueue] = {}
        for queue in await ask(nc, refinery.PausedQueues(), timeout=REFINERY_QUERY_TIMEOUT_S):
            for mr in await ask(nc, refinery.Mrs(rig=queue.rig), timeout=REFINERY_QUERY_TIMEOUT_S):
                if mr.status in ("queued", "claimed"):
                    waiting[mr.bead] = queue
    except QueryError:
        return {}
    return waiting


async def _list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Convoys(include_closed=args.all, limit=args.limit)
    return show_reply(args, query, await read(nc, config, query), render.convoy_table)


async def _sling(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    """One ``bead.sling`` per open bead of the convoy (closed and already slung ones are left as they are),
    several at a time, with a progress bar: a convoy of a thousand beads is a thousand molecules to cook.

    Each is sent with ``hold``: a bead whose blockers (in the convoy or not) are not all closed is held, and
    the mayor slings it once they are, so the convoy goes out in waves in dependency order. The order these
    commands arrive in does not matter: a blocker being slung right now is still open."""
    convoy = await read_typed(nc, config, mayor.Convoy(id=args.convoy))
    details = convoy.bead_details or []
    todo = [b.id for b in details if b.status == "open"]
    skipped = len(details) - len(todo)
    vars_ = key_values(args.var, "--var")
    limit = asyncio.Semaphore(SLING_CONCURRENCY)
    bar = Progress(f"slinging {args.convoy} to {args.rig}", len(todo))
    results: dict[str, SlungBead] = {}

    async def sling(bead: str) -> None:
        cmd = BeadSling(id=bead, rig=args.rig, formula=args.formula, vars=vars_, no_convoy=True, hold=True)
        async with limit:
            outcome = await client.send(nc, config, cmd, timeout=args.timeout)
        if (accepted := outcome.accepted) is not None:
            waits = accepted.result.status == "held"
            results[bead] = SlungBead(status="held" if waits else "slung", result=accepted.result)
        elif (rejected := outcome.rejected) is not None:
            results[bead] = SlungBead(status="rejected", code=rejected.code, message=rejected.message)
        else:
            results[bead] = SlungBead(status="pending", message="stored; the mayor has not answered yet")
        bar.advance()

    await asyncio.gather(*(sling(b) for b in todo))
    bar.finish()
    slung = [b for b in todo if results[b].status == "slung"]
    held = [b for b in todo if results[b].status == "held"]
    failed = [b for b in todo if results[b].status not in ("slung", "held")]
    if args.json:
        render.print_json({"convoy": args.convoy, "rig": args.rig, "skipped": skipped, "beads": results})
    else:
        waiting = f", {len(held)} held until their blockers close" if held else ""
        print(f"{args.convoy}: {len(slung)} slung to {args.rig}{waiting}, {skipped} not open (left as they were)")
        for bead in held:
            found = results[bead].result
            print(f"  {bead}: held: waiting for {', '.join((found.waiting_for or []) if found else [])}")
        for bead in failed:
            r = results[bead]
            print(f"  {bead}: {r.status}: {r.code or ''} {r.message or ''}".rstrip())
    return EXIT_REJECTED if failed else EXIT_OK
