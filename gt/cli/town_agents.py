"""`gt mayor start|stop|ask|attach|prime`: the mayor agent, an AI session the operator talks to (docs/mayor-agent.md).

The witness supervises it (``gt.cmd.agent.*``); inside it, `gt prime` (and its runtime's start hook) shows the town
and the commands it may use, and every `gt` it runs sends on its own subjects, recorded as ``agent:mayor``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import TYPE_CHECKING

import msgspec

from gt.cli import client
from gt.cli.client import read_position
from gt.cli.common import EXIT_OK, EXIT_REJECTED, Subcommands, UsageError, read_typed, send, show
from gt.town.sessions import tmux_socket
from shared.core import subjects
from shared.core.config import TownConfig
from shared.core.terminal import escape_line
from shared.model.beads import Bead
from shared.model.commands import TownAgentAsk, TownAgentStart, TownAgentStop
from shared.model.convoys import ConvoyView
from shared.model.escalations import Escalation
from shared.model.queries import mayor, witness
from shared.model.results import TownAgentResult
from shared.model.rigs import RigView
from shared.model.session_identity import TOWN_AGENT_COMMANDS

if TYPE_CHECKING:
    from shared.bus.connection import Connection

MAYOR = "mayor"
ANSWERED = frozenset({"town_agent.answered"})
PRIME_LIST = 20
"""How many of each (ready beads, convoys, escalations, messages) `gt prime` shows the mayor agent."""


def register(sub: Subcommands) -> None:
    group = sub.group(
        "mayor", "the mayor agent: an AI session you talk to, acting with an operator's commands", "mayor_cmd"
    )
    start = group.command("start", _start, help="run the mayor agent (the witness keeps its session alive)")
    start.add_argument("--agent", default="", help="its runtime: claude (default) or codex")
    group.command("stop", _stop, help="end the mayor agent's session; it is not restarted")
    ask = group.command(
        "ask",
        _ask,
        help="a request for the mayor agent (queued while it works); with --wait, print its answer",
    )
    ask.add_argument("text", help="what you want, on one line")
    attach = group.add_parser("attach", help="attach to the mayor agent's tmux session (detach: Ctrl-b d)")
    attach.set_defaults(handler=None, precheck=_attach)
    group.query("prime", _prime, help="(the mayor agent) the town and the commands it may use")


async def _start(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    def line(result: TownAgentResult) -> str:
        if not result.changed:
            return f"the mayor agent runs already ({result.agent or 'its runtime'}); `gt mayor attach` shows it"
        return f"mayor agent started ({result.agent or 'claude'}): `gt mayor ask TEXT` talks to it"

    return await send(nc, args, config, TownAgentStart(name=MAYOR, agent=args.agent), line)


async def _stop(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    def line(result: TownAgentResult) -> str:
        return "the mayor agent was not running" if not result.changed else "mayor agent stopped"

    return await send(nc, args, config, TownAgentStop(name=MAYOR), line)


async def _ask(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    asked: list[str] = []

    def line(result: TownAgentResult) -> str:
        return f"asked ({result.ask_id or None}): typed in when the mayor agent is at its prompt"

    async def remember(result: TownAgentResult) -> None:
        if isinstance(result.ask_id, str):
            asked.append(result.ask_id)

    code = await send(nc, args, config, TownAgentAsk(name=MAYOR, text=args.text), line, before_report=remember)
    if code != EXIT_OK or not args.wait or not asked:
        return code
    ask_id = asked[0]
    timeout = args.timeout if args.timeout is not None else None
    event = await client.first_event_of(
        nc, config, "agent", MAYOR, ANSWERED, timeout, where=lambda entry: entry.data.get("ask_id") == ask_id
    )
    if event is None:
        print(f"gt mayor ask: no answer within {timeout or 0:g} s; it is logged when it comes", file=sys.stderr)
        return EXIT_REJECTED
    print(str(event.data.get("text", "")))
    return EXIT_OK


def _attach(args: argparse.Namespace) -> None:
    """Become `tmux attach` to the mayor agent's session, on the witness's tmux server (``GT_TMUX_SOCKET``)."""
    tmux = shutil.which("tmux")
    if tmux is None:
        raise UsageError("`gt mayor attach` needs tmux on this machine (the mayor agent runs where the witness runs)")
    session = subjects.town_agent_tmux_name(MAYOR)
    os.execv(tmux, [tmux, "-L", tmux_socket(), "attach", "-t", session])  # noqa: S606 - tmux, as found


# ---- the mayor agent's prime ----------------------------------------------------------------------


class TownPrime(msgspec.Struct, kw_only=True):
    """What `gt prime` shows the mayor agent: the town as of now."""

    rigs: list[RigView]
    convoys: list[ConvoyView]
    ready: list[Bead]
    escalations: list[Escalation]
    mail: list[Bead]


async def town_prime(nc: Connection, config: TownConfig) -> TownPrime:
    last = await read_position(nc, config)
    return TownPrime(
        rigs=await read_typed(nc, config, witness.Rigs(), min_seq=last),
        convoys=await read_typed(nc, config, mayor.Convoys(limit=PRIME_LIST), min_seq=last),
        ready=await read_typed(nc, config, mayor.Ready(limit=PRIME_LIST), min_seq=last),
        escalations=await read_typed(nc, config, mayor.Escalations(limit=PRIME_LIST), min_seq=last),
        mail=await read_typed(nc, config, mayor.Inbox(to=MAYOR, limit=PRIME_LIST), min_seq=last),
    )


COMMAND_LINES = {
    ("bead", "create"): 'gt bead create "TITLE" --rig RIG -d "WHAT AND WHY" [--needs BEAD] (prints the new id)',
    ("bead", "update"): 'gt bead update BEAD [--title "TITLE"] [--description "TEXT"] [--priority N]',
    ("bead", "close"): 'gt bead close BEAD --reason "WHY"',
    ("bead", "sling"): "gt sling BEAD RIG [--hold]   (a polecat works it; --hold waits for its blockers)",
    ("bead", "unsling"): "gt unsling BEAD",
    ("convoy", "create"): 'gt convoy create "TITLE" BEAD...   then   gt convoy sling CONVOY RIG',
    ("convoy", "add"): "gt convoy add CONVOY BEAD...",
    ("mail", "send"): 'gt mail send TO --subject "SUBJECT" --body "BODY"   (TO: operator, polecat:RIG/NAME, rig:RIG)',
    ("mail", "reply"): 'gt mail reply MESSAGE --body "BODY"',
    ("mail", "read"): "gt mail read MESSAGE",
    ("mail", "archive"): "gt mail archive MESSAGE",
    ("escalation", "raise"): 'gt escalate "WHAT A PERSON MUST DECIDE" [--severity high] [--bead BEAD]',
    ("escalation", "ack"): "gt escalation ack ESCALATION",
    ("nudge", "send"): 'gt nudge RIG/POLECAT "ONE LINE"',
}
"""How the mayor agent sends each of its commands (``TOWN_AGENT_COMMANDS``)."""


def town_prime_text(data: TownPrime) -> str:
    e = escape_line
    out = [
        "[gastown] You are the mayor agent: the operator's front door to this town. The operator asks in plain words;",
        "you turn a request into beads (work items), convoys (beads tracked together) and slings (a bead given to a",
        "rig, where a polecat agent works it and the merge queue merges it). Everything you do is recorded as",
        "agent:mayor. Check what exists before you file anything (a request may come again after a restart).",
        "Reading: gt bead list, gt bead show BEAD, gt ready, gt convoy list, gt convoy status CONVOY, gt rig list,",
        "gt mq list, gt escalation list, gt mail inbox mayor, gt status.",
        "What you may do:",
        *(f"  {COMMAND_LINES.get(pair, ' '.join(pair))}" for pair in TOWN_AGENT_COMMANDS),
        "You may not add or change rigs, approve gates, decide the merge queue or stop sessions: say what a person",
        "should do instead. Answer each request in a few lines: what you filed, slung or found.",
        "",
        "Rigs:",
    ]
    out += [
        f"  {e(r.name)}: {e(r.agent_command)}{' (parked)' if r.parked else ''}, {r.active_sessions} working, "
        f"{r.waiting_beads} waiting"
        for r in data.rigs
    ] or ["  (none: a person adds one with `gt rig add`)"]
    out.append("Open convoys:")
    out += [f"  {c.id} {e(c.title)} ({c.closed}/{c.total} closed)" for c in data.convoys] or ["  (none)"]
    out.append("Ready beads (open, nothing blocks them):")
    out += [f"  {b.id} {e(b.title)}{f' [{e(b.rig)}]' if b.rig else ''}" for b in data.ready] or ["  (none)"]
    out.append("Open escalations:")
    out += [f"  {x.id} [{x.severity}] {e(x.message)[:160]}" for x in data.escalations] or ["  (none)"]
    out.append("Unread mail to mayor:")
    out += [f"  {m.id} from {e(m.metadata.get('from', '?'))}: {e(m.title)}" for m in data.mail] or ["  (none)"]
    return "\n".join(out)


async def _prime(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    return show(args, await town_prime(nc, config), town_prime_text)


def is_town_agent() -> bool:
    """This process runs in a town agent's session (``GT_TOWN_AGENT``)."""
    return bool(os.environ.get(subjects.TOWN_AGENT_ENV))
