"""What the refinery knows: merge requests, and the beads and rigs they may refer to. Plain data."""

from __future__ import annotations

from datetime import datetime

import msgspec


class MergeRequest(msgspec.Struct, kw_only=True, gc=False):
    id: str
    bead: str
    rig: str
    branch: str
    target: str
    head: str
    priority: int = 2
    session: str | None = None
    status: str = "queued"
    submitted_at: datetime
    version: int = 0


class RefineryState(msgspec.Struct, kw_only=True):
    mrs: dict[str, MergeRequest] = {}
    bead_rigs: dict[str, str | None] = {}
    """Work beads by id -> the rig they are slung to (None: not slung yet)."""
    rigs: dict[str, str] = {}
    """Rig -> its base branch (where merges go unless a merge request names another target)."""
