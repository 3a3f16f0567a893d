"""The ``gt`` command.

Exit codes: 0 done (command accepted, or durably stored while its service is down: said on stderr; stdout has
only what is known, the id of what it creates), 1 rejected or not
found, 2 usage error, 3 NATS unreachable (or the answering service is not running), 4 not permitted (the
NATS server refused this user a subject; nothing was sent), 130 stopped with Ctrl-C, 141 its output pipe was
closed (``gt feed | head -1``: the reader had enough; nothing is printed about it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from gt.cli import (
    automations,
    beads,
    convoys,
    costs,
    crew,
    dashboard,
    feed,
    gates,
    gc,
    hook_lease,
    mail,
    merge_queue,
    patience,
    polecats,
    render,
    rigs,
    seance,
    sessions,
    status,
    town_agents,
    work,
)
from gt.cli.client import stream_last_seq
from gt.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    Handler,
    Subcommands,
)
from gt.town.policy import MAX_RUNNERS
from gt.town_secrets import as_operator
from shared.bus.connection import Connection, close_at_once, connect_as_session_or_user, connection_key
from shared.bus.permissions import guarded
from shared.bus.query import ask_json, reply_of
from shared.bus.topology import provision
from shared.core import config as town_config
from shared.core import logging as gt_logging
from shared.core import subjects
from shared.core.aio import task_stacks
from shared.core.config import TownConfig
from shared.core.errors import GastownError, NatsUnavailableError
from shared.host.privacy import private_files
from shared.model.queries import Status

if TYPE_CHECKING:
    from shared.bus.kept import KeptConnections

SERVICES = ("mayor", "witness", "refinery", "deacon")


def _service(*extra: str) -> Callable[[str], str]:
    """An argument naming a service of the town, a gate runner (``runner-<name>``) or one of ``extra``."""

    def parse(value: str) -> str:
        if value in SERVICES or value in extra or subjects.is_runner_scope(value):
            return value
        known = ", ".join([*SERVICES, *extra, "runner-<name>"])
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {known})")

    return parse


def _runner_count(value: str) -> int:
    """``--runners``: how many gate runners `gt up` starts."""
    try:
        count = int(value)
    except ValueError:
        count = -1
    if not 0 <= count <= MAX_RUNNERS:
        raise argparse.ArgumentTypeError(f"a whole number from 0 to {MAX_RUNNERS}, got {value!r}")
    return count


class StrictParser(argparse.ArgumentParser):
    """A subcommand's parser that refuses what it does not know itself, so the error comes with the
    subcommand's usage (``usage: gt bead create ...``), not the top-level one argparse would print."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


