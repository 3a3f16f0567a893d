"""``gt feed`` (a live, filtered tail of the log) and ``gt bead history`` (one bead's whole story).

The feed reads GT_EVT with an ordered consumer from ``--since``: it prints the backlog, says on stderr when
it is caught up, then follows until Ctrl-C (or stops there with ``--no-follow``). A bead's history gathers
the events of the bead, its molecule, its hook lease, and every session, merge request and escalation the
services know for it, merged in log order.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from gt.cli import render
from gt.cli.colour import COLOR_CHOICES, Palette, wanted
from gt.cli.common import EXIT_OK, EXIT_REJECTED, Subcommands, UsageError
from gt.cli.feed_view import (
    ACTOR_WIDTH,
    Filters,
    Since,
    actor_width,
    feed_line,
    parse_since,
    timeline,
)
from gt.story import QUERY_TIMEOUT_S, HistoryEntry, bead_story, history, history_entry
from shared.bus import streams
from shared.bus.query import ask
from shared.bus.reader import EventReader
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.model.queries import refinery, witness

if TYPE_CHECKING:
    from shared.bus.connection import Connection

DEFAULT_SINCE = "10m"


def register(sub: Subcommands) -> None:
    f = sub.add_parser("feed", help="a live tail of the log: the backlog since --since, then every new event")
    f.add_argument("--rig", action="append", default=[], help="only events of this rig (repeatable)")
    f.add_argument("--bead", action="append", default=[], help="only events about this bead (repeatable)")
    f.add_argument("--type", action="append", default=[], help="event type, or a family like `session` (repeatable)")
    f.add_argument("--actor", action="append", default=[], help="only events by this actor (repeatable)")
    f.add_argument(
        "--since",
        default=DEFAULT_SINCE,
        help=f"all, #SEQ, a duration (90s, 10m, 2h, 1d) or an ISO time (default {DEFAULT_SINCE})",
    )
    f.add_argument("--no-follow", action="store_true", help="stop after the backlog")
    f.add_argument("--json", action="store_true", help="one JSON object per event")
    f.add_argument("--color", choices=COLOR_CHOICES, default="auto")
    f.set_defaults(handler=_feed, precheck=_check_since)


def register_history(bead: Subcommands) -> None:
    h = bead.add_parser("history", help="the bead's story: its events and those of its sessions and merges")
    h.add_argument("id")
    h.add_argument("--raw", action="store_true", help="every event with its fields, as stored")
    h.add_argument("--json", action="store_true", help="print JSON")
    h.add_argument("--color", choices=COLOR_CHOICES, default="auto")
    h.set_defaults(handler=_history)


def _check_since(args: argparse.Namespace) -> None:
    try:
        args.since_parsed = parse_since(args.since, datetime.now(UTC))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# ---- the feed -------------------------------------------------------------------------------------


async def start_after(nc: Connection, stream: str, since: Since) -> int:
    """The sequence just before the first event ``since`` asks for (the log has no holes: GT_EVT denies
    deletes, so sequences are contiguous)."""
    if since.seq is not None:
        return since.seq - 1
    if since.time is None:
        return 0
    return await streams.seq_before(nc, stream, since.time)


async def follow_log(
    nc: Connection,
    config: TownConfig,
    since: Since,
    *,
    follow: bool,
    on_caught_up: Callable[[], None] | None = None,
) -> AsyncIterator[HistoryEntry]:
    """Every event from ``since``, in order; with ``follow`` it goes on with new ones. ``on_caught_up`` is
    called once the backlog (what the log held when this began) has been yielded. Read with the services'
    ``EventReader``: no gap, no repeat, and it resubscribes from where it was after a NATS restart."""
    queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
    first = await start_after(nc, config.evt_stream, since)
    reader = EventReader(
        nc, config.evt_stream, lambda seq, _subject, data: queue.put_nowait((seq, data)), start_after=first
    )
    target = await reader.stream_last_seq()
    reading = asyncio.create_task(reader.run(), name="feed-reader")
    backlog = True
    try:
        if target <= first:
            backlog = False
            if on_caught_up is not None:
                on_caught_up()
            if not follow:
                return
        while True:
            getting = asyncio.ensure_future(queue.get())
            await asyncio.wait({getting, reading}, return_when=asyncio.FIRST_COMPLETED)
            if not getting.done():
                getting.cancel()
                reading.result()  # the reader stopped: say why
                return
            seq, raw = getting.result()
            yield history_entry(seq, raw)
            if backlog and seq >= target:
                backlog = False
                if on_caught_up is not None:
                    on_caught_up()
                if not follow:
                    return
    finally:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


async def _seed(nc: Connection, filters: Filters) -> None:
    """Sessions and merge requests begun before ``--since``: their rig and bead (and so the rig of the bead's
    steps and close), from the services."""
    if not (filters.rigs or filters.beads):
        return
    with contextlib.suppress(QueryError):
        for s in await ask(nc, witness.Sessions(all=True), timeout=QUERY_TIMEOUT_S):
            filters.remember(s.id, s.rig, s.bead)
    with contextlib.suppress(QueryError):
        for m in await ask(nc, refinery.Mrs(), timeout=QUERY_TIMEOUT_S):
            filters.remember(m.id, m.rig, m.bead)


async def _feed(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    filters = Filters(rigs=set(args.rig), beads=set(args.bead), types=list(args.type), actors=set(args.actor))
    await _seed(nc, filters)
    palette = Palette(wanted(args.color, sys.stdout))

    def say_caught_up() -> None:
        if not args.no_follow:
            print("-- caught up; following the log (Ctrl-C to stop) --", file=sys.stderr, flush=True)

    width = ACTOR_WIDTH  # grows with the longest actor shown so far: an actor is never cut
    async for entry in follow_log(nc, config, args.since_parsed, follow=not args.no_follow, on_caught_up=say_caught_up):
        if filters.matches(entry):
            if args.json:
                sys.stdout.write(msgspec.json.encode(entry).decode() + "\n")
            else:
                width = actor_width([entry], width)
                sys.stdout.write(feed_line(entry, palette, width) + "\n")
            sys.stdout.flush()
    return EXIT_OK


# ---- a bead's history -----------------------------------------------------------------------------


async def _history(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    own = await history(nc, config, "bead", args.id)
    if not own:
        print(f"gt: no events for bead {args.id!r}", file=sys.stderr)
        return EXIT_REJECTED
    entries, missing = await bead_story(nc, config, args.id)
    if missing:
        print(
            f"gt: {', '.join(missing)} did not answer: the story lacks the sessions, merges or escalations they know",
            file=sys.stderr,
        )
    if args.json:
        render.print_json(entries)
    elif args.raw:
        print(render.history_lines(entries))
    else:
        print(timeline(entries, Palette(wanted(args.color, sys.stdout))))
    return EXIT_OK
