"""The ``gt`` command.

Exit codes: 0 done (command accepted, or durably stored while its service is down), 1 rejected or not
found, 2 usage error, 3 NATS unreachable (or the answering service is not running).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from shared import config as town_config
from shared import logging as gt_logging
from shared.bus.connection import connect
from shared.bus.topology import owner_of, provision
from shared.cli import render
from shared.cli.client import Outcome, history, query, send_command, stream_last_seq
from shared.config import TownConfig
from shared.errors import AppendFailedError, GastownError, NatsUnavailableError, QueryError, StreamConfigMismatchError

EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
DEFAULT_COMMAND_TIMEOUT_S = 10.0
SERVICES = ("mayor", "witness", "refinery", "deacon")


class UsageError(GastownError):
    """The command line asks for something that cannot be done as written."""


def _meta(pairs: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--meta takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


class _Sub:
    """Adds the common options (``--nats-url``) to every subcommand, so they work before or after it."""

    def __init__(self, action: Any, common: argparse.ArgumentParser) -> None:
        self._action = action
        self._common = common

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._action.add_parser(name, parents=[self._common], **kwargs)
        return parser


def _command_opts(x: argparse.ArgumentParser) -> None:
    x.add_argument("--wait", action="store_true", help="wait for the outcome, also while the service is down")
    x.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for the outcome (default {DEFAULT_COMMAND_TIMEOUT_S:g}; with --wait: forever)",
    )
    x.add_argument("--json", action="store_true", help="print the outcome as JSON")
    x.add_argument("--actor", help="who is acting (default: operator)")
    x.add_argument("--id", dest="cmd_id", metavar="CMD_ID", help="command id (resending the same id is harmless)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", default=argparse.SUPPRESS, help="NATS server URL(s) (env NATS_URL)")
    p = argparse.ArgumentParser(prog="gt", description="Operate a gastown-nats town.", parents=[common])
    sub = _Sub(p.add_subparsers(dest="cmd", required=True, metavar="COMMAND"), common)

    sub.add_parser("init", help="create the streams and consumers (idempotent)")

    up = sub.add_parser("up", help="start an embedded NATS server (unless NATS_URL is set) and the services")
    up.add_argument("--detach", "-d", action="store_true", help="run in the background and return once ready")
    up.add_argument("--port", type=int, default=int(os.environ.get("GT_NATS_PORT", "4222")))
    up.add_argument("--services", default=",".join(SERVICES), help="comma-separated services to run")
    sub.add_parser("down", help="stop what `gt up` started (services in reverse order, then NATS)")

    bead = sub.add_parser("bead", help="beads: create, show, list, update, claim, close, history")
    bsub = _Sub(bead.add_subparsers(dest="bead_cmd", required=True, metavar="VERB"), common)

    c = bsub.add_parser("create", help="file a new bead")
    c.add_argument("title")
    c.add_argument("--type", "-t")
    c.add_argument("--priority", "-p", type=int)
    c.add_argument("--description", "-d")
    c.add_argument("--label", "-l", action="append", dest="labels")
    c.add_argument("--meta", action="append", metavar="KEY=VALUE")
    c.add_argument("--parent")
    c.add_argument("--needs", action="append", help="a blocking dependency (repeatable)")
    c.add_argument("--assignee")
    c.add_argument("--prefix", help="id prefix (default hq)")
    _command_opts(c)

    s = bsub.add_parser("show", help="one bead")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")

    ls = bsub.add_parser("list", help="beads in creation order (closed ones only with --all or --status closed)")
    for flag in ("--status", "--type", "--label", "--assignee", "--parent"):
        ls.add_argument(flag)
    ls.add_argument("--all", action="store_true", help="include closed beads")
    ls.add_argument("--limit", type=int, default=1000, help="at most this many (0: all)")
    ls.add_argument("--json", action="store_true")

    u = bsub.add_parser("update", help="change a bead's fields")
    u.add_argument("id")
    u.add_argument("--title")
    u.add_argument("--type", "-t")
    u.add_argument("--priority", "-p", type=int)
    u.add_argument("--description", "-d")
    u.add_argument("--assignee")
    u.add_argument("--parent")
    u.add_argument("--label", "-l", action="append", dest="labels", help="add a label")
    u.add_argument("--remove-label", action="append", dest="remove_labels")
    u.add_argument("--meta", action="append", metavar="KEY=VALUE", help="set metadata (merged)")
    u.add_argument("--needs", action="append", help="add a blocking dependency")
    u.add_argument("--status", help="state the status (moving backward is refused)")
    _command_opts(u)

    cl = bsub.add_parser("claim", help="take a bead: open/hooked -> in_progress")
    cl.add_argument("id")
    cl.add_argument("--assignee", "-a", required=True)
    _command_opts(cl)

    x = bsub.add_parser("close", help="close a bead (closing a closed bead changes nothing)")
    x.add_argument("id")
    x.add_argument("--reason", "-r", default="")
    _command_opts(x)

    h = bsub.add_parser("history", help="the bead's events, from the log")
    h.add_argument("id")
    h.add_argument("--json", action="store_true")

    r = sub.add_parser("ready", help="open beads with no open blocker")
    r.add_argument("--limit", type=int, default=1000, help="at most this many (0: all)")
    r.add_argument("--json", action="store_true")

    sub.add_parser("schema", help="JSON Schema of every command and event")

    st = sub.add_parser("health", help="exit 0 when the service is connected and caught up with the log")
    st.add_argument("service", nargs="?", default="mayor", choices=SERVICES)
    st.add_argument("--json", action="store_true")
    return p


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None and v != []}


def bead_command_body(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The subject and JSON body a ``gt bead <verb>`` command line stands for."""
    verb = args.bead_cmd
    common = {"actor": args.actor, "cmd_id": args.cmd_id}
    if verb == "create":
        body = {
            "title": args.title,
            "type": args.type,
            "priority": args.priority,
            "description": args.description,
            "labels": args.labels,
            "metadata": _meta(args.meta) or None,
            "parent": args.parent,
            "needs": args.needs,
            "assignee": args.assignee,
            "prefix": args.prefix,
        }
    elif verb == "update":
        body = {
            "id": args.id,
            "title": args.title,
            "type": args.type,
            "priority": args.priority,
            "description": args.description,
            "assignee": args.assignee,
            "parent": args.parent,
            "labels": args.labels,
            "remove_labels": args.remove_labels,
            "metadata": _meta(args.meta) or None,
            "needs": args.needs,
            "status": args.status,
        }
    elif verb == "claim":
        body = {"id": args.id, "assignee": args.assignee}
    else:
        body = {"id": args.id, "reason": args.reason}
    return f"gt.cmd.bead.{verb}", _drop_none({**common, **body})


