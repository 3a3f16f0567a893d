"""``gt seance BEAD|SESSION``: the story of a bead's sessions, one after another, from what the town recorded: when
each ran, how it ended (its warrant and the last lines its pane showed, its handoff note), the steps done while it
ran, what it used, and the last entries of its runtime's transcript (what the agent said and did last, recorded when
the witness cleaned it up: Claude Code and Codex CLI keep one).

An agent runs it from inside its session for its own bead (the witness answers a session about its own bead only):
what its predecessors did and why they ended, beyond the few lines ``gt prime`` gives."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING

import msgspec

from gt.cli import render
from gt.cli.client import read_position
from gt.cli.common import EXIT_OK, Subcommands, read_typed
from gt.narration import pane_lines
from shared.core.errors import QueryError
from shared.core.terminal import escape_line
from shared.model.molecules import MoleculeView
from shared.model.queries import mayor, witness
from shared.model.sessions import SessionView
from shared.model.usage import CostRow, ModelUsage

if TYPE_CHECKING:
    from shared.bus.connection import Connection
    from shared.core.config import TownConfig

SHOWN_PANE_LINES = 12


class SeanceSession(msgspec.Struct, kw_only=True):
    """One of the bead's sessions as a seance tells it."""

    session: SessionView
    steps_done: list[str] = []
    """Steps of the bead done while it ran (their ``done_at`` between its request and its end), in order."""
    usage: list[ModelUsage] = []


class Seance(msgspec.Struct, kw_only=True):
    bead: str
    sessions: list[SeanceSession]
    molecule: MoleculeView | None = None
    unread: list[str] = []
    """What could not be read, and why (a service down, or not an agent's to read): its part is missing."""


def register(sub: Subcommands) -> None:
    s = sub.query(
        "seance",
        _seance,
        help="a bead's sessions, earlier ones included: how each ended, its steps, usage and last words",
    )
    s.add_argument("target", metavar="BEAD|SESSION", help="a bead, or one of its sessions")


async def _seance(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    found = await gather(nc, config, args.target)
    if args.json:
        render.print_json(msgspec.to_builtins(found))
    else:
        print(seance_text(found))
    return EXIT_OK


async def gather(nc: Connection, config: TownConfig, target: str) -> Seance:
    """The seance of ``target`` (a bead, or a session: its bead's); QueryError ``not_found`` when neither has one."""
    position = await read_position(nc, config)
    refused: QueryError | None = None
    try:
        sessions = await read_typed(nc, config, witness.Sessions(bead=target, all=True), min_seq=position)
    except QueryError as exc:
        if exc.code != "unauthorized":
            raise
        sessions, refused = [], exc  # an agent asking of a bead not its own, or naming its session
    bead = target
    if not sessions:
        try:
            asked = await read_typed(nc, config, witness.Session(id=target), min_seq=position)
        except QueryError as exc:
            if refused is not None:
                raise refused from None
            if exc.code != "not_found":
                raise
            raise QueryError(
                "not_found", f"no bead or session {target!r} has a session (`gt session list --all` shows them)"
            ) from None
        bead = asked.bead
        sessions = await read_typed(nc, config, witness.Sessions(bead=bead, all=True), min_seq=position)
    unread: list[str] = []
    molecule: MoleculeView | None = None
    rows: list[CostRow] = []
    try:
        molecule = await read_typed(nc, config, mayor.Molecule(bead=bead), min_seq=position)
    except QueryError as exc:
        if exc.code != "not_found":
            unread.append(f"steps: {exc.message}")
    try:
        rows = await read_typed(nc, config, mayor.Costs(by="session"), min_seq=position)
    except QueryError as exc:
        unread.append(f"usage: {exc.message}")
    return assemble(bead, sessions, molecule, rows, unread)


def assemble(
    bead: str, sessions: list[SessionView], molecule: MoleculeView | None, rows: list[CostRow], unread: list[str]
) -> Seance:
    """The seance from what the services answered. Pure."""
    usage = {row.key: row.models for row in rows}
    ordered = sorted(sessions, key=lambda s: (s.requested_at, s.attempt))
    told = []
    for session in ordered:
        told.append(
            SeanceSession(
                session=session,
                steps_done=_steps_during(molecule, session.requested_at, session.ended_at),
                usage=usage.get(session.id, []),
            )
        )
    return Seance(bead=bead, sessions=told, molecule=molecule, unread=unread)


def _steps_during(molecule: MoleculeView | None, began: datetime, ended: datetime | None) -> list[str]:
    if molecule is None:
        return []
    done = [
        (step.done_at, step.id)
        for step in molecule.steps
        if step.done_at is not None and step.done_at >= began and (ended is None or step.done_at <= ended)
    ]
    return [step for _at, step in sorted(done)]


def seance_text(seance: Seance) -> str:
    e = escape_line
    count = len(seance.sessions)
    head = f"bead {e(seance.bead)}: {count} session{'s' if count != 1 else ''}"
    if seance.molecule is not None:
        steps = seance.molecule.steps
        finished = sum(1 for s in steps if s.status == "done")
        head += f"; molecule {e(seance.molecule.formula)}, {finished}/{len(steps)} steps done"
    lines = [head]
    for told in seance.sessions:
        lines += ["", *_session_lines(told)]
    for missing in seance.unread:
        lines += ["", f"(not shown: {e(missing)})"]
    return "\n".join(lines)


def _session_lines(told: SeanceSession) -> list[str]:
    e = escape_line
    s = told.session
    agent = f", {e(s.agent)}" if s.agent else ""
    began = s.started_at or s.requested_at
    span = f"{_clock(began)} to {_clock(s.ended_at)}" if s.ended_at else f"since {_clock(began)}"
    lines = [f"session {e(s.id)}: attempt {s.attempt}, {e(s.rig)}/{e(s.polecat)}{agent}, {span}"]
    if s.status != "ended":
        lines.append(f"  {e(s.status)}: still running")
    else:
        ended = f"  ended: {e(s.end_reason or '?')}"
        if s.end_detail:
            ended += f" ({e(s.end_detail)})"
        lines.append(ended)
    if s.warrant_reason:
        detail = f" ({e(s.warrant_detail)})" if s.warrant_detail else ""
        lines.append(f"  warranted: {e(s.warrant_reason)}{detail}")
    if s.escalated:
        lines.append(f"  escalated: {e(s.escalated)}")
    lines.append(f"  steps done: {', '.join(e(step) for step in told.steps_done) or 'none'}")
    for model in told.usage:
        lines.append(
            f"  usage: {e(model.model)}: {model.input_tokens} in, {model.output_tokens} out,"
            f" {model.cache_read_input_tokens} cache read, {model.messages} messages"
        )
    shown = pane_lines(s.pane_tail, SHOWN_PANE_LINES)
    if shown:
        when = "it was warranted" if s.warrant_reason else "its pane was ended"
        lines += [f"  its pane's last lines when {when}:", *(f"    | {line}" for line in shown)]
    said = [e(line) for line in s.transcript_tail.splitlines() if line.strip()]
    if said:
        lines += ["  its transcript's last entries:", *(f"    | {line}" for line in said)]
    return lines


def _clock(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M:%S") if at is not None else "?"
