"""`gt formula ...`, `gt sling`, `gt mol status`, `gt step ...`."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from gt.cli import crew, render, rigs
from gt.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    key_values,
    read,
    send,
    show_reply,
)
from shared.core.arguments import from_args
from shared.core.config import TownConfig
from shared.model.commands import BeadSling, StepDone, StepStart
from shared.model.queries import mayor
from shared.model.results import SlingResult, StepResult
from shared.model.runtimes import RUNTIMES

if TYPE_CHECKING:
    from shared.bus.connection import Connection

STEP_VERBS: dict[str, type[StepStart | StepDone]] = {"start": StepStart, "done": StepDone}
"""`gt step <verb>` -> the command it sends."""


def register(sub: Subcommands) -> None:
    formula = sub.group("formula", "formulas: list, show", "formula_cmd")
    fl = formula.query("list", _formula_list, help="the formulas the mayor finds (built-in, the town's, the rig's)")
    fl.add_argument("--rig", help="include this rig's formulas")
    fs = formula.query("show", _formula_show, help="a formula's vars and steps (cooked, with --var)")
    fs.add_argument("name")
    fs.add_argument("--rig")
    fs.add_argument("--var", action="append", metavar="KEY=VALUE", help="cook with this var (repeatable)")

    sl = sub.command("sling", _sling, help="hook a bead to a rig with a molecule cooked from a formula")
    sl.add_argument("bead")
    sl.add_argument("rig")
    sl.add_argument("--formula", "-f", help="default: polecat-work")
    sl.add_argument("--var", action="append", metavar="KEY=VALUE", help="a formula var (repeatable)")
    sl.add_argument(
        "--hold",
        action="store_true",
        help="a bead with open blockers is held, and the mayor slings it once they are closed (else refused)",
    )
    sl.add_argument("--no-formula", action="store_true", help="hook the bead without a molecule")
    sl.add_argument("--no-convoy", action="store_true", help="do not create the auto-convoy")
    sl.add_argument("--owned", action="store_true", help="the auto-convoy closes only when landed")
    sl.add_argument(
        "--force",
        action="store_true",
        help="re-sling a hooked bead (keeps its done steps), or sling a bead past its open blockers (recorded)",
    )
    sl.add_argument(
        "--agent",
        metavar="RUNTIME",
        help=f"the agent runtime every session of this bead runs instead of the rig's ({', '.join(sorted(RUNTIMES))}); "
        "the bead keeps it for its respawns, rework and later slings",
    )
    sl.add_argument(
        "--crew",
        metavar="NAME",
        help="hook it to the rig's crew member NAME first: its sessions run in that member's workspace (docs/crew.md)",
    )
    rigs.register_unsling(sub)

    mol = sub.group("mol", "molecules: status", "mol_cmd")
    ms = mol.query("status", _mol_status, help="a bead's steps, which are done and which is current")
    ms.add_argument("bead")

    step = sub.group("step", "molecule steps: start, done", "step_cmd")
    for verb, text in (("start", "pending -> in_progress"), ("done", "-> done, for good")):
        p = step.command(verb, _step, help=text, step_verb=verb)
        p.add_argument("ids", nargs="+", metavar="[BEAD] STEP", help="the bead defaults to GT_BEAD (in a session)")


async def _formula_list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Formulas(rig=args.rig or None)
    return show_reply(args, query, await read(nc, config, query), render.formula_table)


async def _formula_show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Formula(name=args.name, vars=key_values(args.var, "--var"), rig=args.rig or None)
    return show_reply(args, query, await read(nc, config, query), render.formula_detail)


def _sling_line(result: SlingResult) -> str:
    where = "for" if result.status == "held" else "on"
    changed = "" if result.changed else " (unchanged)"
    parts = [f"{result.id}: {result.status}{changed} {where} {result.rig}"]
    if result.formula:
        parts.append(f"molecule {result.formula}")
    if result.convoy:
        parts.append(f"convoy {result.convoy}")
    if result.ignored_blockers:
        parts.append(f"forced past open blockers: {', '.join(result.ignored_blockers)}")
    if result.waiting_for:
        parts.append(f"waiting for {', '.join(result.waiting_for)}")
    if result.agent:
        parts.append(f"agent {result.agent}")
    if result.parked:
        parts.append(f"rig parked: it waits for `gt rig unpark {result.rig}`")
    return ", ".join(parts)


async def _sling(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    if args.crew is not None and (code := await crew.hook(nc, args, config, args.rig, args.crew, args.bead)) != EXIT_OK:
        return code
    cmd = from_args(BeadSling, args, id=args.bead, vars=key_values(args.var, "--var"))
    return await send(nc, args, config, cmd, _sling_line)


async def _mol_status(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = mayor.Molecule(bead=args.bead)
    return show_reply(args, query, await read(nc, config, query), render.molecule_status)


def _step_line(result: StepResult) -> str:
    changed = "" if result.changed else " (unchanged)"
    complete = ", molecule complete" if result.complete else ""
    progress = f"{result.done}/{result.total} done"
    return f"{result.bead} {result.step}: {result.status}{changed} ({progress}{complete})"


def _bead_and_step(ids: list[str]) -> tuple[str, str]:
    if len(ids) == 2:
        return ids[0], ids[1]
    if len(ids) == 1:
        bead = os.environ.get("GT_BEAD")
        if not bead:
            raise UsageError("name the bead: `gt step done BEAD STEP` (GT_BEAD is set only inside a session)")
        return bead, ids[0]
    raise UsageError(f"`gt step` takes [BEAD] STEP, got {len(ids)} arguments")


async def _step(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    bead, step = _bead_and_step(args.ids)
    return await send(nc, args, config, STEP_VERBS[args.step_verb](bead=bead, step=step), _step_line)
