"""`gt mq list|show|runners|retry|reject|resume` (the refinery's): the merge queue."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import msgspec

from gt.cli import render
from gt.cli.common import (
    EXIT_OK,
    Subcommands,
    UsageError,
    read,
    read_typed,
    send,
    show,
    show_reply,
)
from shared.bus.query import reply_of
from shared.core.config import TownConfig
from shared.core.errors import QueryError
from shared.core.terminal import escape_line, escape_text
from shared.model.commands import MergeQueueResume, MergeRequestReject, MergeRequestRetry
from shared.model.merge_requests import MergeRequest
from shared.model.queries import refinery
from shared.model.queries.refinery import PausedQueue
from shared.model.results import MergeQueueResult, MrResult

if TYPE_CHECKING:
    from shared.bus.connection import Connection


def register(sub: Subcommands) -> None:
    mq = sub.group("mq", "the merge queue: list, show, runners, retry, reject, resume", "mq_cmd")
    ml = mq.query(
        "list",
        _mq_list,
        help="merge requests in the order they were submitted, newest last (--rig: of one rig), and a line of "
        "runners, gate jobs and merges per hour",
    )
    ml.add_argument("--rig")
    ms = mq.query("show", _mq_show, help="one merge request, with the tail of a failed gate's output")
    ms.add_argument("id")
    runners = mq.query(
        "runners",
        _mq_runners,
        help="the gate runners (up or not, the job and gate each runs, jobs run), the gate jobs running and waiting "
        "with the merge requests they stack, merges per hour and gate minutes per merge (--rig: that rig's jobs "
        "and merges)",
    )
    runners.add_argument("--rig")
    mr_retry = mq.command(
        "retry",
        _mq_retry,
        help="put a failed, blocked, escalated or rejected merge request back in the queue; --rig R or --all: every "
        "escalated one (of rig R), once what refused them is fixed (a paused queue: `gt mq resume`)",
        precheck=_one_or_many_retries,
    )
    mr_retry.add_argument("id", nargs="?")
    retry_many = mr_retry.add_mutually_exclusive_group()
    retry_many.add_argument("--rig", help="every escalated merge request of this rig")
    retry_many.add_argument("--all", action="store_true", help="every escalated merge request of every rig")
    mr_reject = mq.command("reject", _mq_reject, help="take a merge request out of the queue for good")
    mr_reject.add_argument("id")
    mr_reject.add_argument("--reason", default="")
    mq_resume = mq.command(
        "resume",
        _mq_resume,
        help="resume a rig's paused merge queue once its cause is fixed (the target refused pushes, or a gate "
        "fails on the target itself); `gt mq list` says which are paused and why",
    )
    mq_resume.add_argument("rig")


async def _mq_list(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = refinery.Mrs(rig=args.rig or None)
    answer = await read(nc, config, query)
    mrs = mq_order(reply_of(query, answer))
    paused = [q for q in await read_typed(nc, config, refinery.PausedQueues()) if not args.rig or q.rig == args.rig]
    # A merged one shows the commit that landed (its branch rebased onto the target), not the one submitted.
    rows = [[m.id, m.rig, m.bead, m.branch, (m.merged_commit or m.head)[:10], m.status] for m in mrs]
    table = render.table(("MR", "RIG", "BEAD", "BRANCH", "HEAD", "STATUS"), rows, "the merge queue is empty")
    summary = [] if args.json else await _summary(nc, config, args.rig or None)
    text = "\n".join([*paused_lines(paused), table, *(["", *summary] if summary else [])])
    why = {q.rig: q.reason for q in paused}
    order = {m.id: index for index, m in enumerate(mrs)}
    shown = sorted(answer, key=lambda m: order[m["id"]])
    for m in shown:
        if m["rig"] in why:
            m["queue_paused"] = why[m["rig"]]  # --json: the pause on each of its rig's merge requests
    return show(args, shown, lambda _: text)


async def _summary(nc: Connection, config: TownConfig, rig: str | None) -> list[str]:
    """The board's line under the list; none from a refinery of a version without the board, nor for a rig it
    does not know (the list is empty then, as it always was)."""
    try:
        return [render.mq_summary(await read_typed(nc, config, refinery.Board(rig=rig)))]
    except QueryError as exc:
        if exc.code not in ("unknown_query", "not_found"):
            raise
        return []


def paused_lines(paused: list[PausedQueue]) -> list[str]:
    """One line per paused merge queue: the rig, why, and the command that resumes it."""
    return [
        f"merge queue of rig {escape_line(q.rig)} PAUSED: {escape_line(q.reason)} "
        f"(`gt mq resume {escape_line(q.rig)}` once fixed)"
        for q in paused
    ]


def mq_order(mrs: list[MergeRequest]) -> list[MergeRequest]:
    """In the order they were submitted, newest last (the refinery answers in its own order of work)."""
    return sorted(mrs, key=lambda mr: mr.submitted_at)


MR_SHOWN = (
    "id", "rig", "bead", "branch", "target", "head", "status", "attempts", "gate", "exit_code",
    "blocked_by", "merged_commit", "reason", "retries", "not_before",
)  # fmt: skip
"""The fields of a merge request `gt mq show` prints, a line each (its JSON has every one)."""


def mr_detail(mr: MergeRequest) -> str:
    shown = msgspec.to_builtins(mr)  # each field as its JSON carries it (times as ISO text)
    lines = [f"{k}: {escape_line(shown[k])}" for k in MR_SHOWN if shown[k] not in (None, "")]
    if mr.batch:
        lines.append(f"batch: {', '.join(escape_line(other) for other in mr.batch)}")
    if mr.tail:
        lines += ["", "last output:", escape_text(mr.tail)]
    return "\n".join(lines)


async def _mq_runners(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = refinery.Board(rig=args.rig or None)
    return show_reply(args, query, await read(nc, config, query), render.mq_board)


async def _mq_show(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    query = refinery.Mr(id=args.id)
    return show_reply(args, query, await read(nc, config, query), mr_detail)


def _one_or_many_retries(args: argparse.Namespace) -> None:
    """Checked before connecting: one merge request, or every escalated one of --rig R or --all."""
    many = args.rig is not None or args.all
    if many == (args.id is not None):
        raise UsageError("`gt mq retry` takes a merge request id, or --rig R, or --all (every escalated one)")
    if many and getattr(args, "cmd_id", None):
        raise UsageError("--id names one command: not with --rig or --all")


async def _mq_retry(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    def line(r: MrResult) -> str:
        return f"{r.id}: {r.status}"

    if args.id is not None:
        return await send(nc, args, config, MergeRequestRetry(id=args.id), line)
    mrs = mq_order(await read_typed(nc, config, refinery.Mrs(rig=args.rig)))
    escalated = [m.id for m in mrs if m.status == "escalated"]
    if not escalated:
        where = f" of rig {args.rig}" if args.rig else ""
        print(f"no escalated merge request{where}: nothing to retry")
        return EXIT_OK
    codes = [await send(nc, args, config, MergeRequestRetry(id=mr_id), line) for mr_id in escalated]
    return max(codes)


async def _mq_resume(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    def line(r: MergeQueueResult) -> str:
        if not r.changed:
            return f"merge queue of rig {r.rig}: not paused (nothing to resume)"
        return f"merge queue of rig {r.rig}: resumed (it was paused: {r.was or None})"

    return await send(nc, args, config, MergeQueueResume(rig=args.rig), line)


async def _mq_reject(nc: Connection, args: argparse.Namespace, config: TownConfig) -> int:
    cmd = MergeRequestReject(id=args.id, reason=args.reason)
    return await send(nc, args, config, cmd, lambda r: f"{r.id}: {r.status}")
