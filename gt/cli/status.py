"""``gt status``: asks every service at once and prints the town at a glance (``town_view``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gt.cli import costs, identity, render, town_view
from gt.cli.client import stream_last_seq
from gt.cli.colour import COLOR_CHOICES, Palette, wanted
from gt.cli.common import EXIT_OK, EXIT_REJECTED, Subcommands, UsageError
from shared.bus import streams
from shared.bus.errors import BusError
from shared.bus.kv import Bucket
from shared.bus.query import ask_json, reply_of
from shared.core import subjects
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.model import heartbeats
from shared.model.queries import Query, Status, deacon, mayor, refinery, witness

if TYPE_CHECKING:
    from shared.bus.connection import Connection

QUERY_TIMEOUT_S = 3.0
MAX_CONCURRENT_QUERIES = 16


def register(sub: Subcommands) -> None:
    st = sub.add_parser("status", help="the town at a glance: services, rigs, polecats, merge queue, convoys")
    st.add_argument(
        "--all", action="store_true", help="removed rigs and superseded merge requests too (hidden by default)"
    )
    st.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    st.add_argument("--color", choices=COLOR_CHOICES, default="auto", help="colour (default: on a terminal)")
    st.set_defaults(handler=_status)


async def _answer(nc: Connection, query: Query[Any]) -> Any:
    """The service's answer as it came (the snapshot is printed as it is with --json), or None when it is down,
    slow or refuses (the section says so)."""
    try:
        return await ask_json(nc, query, timeout=QUERY_TIMEOUT_S)
    except QueryError:
        return None


async def _heartbeats(nc: Connection, config: TownConfig, sessions: list[str]) -> dict[str, str]:
    if identity.command_origin() is not None or not sessions:
        return {}  # an agent (a session, the mayor agent) may not read the town's heartbeats
    # Read key by key with direct gets, without asking for the bucket's info first (a round trip, for nothing
    # `gt status` shows); a bucket that is not there answers each read with an error, and shows no heartbeats.
    kv = Bucket(nc, config.heartbeat_bucket, keys_only=True)
    found: dict[str, str] = {}
    for session in sessions:
        try:
            entry = await kv.get(session)
        except (BusError, TimeoutError):
            break  # NATS or the bucket fails: the same for the next key
        if entry is None:
            continue
        beat = heartbeats.decode_agent(entry.value)
        if beat is not None:
            found[session] = beat.ts.isoformat()
    return found


async def _current_steps(nc: Connection, beads: list[str]) -> dict[str, str | None]:
    limit = asyncio.Semaphore(MAX_CONCURRENT_QUERIES)

    async def one(bead: str) -> str | None:
        async with limit:
            molecule = await _answer(nc, mayor.Molecule(bead=bead))
        return molecule.get("current_step") if isinstance(molecule, dict) else None

    steps = await asyncio.gather(*(one(b) for b in beads))
    return dict(zip(beads, steps, strict=True))


async def _last_seq(nc: Connection, config: TownConfig) -> int | None:
    """The log's last sequence; None when it cannot be read now; ``town_view.LOG_MISSING`` when the town has no
    log any more (the services then refuse to start: docs/failure-behaviour.md, "The log lost")."""
    try:
        return await stream_last_seq(nc, config)
    except (BusError, TimeoutError):
        pass
    try:
        return None if await streams.exists(nc, config.evt_stream) else town_view.LOG_MISSING
    except (BusError, TimeoutError):
        return None


async def gather(
    nc: Connection, config: TownConfig, now: datetime | None = None, *, show_all: bool = False
) -> dict[str, Any]:
    """The snapshot ``gt status`` shows: every service asked at once (and each gate runner the deacon knows), each part
    None when its service did not answer; removed rigs and superseded merge requests only with ``show_all``."""
    names = town_view.SERVICES

    async def sessions_then_theirs() -> tuple[Any, dict[str, str], dict[str, str | None]]:
        # Each session's heartbeat and current step, asked as soon as the sessions are known (not after the
        # slowest of the other answers).
        sessions = await _answer(nc, witness.Sessions())
        session_ids = [s["id"] for s in sessions or []]
        beads = sorted({s["bead"] for s in sessions or []})
        heartbeats, steps = await asyncio.gather(_heartbeats(nc, config, session_ids), _current_steps(nc, beads))
        return sessions, heartbeats, steps

    async def runners_then_theirs() -> tuple[list[str], list[Any]]:
        # The gate runners the deacon knows (not those that stopped cleanly), each asked on its own.
        liveness = await _answer(nc, deacon.Services())
        found = [
            str(s["service"])
            for s in liveness or []
            if subjects.is_runner_scope(str(s.get("service", ""))) and s.get("status") != "stopped"
        ]
        runners = sorted(found, key=lambda name: (len(name), name))
        return runners, list(await asyncio.gather(*(_answer(nc, Status(service=name)) for name in runners)))

    (
        last,
        statuses,
        (runners, runner_statuses),
        rigs,
        (sessions, heartbeats, steps),
        mrs,
        paused,
        convoys,
        escalations,
        rig_costs,
    ) = await asyncio.gather(
        _last_seq(nc, config),
        asyncio.gather(*(_answer(nc, Status(service=name)) for name in names)),
        runners_then_theirs(),
        _answer(nc, witness.Rigs(all=show_all)),
        sessions_then_theirs(),
        _answer(nc, refinery.Mrs()),
        _answer(nc, refinery.PausedQueues()),
        _answer(nc, mayor.Convoys()),
        _answer(nc, mayor.Escalations()),
        _answer(nc, mayor.Costs(by="rig")),
    )
    return town_view.snapshot(
        now=now or datetime.now(UTC),
        stream_last_seq=last,
        statuses={**dict(zip(names, statuses, strict=True)), **dict(zip(runners, runner_statuses, strict=True))},
        runners=runners,
        rigs=rigs,
        sessions=sessions,
        heartbeats=heartbeats,
        steps=steps,
        mrs=mrs,
        paused=paused,
        convoys=convoys,
        escalations=escalations,
        costs=rig_costs_priced(rig_costs),
        show_all=show_all,
    )


def rig_costs_priced(rows: list[dict[str, Any]] | None) -> dict[str, costs.CostLine] | None:
    """Rig -> its tokens and cost (``gt costs --by rig``), from the mayor's answer as it came; None when the mayor
    did not answer. A price table that does not parse prices nothing here (``gt costs`` says what is wrong with
    it)."""
    if rows is None:
        return None
    try:
        prices = costs.load_prices()
    except UsageError:
        prices = {}
    return {row.key: row for row in costs.priced(reply_of(mayor.Costs(by="rig"), rows), prices).rows}


async def _status(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    snap = await gather(nc, config, show_all=args.all)
    if args.json:
        render.print_json(snap)
    else:
        print(town_view.render(snap, Palette(wanted(args.color, sys.stdout))))
    # Exit 1 when a service does not answer: scripts can tell a healthy town from a degraded one.
    degraded = any(s["state"] == "not answering" for s in snap["services"].values())
    return EXIT_REJECTED if degraded else EXIT_OK
