"""`gt gate list|approve`: molecule gates (a formula step's ``wait``) not opened yet, and opening one by hand."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gt.cli import render
from gt.cli.common import Subcommands, read, send, show
from shared.bus.query import ask, reply_of
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.core.terminal import escape_line
from shared.model import gates
from shared.model.commands import GateApprove
from shared.model.events import CiGate
from shared.model.gates import GateView
from shared.model.queries import deacon, mayor
from shared.model.queries.deacon import GateCheckView
from shared.model.results import GateResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection

DEACON_QUERY_TIMEOUT_S = 3.0


def register(sub: Subcommands) -> None:
    gate = sub.group("gate", "molecule gates: list the closed ones, approve one", "gate_cmd")
    ls = gate.query("list", _list, help="gates not opened yet (waiting ones first), with a CI gate's last check")
    ls.add_argument("--rig", help="only beads of this rig")
    ls.add_argument("--bead", help="only this bead")
    a = gate.command("approve", _approve, help="open a step's gate (a human gate's answer, or any gate early)")
    a.add_argument("bead")
    a.add_argument("step")
    a.add_argument("--note", default="", help="what you decided: the next session of the bead reads it")


async def _approve(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    def line(result: GateResult) -> str:
        if not result.changed:
            return f"the gate of step {result.step} of {result.bead} was open already ({result.by or 'opened'})"
        return f"gate of step {result.step} of {result.bead} opened: a fresh session continues the bead"

    return await send(nc, args, config, GateApprove(bead=args.bead, step=args.step, note=args.note), line)


async def _list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Gates(rig=args.rig, bead=args.bead)
    answer = await read(nc, config, query)
    checks = await _last_checks(nc)
    return show(args, answer, lambda _: gate_table(reply_of(query, answer), checks))


async def _last_checks(nc: Connection) -> dict[tuple[str, str], GateCheckView]:
    """The deacon's last run of each CI gate's check; nothing when it does not answer (the list is shown without)."""
    try:
        return {(c.bead, c.step): c for c in await ask(nc, deacon.GateChecks(), timeout=DEACON_QUERY_TIMEOUT_S)}
    except QueryError:
        return {}


def gate_table(views: list[GateView], checks: dict[tuple[str, str], GateCheckView]) -> str:
    e = escape_line
    rows = []
    for view in views:
        state = "waiting" if view.waiting else "later"
        if view.opens_at is not None:
            state += f", opens {view.opens_at:%Y-%m-%d %H:%M:%S} UTC"
        what = gates.describe(view.gate)
        check = checks.get((view.bead, view.step))
        if isinstance(view.gate, CiGate) and check is not None:
            tail = check.output.strip().splitlines()[-1:] if check.output.strip() else []
            said = f": {tail[0][:80]}" if tail else ""
            what += f"; last check {check.started_at:%H:%M:%S} exit {check.exit_code}{said}"
        rows.append((view.bead, view.step, state, e(what)))
    return render.table(("BEAD", "STEP", "STATE", "GATE"), rows, "(no gate is closed)")