EXIT_INTERRUPTED = 130
"""Ctrl-C, as shells report a SIGINT."""
EXIT_BROKEN_PIPE = 141
"""The reader of the output went away, as shells report a SIGPIPE."""
LOCAL_COMMANDS = ("up", "down", "schema")
"""Commands that do not talk to a running town through NATS."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--nats-url", default=argparse.SUPPRESS, help="NATS server URL(s) (env NATS_URL)")
    p = argparse.ArgumentParser(prog="gt", description="Operate a gastown-nats town.", parents=[common])
    p.add_argument(
        "--actor",
        dest="actor_first",
        metavar="ACTOR",
        default=None,
        help="who is acting, for a command that sends one (`gt --actor operator:ann bead close ID`; after the "
        "subcommand too)",
    )
    commands = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=StrictParser)
    sub = Subcommands(commands, common)

    sub.add_parser("init", help="create the streams and consumers (idempotent)").set_defaults(handler=_init)
    up = sub.add_parser("up", help="start an embedded NATS server (unless NATS_URL is set) and the services")
    up.add_argument("--detach", "-d", action="store_true", help="run in the background and return once ready")
    up.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("GT_NATS_PORT", "4222")),
        help="client port of the embedded NATS server (env GT_NATS_PORT, default 4222; 0: any free port); "
        "not used when NATS_URL names a server",
    )
    up.add_argument("--services", default=",".join(SERVICES), help="comma-separated services to run")
    up.add_argument(
        "--runners",
        type=_runner_count,
        default=os.environ.get("GT_RUNNERS", "0"),
        help="gate runners to start beside the services, runner-1 ... runner-N (env GT_RUNNERS, default 0: the "
        "refinery runs the gates itself); the refinery's GT_MQ_RUNNERS is N unless set",
    )
    up.add_argument(
        "--service",
        metavar="NAME",
        type=_service("nats"),
        help="on a running town: restart this one service (mayor, witness, refinery, deacon, runner-N) and wait "
        "until it is caught up; one left down after a crash loop starts afresh. `nats`: start the embedded NATS "
        "server again after its crash loop",
    )
    down = sub.add_parser("down", help="stop what `gt up` started (refinery, witness, mayor, deacon, then NATS)")
    down.add_argument(
        "--clean",
        action="store_true",
        help="then remove polecat worktrees that are clean and pushed; list the others, which are kept",
    )
    down.add_argument(
        "--sessions",
        action="store_true",
        help="first have the witness stop every polecat session (recorded; the next `gt up` respawns them); "
        "without it they keep running, and are counted",
    )

    beads.register(sub)
    work.register(sub)
    convoys.register(sub)
    gates.register(sub)
    town_agents.register(sub)
    crew.register(sub)
    mail.register(sub)
    rigs.register(sub)
    sessions.register(sub)
    seance.register(sub)
    merge_queue.register(sub)
    polecats.register(sub)
    automations.register(sub)
    gc.register(sub)
    costs.register(sub)
    status.register(sub)
    feed.register(sub)
    dashboard.register(sub)

    sub.add_parser("schema", help="JSON Schema of every command and event")
    st = sub.query("health", _health, help="exit 0 when the service is connected and caught up with the log")
    st.add_argument(
        "service", nargs="?", default="mayor", type=_service(), help=f"{', '.join(SERVICES)} or runner-<name>"
    )
    return p


async def _init(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    report = await provision(nc, config)
    for name in report.created:
        print(f"created  {name}")
    for name in report.existing:
        print(f"exists   {name}")
    return EXIT_OK


async def _health(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = Status(service=args.service)
    answer = await ask_json(nc, query, timeout=3)  # printed as it came with --json: each service adds its own
    status = reply_of(query, answer)
    last = await stream_last_seq(nc, config)
    lag = max(0, last - status.last_seq)
    healthy = status.caught_up and status.connected
    if args.json:
        render.print_json({**answer, "stream_last_seq": last, "lag": lag})
    else:
        state = "healthy" if healthy else ("catching up" if status.connected else "disconnected")
        # Any instance of the service may answer: an active one, or a standby following the log.
        role = f" ({status.role} {status.identity or args.service})" if status.role else ""
        print(f"{args.service}: {state}{role}, last_seq {status.last_seq}, lag {lag}")
    return EXIT_OK if healthy else EXIT_REJECTED


async def run_async(
    handler: Handler, args: argparse.Namespace, config: TownConfig, kept: KeptConnections | None = None
) -> int:
    # `kill -USR2 <pid>` of a gt that does not finish prints what each of its tasks waits for. Set as a plain
    # handler, put back afterwards (a client helper's worker runs the next call): the loop's add_signal_handler
    # cost 0.16 ms of a 2.5 ms call (it lists every valid signal, as enums, to set it and again to remove it).
    try:
        previous = signal.signal(signal.SIGUSR2, _print_task_stacks)
    except ValueError:  # not the main thread: no such help
        return await _connected(handler, args, config, kept)
    try:
        return await _connected(handler, args, config, kept)
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL if previous is None else previous)


async def _connected(
    handler: Handler, args: argparse.Namespace, config: TownConfig, kept: KeptConnections | None
) -> int:
    """Run ``handler`` on a connection of its own, or (``kept``: a client helper's worker) one kept from an earlier
    call to the same servers as the same user, given back at the end."""
    # An agent's call waits out a town restart (gt/cli/patience.py); an operator's is told at once.
    wait = patience.begin(patience.town_patience())

    def connect() -> Awaitable[Connection]:
        return connect_as_session_or_user(
            config, name="gt-cli", patience_s=wait.patience_s, connect_attempts=2, on_wait=wait.waiting
        )

    nc = await (connect() if kept is None else kept.connect(connection_key(config), connect))
    wait.answered()
    try:
        # Any subject this user may not use (a query, the KV, the JetStream API) ends the command at once
        # with the subject named, rather than with a timeout.
        work = guarded(nc, handler(nc, args, config))
        if os.environ.get("GT_SESSION"):
            # A polecat session's call says the agent is alive while it waits (gt/cli/hook_lease.py).
            return await hook_lease.kept_alive(nc, config, work)
        return await work
    finally:
        await (close_at_once(nc) if kept is None else kept.give_back(nc))


def _print_task_stacks(_signum: int, _frame: object) -> None:
    print("gt: task stacks\n" + "\n".join(task_stacks()), file=sys.stderr, flush=True)


def _town_nats(config: TownConfig, env: dict[str, str]) -> TownConfig:
    """Without NATS_URL, talk to the town `gt up` runs in GT_HOME (its NATS may be on any port), as its record
    (GT_HOME/run/town.json) says, also when its supervisor is gone (said on stderr: the town may run on without
    it); with no record, to the port GT_NATS_PORT names (where `gt up` would have put it)."""
    from gt.town import lifecycle
    from gt.town import state as town_state

    state = town_state.read_state(config)
    if state is None:
        port = env.get("GT_NATS_PORT", "").strip()
        if not port:
            return config
        return as_operator(msgspec.structs.replace(config, nats_url=f"nats://127.0.0.1:{port}"))
    gone = lifecycle.supervisor_gone(config, state)
    if gone is not None:
        print(f"gt: {gone}", file=sys.stderr)
    at_town = msgspec.structs.replace(config, nats_url=state.nats_url)
    # Its operator, unless this process names a login of its own (a polecat session does).
    return as_operator(at_town) if state.embedded else at_town


def main(
    argv: Sequence[str] | None = None,
    parser: argparse.ArgumentParser | None = None,
    kept: KeptConnections | None = None,
) -> int:
    """Run one ``gt`` call; ``parser``: one ``build_parser()`` made earlier (the client helper builds it once,
    before it forks the workers that run the calls); ``kept``: the connections a worker keeps between its calls
    (and the event loop they live on)."""
    try:
        code = _main(argv, parser or build_parser(), kept)
        sys.stdout.flush()  # here, not at exit: a closed pipe then still ends quietly
    except BrokenPipeError:
        # `gt feed | head -1`: the reader had enough. Quiet, as Unix tools are; stdout goes nowhere from now on,
        # so the interpreter's own flush at exit does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


def _dispatch(args: argparse.Namespace, config: TownConfig, *, embedded: bool, kept: KeptConnections | None) -> int:
    if args.cmd == "schema":
        from gt.cli.schema import all_schemas

        render.print_json(all_schemas())
        return EXIT_OK
    if args.cmd in ("up", "down"):
        from gt.town import lifecycle as town

        return (
            town.up(args, config, embedded=embedded)
            if args.cmd == "up"
            else town.down(config, clean=args.clean, sessions=args.sessions)
        )
    precheck = getattr(args, "precheck", None)
    if precheck is not None:
        precheck(args)  # e.g. `gt done` outside a session: said before trying to reach NATS
    # What a command prints reaches the terminal with no control character an agent wrote (gt.cli.render).
    with render.escaped_stdout():
        if kept is None:
            return asyncio.run(run_async(args.handler, args, config))
        return kept.run(run_async(args.handler, args, config, kept))


def _actor_first(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``gt --actor X <command> ...``: the command's own ``--actor``, given before it as ``--nats-url`` may be."""
    first = getattr(args, "actor_first", None)
    if first is None:
        return
    if not hasattr(args, "cmd_id"):  # only commands that send one (command_options) have an actor
        verbs = [v for k, v in vars(args).items() if k.endswith("_cmd") and isinstance(v, str)]
        parser.error(f"--actor names who sends a command; `gt {' '.join([args.cmd, *verbs])}` sends none")
    if args.actor not in (None, first):
        parser.error(f"--actor given twice: {first!r} before the command, {args.actor!r} after it")
    args.actor = first


def _main(argv: Sequence[str] | None, parser: argparse.ArgumentParser, kept: KeptConnections | None) -> int:
    args = parser.parse_args(argv)
    _actor_first(parser, args)
    env = dict(os.environ)
    if getattr(args, "nats_url", None):
        env["NATS_URL"] = args.nats_url
    nats_given = bool(env.get("NATS_URL"))
    try:
        private_files(env)  # what `gt` (and `gt up`'s town) creates under GT_HOME
        config = town_config.load(env)
        patience.town_patience(env)  # a bad GT_TOWN_PATIENCE is said now, not when the town first does not answer
    except ValueError as exc:
        print(f"gt: bad configuration: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not nats_given and args.cmd not in LOCAL_COMMANDS:
        config = _town_nats(config, env)
    # The CLI's own output is its answer; library chatter (reconnects while closing, `gt up -d`'s check of a running
    # town closing its connection) stays out of it, on stderr. The foreground `gt up` logs as a service instead.
    # Not cached: a client helper's worker runs calls of different GT_LOG_LEVELs one after another.
    gt_logging.configure("gt", json=False, level=os.environ.get("GT_LOG_LEVEL", "ERROR"), cache_loggers=False)
    try:
        return _dispatch(args, config, embedded=not nats_given, kept=kept)
    except KeyboardInterrupt:
        # Ctrl-C ends `gt feed` and `gt dashboard` (and any wait): a stop asked for, not a crash.
        return EXIT_INTERRUPTED
    except GastownError as exc:
        # What the error says it means for `gt` (shared/core/errors.py: exit_code, hint); one it does not expect
        # (exit_code None) keeps its traceback.
        if exc.exit_code is None:
            raise
        print(f"gt: {exc.explained()}", file=sys.stderr)
        for line in _unreachable_town(exc, config, nats_given=nats_given):
            print(f"gt: {line}", file=sys.stderr)
        return exc.exit_code
    except msgspec.DecodeError as exc:
        print(f"gt: unreadable answer: {exc}", file=sys.stderr)
        return EXIT_REJECTED


def _unreachable_town(exc: GastownError, config: TownConfig, *, nats_given: bool) -> list[str]:
    """What `gt` adds when NATS could not be reached: how long it waited, and what it knows of the town it
    looked for (when no NATS_URL named the server)."""
    if not isinstance(exc, NatsUnavailableError):
        return []
    lines = []
    waited = patience.current().gave_up()
    if waited is not None:
        lines.append(waited)
    if not nats_given:
        from gt.town import lifecycle as town

        hint = town.unreachable_hint(config)
        if hint is not None:
            lines.append(hint)
    return lines


if __name__ == "__main__":
    sys.exit(main())