def report_outcome(outcome: Outcome, subject: str, *, as_json: bool) -> int:
    """Print what became of a command and return the exit code."""
    if as_json:
        render.print_json(outcome)
    if outcome.type is None:
        owner = owner_of(subject)
        if not as_json:
            why = "is not running" if outcome.service_down else "has not answered yet"
            print(
                f"stored: command {outcome.command_id} is durably queued (GT_CMD #{outcome.stored_seq}); "
                f"the {owner} {why} and will answer it when it can. `--wait` waits for the outcome."
            )
        return EXIT_OK
    if outcome.type == "cmd.rejected":
        if not as_json:
            print(f"rejected ({outcome.data.get('code')}): {outcome.data.get('message')}", file=sys.stderr)
        return EXIT_REJECTED
    if not as_json:
        result = outcome.data.get("result", {})
        if subject.endswith(".create"):
            print(result.get("id"))
        else:
            changed = "" if result.get("changed", True) else " (unchanged)"
            print(f"{result.get('id')}: {result.get('status')}{changed}")
    return EXIT_OK


async def _read(nc: Client, config: TownConfig, service: str, what: str, body: dict[str, Any]) -> Any:
    # Read-your-writes: the service answers once it has applied everything stored so far.
    body = {**body, "min_seq": await stream_last_seq(nc, config)}
    return await query(nc, service, what, body)


