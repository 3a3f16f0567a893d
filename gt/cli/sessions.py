"""`gt session list|show` and `gt nudge` (the witness's): polecat sessions, and a message typed into one."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gt.cli import render
from gt.cli.client import first_event_of
from gt.cli.common import Subcommands, read, send, show_reply
from shared.core.config import TownConfig
from shared.model.commands import NudgeSend
from shared.model.queries import witness
from shared.model.results import NudgeResult
from shared.model.sessions import SessionView

if TYPE_CHECKING:
    from shared.bus.connection import Connection

NUDGE_ENDS = frozenset({"nudge.delivered", "nudge.expired"})
NUDGE_DELIVERY_WAIT_S = 20.0
"""How long `gt nudge` waits for the witness to type a nudge into a running session (it checks the text shows)."""


def register(sub: Subcommands) -> None:
    session = sub.group("session", "polecat sessions: list, show", "session_cmd")
    sl = session.query("list", _session_list, help="active sessions (--all: every one)")
    sl.add_argument("--rig")
    sl.add_argument("--bead")
    sl.add_argument("--all", action="store_true")
    ss = session.query("show", _session_show, help="one session")
    ss.add_argument("id")

    nudge = sub.command("nudge", _nudge, help="type a message into a polecat's pane (queued while it is not running)")
    nudge.add_argument("target", help="a session id or <rig>/<polecat>")
    nudge.add_argument("message")
    nudge.add_argument("--ttl", type=float, default=None, help="seconds it may wait for the session (default 1800)")


async def _session_list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = witness.Sessions(rig=args.rig or None, bead=args.bead or None, all=args.all)
    return show_reply(args, query, await read(nc, config, query), _session_table)


def _session_table(sessions: list[SessionView]) -> str:
    rows = [
        [
            s.id,
            f"{s.rig}/{s.polecat}",
            s.bead,
            s.status + (f" ({s.end_reason})" if s.end_reason else ""),
            str(s.pane_pid or "-"),
            s.tmux_name,
        ]
        for s in sessions
    ]
    return render.table(("SESSION", "POLECAT", "BEAD", "STATUS", "PID", "TMUX"), rows, "no sessions")


async def _session_show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = witness.Session(id=args.id)
    return show_reply(args, query, await read(nc, config, query), render.session_detail)


async def _nudge(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = NudgeSend(target=args.target, message=args.message, ttl_s=args.ttl)

    def line(result: NudgeResult) -> str:
        if result.status == "delivered":
            return f"nudge {result.id}: delivered to {result.delivered_to or None}"
        where = result.session or f"{result.rig or None}/{result.polecat or None}"
        return f"nudge {result.id}: queued for {where} (until {result.expires_at or None})"

    async def delivered(result: NudgeResult) -> None:
        """A running target gets it at once: wait for that (briefly), so the answer says what happened (added to
        the result, which ``--json`` prints)."""
        if result.live:
            event = await first_event_of(nc, config, "nudge", result.id, NUDGE_ENDS, NUDGE_DELIVERY_WAIT_S)
            if event is not None and event.type == "nudge.delivered":
                session = event.data.get("session")
                result.status, result.delivered_to = "delivered", session if isinstance(session, str) else None

    return await send(nc, args, config, cmd, line, before_report=delivered)
