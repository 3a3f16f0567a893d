"""The ``gt`` command.

Exit codes: 0 done (command accepted, or stored while its service is down), 1 rejected or not found,
2 usage error, 3 NATS unreachable.
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

from shared import config as town_config
from shared import logging as gt_logging
from shared.bus.connection import connect
from shared.bus.topology import COMMAND_OWNERS, provision
from shared.cli import render
from shared.cli.client import Outcome, history, query, send_command, stream_last_seq
from shared.config import TownConfig
from shared.errors import AppendFailedError, GastownError, NatsUnavailableError, QueryError, StreamConfigMismatchError

EXIT_OK, EXIT_REJECTED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


class UsageError(GastownError):
    pass


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


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", default=argparse.SUPPRESS, help="NATS server URL(s) (env NATS_URL)")
    p = argparse.ArgumentParser(prog="gt", description="Operate a gastown-nats town.", parents=[common])
    sub = _Sub(p.add_subparsers(dest="cmd", required=True, metavar="COMMAND"), common)

    sub.add_parser("init", help="create the streams and consumers (idempotent)")

    up = sub.add_parser("up", help="start an embedded NATS server (unless NATS_URL is set) and the services")
    up.add_argument("--detach", "-d", action="store_true", help="run in the background and return once ready")
    up.add_argument("--port", type=int, default=int(os.environ.get("GT_NATS_PORT", "4222")))
    up.add_argument("--services", default="mayor,witness,refinery,deacon", help="comma-separated services to run")
    sub.add_parser("down", help="stop what `gt up` started (services in reverse order, then NATS)")

    bead = sub.add_parser("bead", help="beads: create, show, list, update, claim, close, history")
    bsub = _Sub(bead.add_subparsers(dest="bead_cmd", required=True, metavar="VERB"), common)

    def command_opts(x: argparse.ArgumentParser) -> None:
        x.add_argument("--wait", action="store_true", help="wait for the outcome even if the service is down")
        x.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the outcome (default 10)")
        x.add_argument("--json", action="store_true", help="print the outcome as JSON")
        x.add_argument("--actor", help="who is acting (default: operator)")

    c = bsub.add_parser("create", help="file a new bead")
    c.add_argument("title")
    c.add_argument("--type", "-t")
    c.add_argument("--priority", "-p", type=int)
    c.add_argument("--description", "-d")
    c.add_argument("--label", "-l", action="append", dest="labels")
    c.add_argument("--meta", action="append", metavar="KEY=VALUE")
    c.add_argument("--parent")
    c.add_argument("--needs", action="append")
    c.add_argument("--assignee")
    c.add_argument("--prefix")
    command_opts(c)

    s = bsub.add_parser("show", help="one bead")
    s.add_argument("id")
    s.add_argument("--json", action="store_true")

    ls = bsub.add_parser("list", help="beads, in creation order (closed ones only with --all or --status closed)")
    for flag in ("--status", "--type", "--label", "--assignee", "--parent"):
        ls.add_argument(flag)
    ls.add_argument("--all", action="store_true", help="include closed beads")
    ls.add_argument("--limit", type=int, default=1000)
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
    command_opts(u)

    cl = bsub.add_parser("claim", help="take a bead: open/hooked -> in_progress")
    cl.add_argument("id")
    cl.add_argument("--assignee", "-a", required=True)
    command_opts(cl)

    x = bsub.add_parser("close", help="close a bead (closing a closed bead changes nothing)")
    x.add_argument("id")
    x.add_argument("--reason", "-r", default="")
    command_opts(x)

    h = bsub.add_parser("history", help="the bead's events, from the log")
    h.add_argument("id")
    h.add_argument("--json", action="store_true")

    r = sub.add_parser("ready", help="open beads with no open blocker")
    r.add_argument("--limit", type=int, default=1000)
    r.add_argument("--json", action="store_true")

    sub.add_parser("schema", help="JSON Schema of every command and event")

    st = sub.add_parser("health", help="exit 0 when the service answers and has caught up with the log")
    st.add_argument("service", nargs="?", default="mayor")
    st.add_argument("--json", action="store_true")
    return p


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None and v != []}


def bead_command_body(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    verb = args.bead_cmd
    common = {"actor": args.actor}
    if verb == "create":
        body = {
            "title": args.title, "type": args.type, "priority": args.priority, "description": args.description,
            "labels": args.labels, "metadata": _meta(args.meta) or None, "parent": args.parent,
            "needs": args.needs, "assignee": args.assignee, "prefix": args.prefix,
        }
    elif verb == "update":
        body = {
            "id": args.id, "title": args.title, "type": args.type, "priority": args.priority,
            "description": args.description, "assignee": args.assignee, "parent": args.parent,
            "labels": args.labels, "remove_labels": args.remove_labels, "metadata": _meta(args.meta) or None,
            "needs": args.needs, "status": args.status,
        }
    elif verb == "claim":
        body = {"id": args.id, "assignee": args.assignee}
    else:
        body = {"id": args.id, "reason": args.reason}
    return f"gt.cmd.bead.{verb}", _drop_none({**common, **body})


def report_outcome(outcome: Outcome, subject: str, *, as_json: bool) -> int:
    if as_json:
        render.print_json(outcome)
    if outcome.type is None:
        owner = COMMAND_OWNERS.get(subject.split(".")[2], "owning service")
        if not as_json:
            print(
                f"stored: command {outcome.command_id} is durably queued (GT_CMD #{outcome.stored_seq}); "
                f"the {owner} has not answered yet (is it running? `gt up`). Use --wait to wait for the outcome."
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


async def _with_nats(config: TownConfig, fn: Callable[[Any], Awaitable[int]]) -> int:
    nc = await connect(config, name="gt-cli", connect_attempts=2)
    try:
        return await fn(nc)
    finally:
        await nc.drain()


async def _read(nc: Any, config: TownConfig, service: str, what: str, body: dict[str, Any]) -> Any:
    # Read-your-writes: ask the service to answer once it has applied everything stored so far.
    body = {**body, "min_seq": await stream_last_seq(nc, config)}
    return await query(nc, service, what, body)


async def run_async(args: argparse.Namespace, config: TownConfig) -> int:
    cmd = args.cmd
    if cmd == "init":

        async def do_init(nc: Any) -> int:
            report = await provision(nc.jetstream(), config)
            for name in report.created:
                print(f"created  {name}")
            for name in report.existing:
                print(f"exists   {name}")
            return EXIT_OK

        return await _with_nats(config, do_init)
    if cmd == "bead" and args.bead_cmd in ("create", "update", "claim", "close"):
        subject, body = bead_command_body(args)

        async def do_command(nc: Any) -> int:
            timeout = None if args.wait and args.timeout == 10.0 else args.timeout  # noqa: PLR2004
            outcome = await send_command(nc, config, subject, body, timeout=timeout)
            return report_outcome(outcome, subject, as_json=args.json)

        return await _with_nats(config, do_command)
    if cmd == "bead" and args.bead_cmd == "show":

        async def do_show(nc: Any) -> int:
            bead = await _read(nc, config, "mayor", "get", {"id": args.id})
            render.print_json(bead) if args.json else print(render.bead_detail(bead))
            return EXIT_OK

        return await _with_nats(config, do_show)
    if (cmd == "bead" and args.bead_cmd == "list") or cmd == "ready":

        async def do_list(nc: Any) -> int:
            if cmd == "ready":
                beads = await _read(nc, config, "mayor", "ready", {"limit": args.limit})
            else:
                body = _drop_none(
                    {"status": args.status, "type": args.type, "label": args.label, "assignee": args.assignee,
                     "parent": args.parent, "include_closed": args.all or None, "limit": args.limit}
                )
                beads = await _read(nc, config, "mayor", "list", body)
            render.print_json(beads) if args.json else print(render.bead_table(beads))
            return EXIT_OK

        return await _with_nats(config, do_list)
    if cmd == "bead" and args.bead_cmd == "history":

        async def do_history(nc: Any) -> int:
            entries = await history(nc, config, "bead", args.id)
            if not entries:
                print(f"no events for bead {args.id!r}", file=sys.stderr)
                return EXIT_REJECTED
            render.print_json(entries) if args.json else print(render.history_lines(entries))
            return EXIT_OK

        return await _with_nats(config, do_history)
    if cmd == "health":

        async def do_health(nc: Any) -> int:
            status = await query(nc, args.service, "status", {}, timeout=3)
            last = await stream_last_seq(nc, config)
            healthy = bool(status.get("caught_up"))
            status["stream_last_seq"] = last
            status["lag"] = max(0, last - int(status.get("last_seq", 0)))
            if args.json:
                render.print_json(status)
            else:
                print(f"{args.service}: {'healthy' if healthy else 'catching up'}, lag {status['lag']}")
            return EXIT_OK if healthy else EXIT_REJECTED

        return await _with_nats(config, do_health)
    raise UsageError(f"unknown command {cmd!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    env = dict(os.environ)
    if getattr(args, "nats_url", None):
        env["NATS_URL"] = args.nats_url
    config = town_config.load(env)
    if args.cmd != "up":
        # The CLI's own output is its answer; library chatter (reconnects while closing) stays out of it.
        gt_logging.configure("gt", json=False, level=os.environ.get("GT_LOG_LEVEL", "ERROR"))
    try:
        if args.cmd == "schema":
            from shared.schema import all_schemas  # noqa: PLC0415 (only this command needs it)

            render.print_json(all_schemas())
            return EXIT_OK
        if args.cmd in ("up", "down"):
            from shared.cli import town  # noqa: PLC0415 (process supervision is only for these two)

            return town.up(args, config) if args.cmd == "up" else town.down(config)
        return asyncio.run(run_async(args, config))
    except UsageError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NatsUnavailableError as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except QueryError as exc:
        print(f"gt: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_UNREACHABLE if exc.code == "unavailable" else EXIT_REJECTED
    except (StreamConfigMismatchError, AppendFailedError) as exc:
        print(f"gt: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError) as exc:
        print(f"gt: NATS did not answer ({type(exc).__name__}); is JetStream enabled and the town initialised?", file=sys.stderr)
        return EXIT_UNREACHABLE
    except msgspec.DecodeError as exc:
        print(f"gt: unreadable answer: {exc}", file=sys.stderr)
        return EXIT_REJECTED


if __name__ == "__main__":
    sys.exit(main())
