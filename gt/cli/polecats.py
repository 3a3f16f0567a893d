"""The agent's side: `gt prime`, `gt heartbeat`, `gt handoff`, `gt done` and `gt agent-hook` (these read GT_SESSION
and the rest of the session's environment)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gt import start_hook
from gt.cli import crew, hook_lease, town_agents
from gt.cli.client import read_position
from gt.cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Subcommands,
    UsageError,
    read_typed,
    send,
    show,
)
from gt.cli.done_steps import DoneError, dirty_refusal, done_step, failed, reported
from shared.bus.kv import put_agent_heartbeat
from shared.core.config import TownConfig
from shared.core.faults import crash_point
from shared.core.terminal import escape_line
from shared.host import git
from shared.model import done_flow, heartbeats, runtimes
from shared.model.commands import (
    SessionHandoff,
)
from shared.model.formulas import rework
from shared.model.prime import Prime, prime_text, read_prime
from shared.model.queries import Query
from shared.model.results import SessionResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection

R = TypeVar("R")

SESSION_ENV = ("GT_SESSION", "GT_BEAD", "GT_RIG", "GT_WORKTREE", "GT_BRANCH")


def register(sub: Subcommands) -> None:
    prime = sub.query(
        "prime",
        _prime,
        help="(agent) everything needed to resume: bead, steps, worktree, instructions",
        precheck=_needs_session_id,
    )
    prime.add_argument("--session", help="default: GT_SESSION")
    ah = sub.add_parser("agent-hook", help="(agent runtime) run by an agent's hooks: session-start, stop, stop-failure")
    ah.add_argument("event", choices=AGENT_HOOK_EVENTS)
    ah.add_argument(
        "--runtime",
        choices=sorted(runtimes.RUNTIMES),
        default=runtimes.CLAUDE,
        help="the runtime whose hook runs: what it prints is in that runtime's words (default: claude)",
    )
    ah.set_defaults(handler=_agent_hook, precheck=_record_agent_hook)
    hb = sub.add_parser("heartbeat", help="(agent) I am alive and working; keeps a long step from looking stalled")
    hb.add_argument("--note", default="")
    hb.set_defaults(handler=_heartbeat, precheck=_needs_session_env)
    ho = sub.command(
        "handoff",
        _handoff,
        help="(agent) end this session; a fresh one continues on the same hook",
        precheck=_needs_session_env,
    )
    ho.add_argument("--note", default="", help="what the next session should know (its `gt prime` shows it)")
    done = sub.add_parser("done", help="(agent) push the branch, submit a merge request, end the session")
    done.add_argument("--json", action="store_true")
    done.set_defaults(handler=_done, precheck=_needs_session_env)


# ---- the agent's side --------------------------------------------------------------------------


def _needs_session_id(args: argparse.Namespace) -> None:
    if town_agents.is_town_agent() and not getattr(args, "session", None):
        return  # the mayor agent's `gt prime` and hooks: the town, not a session
    if crew.crew_of_env() is not None and not getattr(args, "session", None):
        return  # a crew member's shell: its workspace and hooked bead
    if not (getattr(args, "session", None) or os.environ.get("GT_SESSION")):
        raise UsageError(
            f"`gt {args.cmd}` runs inside a polecat session: GT_SESSION is not set (the witness sets it); "
            "outside one, name it with --session"
        )


def _needs_session_env(args: argparse.Namespace) -> None:
    if args.cmd == "done" and crew.crew_of_env() is not None:
        return  # a person's `gt done` in a crew member's shell
    missing = [k for k in SESSION_ENV if not os.environ.get(k)]
    if missing:
        raise UsageError(
            f"`gt {args.cmd}` runs inside a polecat session, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set (the witness sets them when it starts the session)"
        )


async def prime_data(nc: Connection, config: TownConfig, session_id: str) -> Prime:
    """The session's ``Prime`` as of the log's end now (one position read once for every query)."""
    last = await read_position(nc, config)

    async def read(query: Query[R], /) -> R:
        return await read_typed(nc, config, query, min_seq=last)

    return await read_prime(read, session_id)


AGENT_HOOK_EVENTS = ("session-start", "stop", "stop-failure")


def _record_agent_hook(args: argparse.Namespace) -> None:
    """Record the hook in the session's runtime dir before anything can fail (NATS down, a bad session): the
    SessionStart mark is the witness's sign that the agent started, whatever the town answers."""
    _needs_session_id(args)
    session_dir = os.environ.get(runtimes.SESSION_DIR_ENV)
    if not session_dir:
        return
    # The stop hook's input is read by its handler; the others' only here (a start's source: startup, resume,
    # clear or compact; a failure's API error).
    hook_input = {} if args.event == "stop" else start_hook.hook_input()
    what = str(hook_input.get("source") or hook_input.get("error") or "")
    stamp = start_hook.record(session_dir, args.event, what)
    if args.event == "session-start":
        # Answered the full way: an answer the witness wrote for this start is stale for the next (a /clear).
        with contextlib.suppress(FileNotFoundError):
            (Path(session_dir) / runtimes.START_ANSWER).unlink()
    if args.event == "stop-failure":
        failure = {"error": what, "details": str(hook_input.get("error_details") or ""), "at": stamp}
        (Path(session_dir) / runtimes.AGENT_FAILURE).write_text(json.dumps(failure) + "\n")