async def _init(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    report = await provision(nc.jetstream(), config)
    for name in report.created:
        print(f"created  {name}")
    for name in report.existing:
        print(f"exists   {name}")
    return EXIT_OK


async def _bead_command(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    subject, body = bead_command_body(args)
    timeout = args.timeout
    if timeout is None:
        timeout = None if args.wait else DEFAULT_COMMAND_TIMEOUT_S
    outcome = await send_command(nc, config, subject, body, timeout=timeout, wait_if_down=args.wait)
    return report_outcome(outcome, subject, as_json=args.json)


async def _bead_show(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    bead = await _read(nc, config, "mayor", "get", {"id": args.id})
    if args.json:
        render.print_json(bead)
    else:
        print(render.bead_detail(bead))
    return EXIT_OK


async def _bead_list(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    if args.cmd == "ready":
        beads = await _read(nc, config, "mayor", "ready", {"limit": args.limit})
    else:
        body = {
            "status": args.status,
            "type": args.type,
            "label": args.label,
            "assignee": args.assignee,
            "parent": args.parent,
            "include_closed": args.all or None,
            "limit": args.limit,
        }
        beads = await _read(nc, config, "mayor", "list", _drop_none(body))
    if args.json:
        render.print_json(beads)
    else:
        print(render.bead_table(beads))
    return EXIT_OK


async def _bead_history(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    entries = await history(nc, config, "bead", args.id)
    if not entries:
        print(f"gt: no events for bead {args.id!r}", file=sys.stderr)
        return EXIT_REJECTED
    if args.json:
        render.print_json(entries)
    else:
        print(render.history_lines(entries))
    return EXIT_OK


async def _health(nc: Client, args: argparse.Namespace, config: TownConfig) -> int:
    status = await query(nc, args.service, "status", {}, timeout=3)
    last = await stream_last_seq(nc, config)
    status["stream_last_seq"] = last
    status["lag"] = max(0, last - int(status.get("last_seq", 0)))
    healthy = bool(status.get("caught_up")) and bool(status.get("connected"))
    if args.json:
        render.print_json(status)
    else:
        state = "healthy" if healthy else ("catching up" if status.get("connected") else "disconnected")
        print(f"{args.service}: {state}, last_seq {status.get('last_seq')}, lag {status['lag']}")
    return EXIT_OK if healthy else EXIT_REJECTED


Handler = Callable[[Client, argparse.Namespace, TownConfig], Awaitable[int]]


def _handler(args: argparse.Namespace) -> Handler:
    if args.cmd == "init":
        return _init
    if args.cmd == "health":
        return _health
    if args.cmd == "ready":
        return _bead_list
    verb = args.bead_cmd
    if verb in ("create", "update", "claim", "close"):
        return _bead_command
    return {"show": _bead_show, "list": _bead_list, "history": _bead_history}[verb]


async def run_async(args: argparse.Namespace, config: TownConfig) -> int:
    handler = _handler(args)
    nc = await connect(config, name="gt-cli", connect_attempts=2)
    try:
        return await handler(nc, args, config)
    finally:
        try:
            async with asyncio.timeout(5):
                await nc.drain()
        except (TimeoutError, nats.errors.Error):
            await nc.close()


def _town_nats(config: TownConfig) -> TownConfig:
    """Without NATS_URL, talk to the town `gt up` runs in GT_HOME (its NATS may be on any port)."""
    from shared.cli import town

    state = town.running_town(config)
    if state is None:
        return config
    return msgspec.structs.replace(config, nats_url=state.nats_url)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if getattr(args, "nats_url", None):
        env["NATS_URL"] = args.nats_url
    nats_given = bool(env.get("NATS_URL"))
    try:
        config = town_config.load(env)
    except ValueError as exc:
        print(f"gt: bad configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not nats_given and args.cmd not in ("up", "down", "schema"):
        config = _town_nats(config)
    if args.cmd != "up":
        # The CLI's own output is its answer; library chatter (reconnects while closing) stays out of it.
        gt_logging.configure("gt", json=False, level=os.environ.get("GT_LOG_LEVEL", "ERROR"))
    try:
        if args.cmd == "schema":
            from shared.schema import all_schemas

            render.print_json(all_schemas())
            return EXIT_OK
        if args.cmd in ("up", "down"):
            from shared.cli import town

            return town.up(args, config, embedded=not nats_given) if args.cmd == "up" else town.down(config)
        return asyncio.run(run_async(args, config))
    except UsageError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NatsUnavailableError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except QueryError as exc:
        print(f"gt: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_UNREACHABLE if exc.code in ("unavailable", "timeout") else EXIT_REJECTED
    except (StreamConfigMismatchError, AppendFailedError) as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
        print(f"gt: NATS did not answer ({type(exc).__name__}); is JetStream enabled and the town up?", file=sys.stderr)
        return EXIT_UNREACHABLE
    except nats.js.errors.NotFoundError as exc:
        print(f"gt: not found: {exc.description}; run `gt init` (or `gt up`) first", file=sys.stderr)
        return EXIT_UNREACHABLE
    except msgspec.DecodeError as exc:
        print(f"gt: unreadable answer: {exc}", file=sys.stderr)
        return EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
