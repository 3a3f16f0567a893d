"""`gt automation list|show|run`: the deacon's automations (files under $GT_HOME/automations)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gt.cli import render
from gt.cli.common import Subcommands, read, send, show_reply
from shared.core.config import TownConfig
from shared.model.commands import AutomationRun
from shared.model.queries import deacon
from shared.model.queries.deacon import AutomationView
from shared.model.results import AutomationRunResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    group = sub.group("automation", "automations run by the deacon: list, show, run", "automation_cmd")

    group.query("list", _list, help="every automation: gate, action, status, last and next run")

    sh = group.query("show", _show, help="one automation: its file, why it waits, its recent runs")
    sh.add_argument("name")

    run = group.command("run", _run, help="fire it now, whatever its gate (refused while a run is open)")
    run.add_argument("name")


def _short(value: str | None) -> str:
    return value.replace("T", " ")[:19] if value else "-"


def _gate(a: AutomationView) -> str:
    gate = a.gate or "-"
    if gate == "cooldown":
        return f"cooldown {a.interval_s or 0:g}s"
    if gate == "cron":
        return f"cron {a.schedule or None}"
    if gate == "event":
        return f"event {a.on or None}" + (f" {a.subject}" if a.subject else "")
    return gate


def _action(a: AutomationView) -> str:
    if a.action == "formula":
        return f"formula {a.formula or None} -> {a.rig or None}"
    if a.action == "exec":
        return f"exec {(a.exec or '')[:40]}"
    return "-"


def _last(a: AutomationView) -> str:
    run = a.last_run
    if run is None:
        return "never"
    return f"{run.status} {_short(run.ended_at or run.fired_at)}"


def table(automations: list[AutomationView]) -> str:
    rows = [[a.name, a.status, _gate(a), _action(a), _last(a), _short(a.next_due or None)] for a in automations]
    return render.table(
        ("NAME", "STATUS", "GATE", "ACTION", "LAST RUN", "NEXT"),
        rows,
        "no automations (put <name>.toml files in $GT_HOME/automations; docs/automations.md)",
    )


def detail(a: AutomationView) -> str:
    lines = [f"{a.name}: {a.status}"]
    if a.error:
        lines.append(f"  error:    {a.error}")
    for label, value in (("file", a.file), ("about", a.description), ("waiting", a.waiting)):
        if value:
            lines.append(f"  {label + ':':<9} {value}")
    if a.gate:
        lines.append(f"  gate:     {_gate(a)}")
        lines.append(f"  action:   {_action(a)}")
    if a.next_due:
        lines.append(f"  next:     {_short(a.next_due)}")
    if a.cursor:
        lines.append(f"  cursor:   seq {a.cursor}")
    lines.append(f"  runs:     {a.runs} ({a.completed} completed, {a.failed} failed)")
    if (run := a.open_run) is not None:
        bead = f", bead {run.bead}" if run.bead else ""
        lines.append(f"  open:     {run.id} since {_short(run.fired_at)} ({run.gate}: {run.reason}){bead}")
    history = a.history or []
    if history:
        lines += ["", "recent runs:"]
        rows = [[r.id, r.status, _short(r.fired_at), r.gate, _first_line(r.error or r.result or "")] for r in history]
        lines.append(render.table(("RUN", "STATUS", "FIRED", "GATE", "RESULT"), rows, ""))
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.splitlines()[0][:60] if text else ""


async def _list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = deacon.Automations()
    return show_reply(args, query, await read(nc, config, query), table)


async def _show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = deacon.Automation(name=args.name)
    return show_reply(args, query, await read(nc, config, query), detail)


def _fired(result: AutomationRunResult) -> str:
    return f"{result.id}: run {result.run} fired ({result.action})"


async def _run(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, AutomationRun(name=args.name), _fired)
