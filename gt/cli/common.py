"""What every `gt` subcommand shares: options, sending a command, reading a query, exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import msgspec

from gt.cli import client, patience, render
from gt.cli.client import Outcome, read_position
from shared.bus import commands as bus_commands
from shared.bus.query import ask_all, ask_json, reply_of
from shared.core.arguments import non_negative_int
from shared.core.config import TownConfig
from shared.core.errors import EXIT_DENIED, EXIT_REJECTED, EXIT_UNREACHABLE, EXIT_USAGE, GastownError
from shared.core.terminal import escape_line, escape_text
from shared.model.commands import Command
from shared.model.commands.base import Creates
from shared.model.events import CommandRejected
from shared.model.queries import Query
from shared.model.queries.base import DEFAULT_LIST_LIMIT

if TYPE_CHECKING:
    from shared.bus.connection import Connection

C = TypeVar("C", bound=Command)
R = TypeVar("R")

EXIT_OK = 0
__all__ = [
    "EXIT_DENIED",
    "EXIT_OK",
    "EXIT_REJECTED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
]  # the error ones: shared.core.errors
DEFAULT_COMMAND_TIMEOUT_S = 10.0

Handler: TypeAlias = "Callable[[Connection, argparse.Namespace, TownConfig], Awaitable[int]]"
ResultPrinter: TypeAlias = Callable[[R], str]
"""How a command's result (its type, ``Command[R]``) is printed."""


class Identified(Protocol):
    """A result naming what it created or changed."""

    @property
    def id(self) -> str: ...


class StatusResult(Identified, Protocol):
    """A result saying what became of its thing (``status_line``)."""

    @property
    def status(self) -> str: ...

    @property
    def changed(self) -> bool: ...


class UsageError(GastownError):
    """The command line asks for something that cannot be done as written."""

    exit_code = EXIT_USAGE


class Subcommands:
    """Adds the common options (``--nats-url``) to every subcommand, so they work before or after it."""

    def __init__(self, action: Any, common: argparse.ArgumentParser) -> None:
        self._action = action
        self.common = common

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = self._action.add_parser(name, parents=[self.common], **kwargs)
        return parser

    def command(self, name: str, handler: Handler, *, help: str, **defaults: Any) -> argparse.ArgumentParser:
        """A verb that sends a command: ``handler`` sends it, with the options every command takes."""
        parser = self.add_parser(name, help=help)
        command_options(parser)
        parser.set_defaults(handler=handler, **defaults)
        return parser

    def query(self, name: str, handler: Handler, *, help: str, **defaults: Any) -> argparse.ArgumentParser:
        """A verb that reads: ``handler`` asks, and ``--json`` prints the answer as it came."""
        parser = self.add_parser(name, help=help)
        read_options(parser)
        parser.set_defaults(handler=handler, **defaults)
        return parser

    def group(self, name: str, help_text: str, dest: str) -> Subcommands:
        """A subcommand with subcommands of its own (``gt bead create``)."""
        parser = self.add_parser(name, help=help_text)
        return Subcommands(parser.add_subparsers(dest=dest, required=True, metavar="VERB"), self.common)


def command_options(parser: argparse.ArgumentParser) -> None:
    """Options of every subcommand that sends a command, under a heading of their own after the verb's."""
    sending = parser.add_argument_group("sending the command")
    sending.add_argument("--wait", action="store_true", help="wait for the outcome, also while the service is down")
    sending.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait for the outcome (default {DEFAULT_COMMAND_TIMEOUT_S:g}; with --wait: forever)",
    )
    sending.add_argument("--json", action="store_true", help="print the outcome as JSON")
    sending.add_argument("--actor", help="who is acting (default: the polecat inside a polecat session, else operator)")
    sending.add_argument("--id", dest="cmd_id", metavar="CMD_ID", help="command id (resending the same id is harmless)")


def print_id(result: Identified) -> str:
    """What a command that creates something prints: the new id alone, so ``bead=$(gt bead create ...)`` works
    (``--json`` prints the whole outcome). ``gt bead create``, ``gt convoy create``, ``gt escalate``."""
    return result.id


def read_options(parser: argparse.ArgumentParser) -> None:
    """The option of every subcommand that reads, under a heading of its own after the verb's."""
    parser.add_argument_group("output").add_argument("--json", action="store_true", help="print JSON")