def _log_done() -> None:
    """Mark `gt done` in the session's hook log: a turn that ends after this mark (``turn_ended_after_done``) tells
    the witness the agent has read the result, so it ends the session then instead of waiting out the grace."""
    session_dir = os.environ.get(runtimes.SESSION_DIR_ENV)
    if not session_dir:
        return
    with contextlib.suppress(OSError):  # the grace (GT_DONE_EXIT_GRACE) still ends the session
        start_hook.record(session_dir, runtimes.DONE_MARK, "")


async def _agent_hook(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    """session-start: print `gt prime` (the agent adds a SessionStart hook's output to its context). stop: block
    the agent's stop while its session's steps are open (Claude Code's Stop hook decision,
    code.claude.com/docs/en/hooks). Never fails the agent: an error prints a hint (start) or nothing (stop)."""
    runtime = runtimes.runtime_for(args.runtime)
    if args.event == "stop-failure":
        return EXIT_OK  # recorded for the witness by the precheck; the turn is over either way
    if town_agents.is_town_agent():
        # The mayor agent: primed with the town at each start; it may always stop (it waits for requests).
        if args.event == "session-start":
            try:
                context = town_agents.town_prime_text(await town_agents.town_prime(nc, config))
            except Exception as exc:  # noqa: BLE001 - the agent starts anyway and is told to try itself
                context = f"[gastown] `gt prime` failed in the SessionStart hook ({exc}); run `gt prime` yourself."
            print(runtime.hook_answer(args.event, context))
        return EXIT_OK
    session = os.environ["GT_SESSION"]
    if args.event == "session-start":
        # The bead is claimed for its polecat by the witness once the pane started (the plan's ``ClaimBead``): the
        # hook only primes.
        try:
            context = prime_text(await prime_data(nc, config, session))
        except Exception as exc:  # noqa: BLE001 - the agent starts anyway and is told to try itself
            context = f"[gastown] `gt prime` failed in the SessionStart hook ({exc}); run `gt prime` yourself."
        print(runtime.hook_answer(args.event, context))
        return EXIT_OK
    hook_input = start_hook.hook_input()
    reason = None
    if not hook_input.get("stop_hook_active"):  # already going on because of this hook: never a loop
        with contextlib.suppress(Exception):  # fail open: an agent is never kept going on a guess
            reason = stop_reason(await prime_data(nc, config, session))
    if answer := runtime.hook_answer(args.event, reason):
        print(answer)
    return EXIT_OK


def stop_reason(data: Prime) -> str | None:
    """Why a session must not stop yet (its work is not handed in), or None: it may stop."""
    if data.status != "started" or data.done_intent:
        return None
    molecule, step = data.molecule, data.current_step
    if molecule is None:
        return None
    if step is not None and step.gate_closed():
        return None  # nothing to do until its gate opens: the agent may stop (the witness ends the session)
    if step is not None:
        why = " The merge queue sent your work back: `gt prime` says why." if rework.is_rework(step.id) else ""
        return (
            f"[gastown] Not done yet: step {escape_line(step.id)} ({escape_line(step.title)}) of bead "
            f"{escape_line(data.bead.id)} is still "
            f"open ({molecule.done}/{molecule.total} steps done).{why} Work it, commit, run `gt step done "
            f"{step.id}`, and go on until `gt done`. `gt prime` shows everything."
        )
    return f"[gastown] Every step of bead {data.bead.id} is done: run `gt done` to hand in your work."


async def _prime(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    if town_agents.is_town_agent() and not args.session:
        return show(args, await town_agents.town_prime(nc, config), town_agents.town_prime_text)
    if (member := crew.crew_of_env()) is not None and not args.session:
        return await crew.prime(nc, args, config, *member)
    data = await prime_data(nc, config, args.session or os.environ["GT_SESSION"])
    return show(args, data, prime_text)


async def _heartbeat(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    session = os.environ["GT_SESSION"]
    beat = heartbeats.agent_heartbeat(session, args.note, datetime.now(UTC))
    await put_agent_heartbeat(nc, config, session, heartbeats.encode_agent(beat))
    fence = hook_lease.session_fence()
    if fence is not None:
        lost = await hook_lease.renew(nc, config, fence, check_log=True)
        if lost is not None:
            print(
                f"gt heartbeat: session {session} no longer holds its hook ({lost}); stop working: the witness "
                "hands the bead to a fresh session and refuses this one's commands",
                file=sys.stderr,
            )
            return EXIT_REJECTED
    return EXIT_OK


async def _handoff(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    session = os.environ["GT_SESSION"]
    cmd = SessionHandoff(session=session, note=args.note)

    def line(result: SessionResult) -> str:
        return f"session {result.id} handed off: a fresh session continues bead {result.bead}"

    return await send(nc, args, config, cmd, line)


async def _done(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    """Each step is idempotent (fixed command ids, the same commit published again), so running it again after a
    crash picks up where it stopped; the witness finishes it if the agent cannot. The branch reaches the merge
    queue as a bundle of its commits (``git.publish``), never by a push: the agent's repository has no push URL."""
    if (member := crew.crew_of_env()) is not None:
        return await crew.done(nc, args, config, *member)
    session, bead, rig = os.environ["GT_SESSION"], os.environ["GT_BEAD"], os.environ["GT_RIG"]
    worktree, branch = Path(os.environ["GT_WORKTREE"]), os.environ["GT_BRANCH"]
    base = os.environ.get("GT_BASE_BRANCH", "main")
    state = git.worktree_state(worktree, base)
    if not state.exists:
        raise UsageError(f"the worktree {worktree} is not there; nothing to submit")
    if state.branch != branch:
        raise UsageError(f"the worktree is on {state.branch!r}, not the session's branch {branch!r}; check it out")
    if state.dirty:
        print(dirty_refusal(worktree, state.changes), file=sys.stderr)
        return EXIT_REJECTED

    # The ids are keyed with the session's password: the same on a rerun, never one another session could send first.
    secret = config.nats_password
    try:
        await done_step(nc, config, done_flow.intent(session, secret=secret))
        _log_done()
        crash_point("gt_done.after_intent")
        # The rig's directory: its name, or ``<name>.<n>`` for a rig added again after its removal.
        home = os.environ.get("GT_RIG_HOME") or rig
        folder = done_flow.published_dir(Path(os.environ.get("GT_HOME", "")) / "rigs" / home, session)
        published = git.publish(worktree, branch, base, folder)
        head = published.head
        crash_point("gt_done.after_push")
        # It carries the hook lease as its fence (the CLI's send adds it inside a session).
        done = done_flow.merge_request(
            session=session, bead=bead, rig=rig, branch=branch, head=head, bundle=str(published.bundle), secret=secret
        )
        mr = await done_step(nc, config, done)
        crash_point("gt_done.after_mr")
        await done_step(nc, config, done_flow.finish(session, secret=secret))
    except (DoneError, git.GitError) as exc:
        return failed(exc, branch)
    mr_id = mr.id if mr is not None else None
    summary = {"session": session, "bead": bead, "branch": branch, "head": head, "merge_request": mr_id}
    return reported(
        args.json, summary, f"done: {branch} published at {head[:10]}, {{queued}} queued; session {session} ends"
    )
