"""`gt automation list|show|run`: the deacon's automations (files under $GT_HOME/automations)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from gt.cli import render
from gt.cli.common import Subcommands, command_options, read, read_options, send, show
from shared.core.config import TownConfig
from shared.model.commands import AutomationRun
from shared.model.queries import deacon
from shared.model.results import AutomationRunResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    group = sub.group("automation", "automations run by the deacon: list, show, run", "automation_cmd")

    ls = group.add_parser("list", help="every automation: gate, action, status, last and next run")
    read_options(ls)
    ls.set_defaults(handler=_list)

    sh = group.add_parser("show", help="one automation: its file, why it waits, its recent runs")
    sh.add_argument("name")
    read_options(sh)
    sh.set_defaults(handler=_show)

    run = group.add_parser("run", help="fire it now, whatever its gate (refused while a run is open)")
    run.add_argument("name")
    command_options(run)
    run.set_defaults(handler=_run)


def _short(value: str | None) -> str:
    return value.replace("T", " ")[:19] if value else "-"


def _gate(a: dict[str, Any]) -> str:
    gate = str(a.get("gate", "-"))
    if gate == "cooldown":
        return f"cooldown {a.get('interval_s', 0):g}s"
    if gate == "cron":
        return f"cron {a.get('schedule')}"
    if gate == "event":
        return f"event {a.get('on')}" + (f" {a['subject']}" if a.get("subject") else "")
    return gate


def _action(a: dict[str, Any]) -> str:
    if a.get("action") == "formula":
        return f"formula {a.get('formula')} -> {a.get('rig')}"
    if a.get("action") == "exec":
        return f"exec {a.get('exec', '')[:40]}"
    return "-"


def _last(a: dict[str, Any]) -> str:
    run = a.get("last_run")
    if not run:
        return "never"
    return f"{run['status']} {_short(run.get('ended_at') or run.get('fired_at'))}"


def table(automations: list[dict[str, Any]]) -> str:
    rows = [[a["name"], a["status"], _gate(a), _action(a), _last(a), _short(a.get("next_due"))] for a in automations]
    return render.table(
        ("NAME", "STATUS", "GATE", "ACTION", "LAST RUN", "NEXT"),
        rows,
        "no automations (put <name>.toml files in $GT_HOME/automations; docs/automations.md)",
    )


def detail(a: dict[str, Any]) -> str:
    lines = [f"{a['name']}: {a['status']}"]
    if a.get("error"):
        lines.append(f"  error:    {a['error']}")
    for label, key in (("file", "file"), ("about", "description"), ("waiting", "waiting")):
        if a.get(key):
            lines.append(f"  {label + ':':<9} {a[key]}")
    if a.get("gate"):
        lines.append(f"  gate:     {_gate(a)}")
        lines.append(f"  action:   {_action(a)}")
    if a.get("next_due"):
        lines.append(f"  next:     {_short(a['next_due'])}")
    if a.get("cursor"):
        lines.append(f"  cursor:   seq {a['cursor']}")
    lines.append(f"  runs:     {a.get('runs', 0)} ({a.get('completed', 0)} completed, {a.get('failed', 0)} failed)")
    if a.get("open_run"):
        run = a["open_run"]
        bead = f", bead {run['bead']}" if run.get("bead") else ""
        lines.append(f"  open:     {run['id']} since {_short(run['fired_at'])} ({run['gate']}: {run['reason']}){bead}")
    history = a.get("history") or []
    if history:
        lines += ["", "recent runs:"]
        rows = [
            [
                r["id"],
                r["status"],
                _short(r["fired_at"]),
                r["gate"],
                _first_line(r.get("error") or r.get("result") or ""),
            ]
            for r in history
        ]
        lines.append(render.table(("RUN", "STATUS", "FIRED", "GATE", "RESULT"), rows, ""))
    return "\n".join(lines)


def _first_line(text: str) -> str:
    return text.splitlines()[0][:60] if text else ""


async def _list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    found = await read(nc, config, deacon.Automations())
    return show(args, found, table)


async def _show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    found = await read(nc, config, deacon.Automation(name=args.name))
    return show(args, found, detail)


def _fired(result: AutomationRunResult) -> str:
    return f"{result.id}: run {result.run} fired ({result.action})"


async def _run(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return await send(nc, args, config, AutomationRun(name=args.name), _fired)