def key_values(pairs: list[str] | None, option: str) -> dict[str, str]:
    """``KEY=VALUE`` arguments as a dict."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{option} takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def given(cmd: C) -> C:
    """``cmd`` with every option the command line left out (None) at the field's default, so the body leaves
    it out: an option not given is a field not sent, as the service then reads its default."""
    defaults: dict[str, Any] = {}
    for field in msgspec.structs.fields(cmd):
        if getattr(cmd, field.name) is None:
            if field.default_factory is not msgspec.NODEFAULT:
                defaults[field.name] = field.default_factory()
            elif field.default is not msgspec.NODEFAULT and field.default is not None:
                defaults[field.name] = field.default
    return msgspec.structs.replace(cmd, **defaults) if defaults else cmd


def report(outcome: Outcome[R], cmd: Command[R], *, as_json: bool, printer: ResultPrinter[R]) -> int:
    """Print what became of a command and return the exit code.

    Standard output carries only the answer. A command stored but not answered yet (its service is down or slow)
    prints there only what is known already, the id of what it creates (``new_id``, chosen here), so
    ``bead=$(gt bead create ...)`` holds the bead's id either way; the explanation goes to standard error."""
    if as_json:
        render.print_json(outcome)
    if outcome.type is None:
        if not as_json:
            why = "is not running" if outcome.service_down else "has not answered yet"
            known = cmd.new_id if isinstance(cmd, Creates) else None
            if known is not None:
                print(known)
            what = f"{known} is created when it does" if known is not None else "nothing is printed until it does"
            print(
                f"gt: stored: command {outcome.command_id} is durably queued (GT_CMD #{outcome.stored_seq}); "
                f"the {bus_commands.owner(cmd)} {why} and will carry it out when it can ({what}; it may still "
                "refuse it). `--wait` waits for the outcome. (A command sent far over its actor's rate limit is "
                "dropped and never answered: see `rate_limited` in docs/operating.md.)",
                file=sys.stderr,
            )
        return EXIT_OK
    if (rejected := outcome.rejected) is not None:
        if not as_json:
            print(rejected_line(rejected), file=sys.stderr)
        return EXIT_REJECTED
    if not as_json:
        print(printer(outcome.result))
    return EXIT_OK


def rejected_line(rejected: CommandRejected) -> str:
    """``rejected (code): message``; the message may quote what an agent wrote: its control characters escaped."""
    return f"rejected ({escape_line(rejected.code)}): {escape_text(rejected.message)}"


def status_line(result: StatusResult) -> str:
    """The plain rendering of a result: ``<id>: <status>`` and ``(unchanged)`` when nothing changed."""
    changed = "" if result.changed else " (unchanged)"
    return f"{result.id}: {result.status}{changed}"


async def send(
    nc: Connection,
    args: argparse.Namespace,
    config: TownConfig,
    cmd: Command[R],
    printer: ResultPrinter[R],
    *,
    before_report: Callable[[R], Awaitable[None]] | None = None,
) -> int:
    """Send a command built from the command line (options left out at their defaults, ``--actor`` and ``--id``
    added) and report its outcome; ``before_report`` may add to an accepted command's result what followed from
    it (e.g. a nudge delivered)."""
    cmd = given(msgspec.structs.replace(cmd, actor=getattr(args, "actor", None), cmd_id=getattr(args, "cmd_id", None)))
    cmd = client.with_ids(cmd)  # what it creates has its id now: printed even while its service is down
    timeout = args.timeout if args.timeout is not None else (None if args.wait else DEFAULT_COMMAND_TIMEOUT_S)
    outcome = await client.send(nc, config, cmd, timeout=timeout, wait_if_down=args.wait)
    if before_report is not None and (accepted := outcome.accepted) is not None:
        await before_report(accepted.result)
    return report(outcome, cmd, as_json=args.json, printer=printer)


def limit_option(parser: argparse.ArgumentParser) -> None:
    """``--limit`` of a command that lists: how many items it shows (the list is read in pages up to there)."""
    parser.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIST_LIMIT,
        help=f"at most this many (default {DEFAULT_LIST_LIMIT}; 0: all)",
    )


async def read(nc: Connection, config: TownConfig, query: Query[Any], *, min_seq: int | None = None) -> Any:
    """Ask a query once its service has applied everything stored so far (read-your-writes); the answer as it
    came (JSON), to print with ``--json`` or render (``read_typed`` reads it into the query's reply type).
    ``min_seq``: the log's last sequence, read once already by a caller asking several queries
    (``client.read_position``)."""
    if min_seq is None:
        min_seq = await read_position(nc, config)
    query = msgspec.structs.replace(query, min_seq=min_seq)
    # An agent's reads (`gt prime`, its hooks) outlast a restart of the service asked, as its connection does.
    wait = patience.current()
    if not hasattr(query, "after"):
        answer = await ask_json(nc, query, patience_s=wait.patience_s, on_wait=wait.waiting)
        wait.answered()
        return answer
    # A list: read page after page (a list of any length fits no single reply).
    listing = await ask_all(nc, query, patience_s=wait.patience_s, on_wait=wait.waiting)
    wait.answered()
    if listing.more:
        print(
            f"gt: the first {len(listing.items)} shown; more are listed (--limit N for more, --limit 0 for all)",
            file=sys.stderr,
        )
    return listing.items


async def read_typed(nc: Connection, config: TownConfig, query: Query[R], *, min_seq: int | None = None) -> R:
    """``read``, the answer read into the query's reply type."""
    return reply_of(query, await read(nc, config, query, min_seq=min_seq))


def show(args: argparse.Namespace, data: Any, text: Callable[[Any], str]) -> int:
    """Print ``data`` as JSON with ``--json``, else as ``text(data)``."""
    if args.json:
        render.print_json(data)
    else:
        print(text(data))
    return EXIT_OK


def show_reply(args: argparse.Namespace, query: Query[R], data: Any, text: Callable[[R], str]) -> int:
    """``show`` of ``query``'s answer ``data`` (as ``read`` gave it): as it came with ``--json``, else ``text`` of it
    read into the query's reply type."""
    return show(args, data, lambda answer: text(reply_of(query, answer)))
