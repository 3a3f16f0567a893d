"""Carrying out what an outcome settles (``plan.settle.Settlement``): the branch published or deleted in the rig's
repository, the follow-up commands sent, the events appended, in the settlement's order; and the bead closes
this refinery has on their way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from services.refinery.effects import merger
from services.refinery.plan import Settlement
from services.refinery.state import MergeRequest
from shared.bus.commands import StoreCommand
from shared.core.faults import crash_point
from shared.model.commands import BeadClose
from shared.model.decision import NewEvent

log = structlog.get_logger(__name__)

Append = Callable[[list[NewEvent]], Awaitable[int]]


class Figures(msgspec.Struct, kw_only=True):
    """What the refinery settled, for its status (``gt status``)."""

    merged: int = 0
    failed: int = 0
    conflicted: int = 0


class Settler:
    def __init__(self, store: StoreCommand, append: Append) -> None:
        self.store = store
        self.append = append
        self.figures = Figures()
        self.closing: set[str] = set()
        """Merge requests whose bead's close was sent by this process (not sent again until it failed)."""

    async def run(self, settlement: Settlement, mr: MergeRequest, paths: merger.Paths) -> None:
        """Carry ``settlement`` of ``mr`` out, in its order (``Settlement``)."""
        if settlement.publish_branch:
            await asyncio.to_thread(merger.publish_branch, paths, mr)
        events = settlement.events
        for command in settlement.commands:
            stored = await self.store(command)
            if command.cmd_id is not None and stored.cmd_id != command.cmd_id:
                events = settlement.sent_under(command.cmd_id, stored.cmd_id)
        await self.record(settlement, events)
        if settlement.close is not None:
            crash_point("refinery.after_merged")
            await self.close(mr.id, settlement.close)
            crash_point("refinery.after_bead_close")
        if settlement.delete_branch:
            await asyncio.to_thread(merger.delete_branch, paths, mr.branch)

    async def record(self, settlement: Settlement, events: list[NewEvent] | None = None) -> int:
        """Append the settlement's events one after the other (in order: each on its own), then log and count
        it; how many were stored."""
        stored = 0
        for event in settlement.events if events is None else events:
            stored += await self.append([event])
        match settlement.counted:
            case "merged":
                self.figures.merged += 1
            case "failed":
                self.figures.failed += 1
            case "conflicted":
                self.figures.conflicted += 1
        for line in settlement.logs:
            (log.warning if line.level == "warning" else log.info)(line.event, **line.fields)
        return stored

    async def close(self, mr_id: str, command: BeadClose) -> None:
        """Send a merged merge request's bead's close, once per process unless it failed."""
        self.closing.add(mr_id)
        try:
            await self.store(command)
        except BaseException:
            # Not sent: the next reconcile sends it again (plan.beads_to_close), instead of taking it as on its way.
            self.closing.discard(mr_id)
            raise
