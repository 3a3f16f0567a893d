"""Garbage collection commands (owner: deacon)."""

from __future__ import annotations

import math
from typing import ClassVar

from shared.model.commands.base import Command, invalid
from shared.model.results import GcResult

MAX_GC_TTL_S = 10 * 366 * 24 * 3600.0


class GcSweep(Command[GcResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sweep the projections now: what finished more than ``ttl_s`` seconds ago leaves them (default: the
    deacon's ``GT_GC_TTL``). The log is never edited. Accepted with the sweep's ``cutoff`` and ``ttl_s``."""

    SUBJECT: ClassVar[str] = "gt.cmd.gc.sweep"
    OWNER: ClassVar[str] = "deacon"
    ttl_s: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.ttl_s is not None and not (math.isfinite(self.ttl_s) and 0 <= self.ttl_s <= MAX_GC_TTL_S):
            raise invalid(f"`ttl_s` must be between 0 and {MAX_GC_TTL_S:g} seconds, got {self.ttl_s:g}")

    def ordering_key(self) -> str | None:
        return "gc"


GC_COMMANDS: tuple[type[Command], ...] = (GcSweep,)
