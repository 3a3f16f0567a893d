"""What follows the log for a service: the surface the base, the query server and the command intake use of it."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Follower(Protocol):
    """What follows the log for a service: ``shared.bus.reader.EventReader`` (a consumer of its own, the whole log) or
    ``shared.bus.direct_reader.DirectReader`` (batched direct gets of the subjects it folds)."""

    last_seq: int
    """The stream sequence applied (or read past) up to."""
    pending: int
    caught_up: asyncio.Event
    resyncs: int
    gaps: int

    @property
    def stream(self) -> str: ...

    async def wait_for_seq(self, seq: int, timeout: float | None = None) -> None: ...

    async def stream_last_seq(self) -> int: ...

    async def run(self) -> None: ...
