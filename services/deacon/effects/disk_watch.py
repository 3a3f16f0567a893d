"""The disk-space alarm's measurements (adapter): free space of the watched paths, and what is left of the NATS
account's JetStream storage limit when it has one."""

from __future__ import annotations

import asyncio
import os
import shutil

import structlog

from services.deacon.plan.disk import Measurement
from shared.bus import streams
from shared.bus.connection import Connection
from shared.bus.errors import BusError

log = structlog.get_logger(__name__)


class Unreadable:
    """What could not be measured, and what was said about it: a path (or the account) is logged when it becomes
    unreadable and again only when its error changes, not at every check (every ``GT_DISK_CHECK_INTERVAL``);
    once readable again that is said too."""

    def __init__(self) -> None:
        self.said: dict[str, str] = {}

    def failed(self, what: str, error: str, event: str, **details: str) -> None:
        if self.said.get(what) == error:
            return
        self.said[what] = error
        log.warning(event, error=error, **details)

    def read(self, what: str, event: str, **details: str) -> None:
        if self.said.pop(what, None) is not None:
            log.info(event, **details)


ACCOUNT = ""
"""``Unreadable``'s key for the account's storage (no path is empty)."""


async def measure(nc: Connection, paths: tuple[str, ...], unreadable: Unreadable | None = None) -> list[Measurement]:
    """Each watched volume once (paths on the same device are one volume: the first path names it), then the
    account's storage. ``unreadable``: what earlier checks could not measure (a fresh one says every failure)."""
    said = unreadable if unreadable is not None else Unreadable()
    out: list[Measurement] = []
    devices: set[int] = set()
    for path in paths:
        try:
            device = (await asyncio.to_thread(os.stat, path)).st_dev
            usage = await asyncio.to_thread(shutil.disk_usage, path)
        except OSError as exc:
            said.failed(
                path,
                repr(exc),
                "disk_watch_unreadable",
                path=path,
                hint="a watched path (GT_DISK_WATCH, or GT_HOME) must exist and be readable by the deacon; said once",
            )
            continue
        said.read(path, "disk_watch_readable", path=path)
        if device in devices:
            continue
        devices.add(device)
        if usage.total > 0:
            free = 100.0 * usage.free / usage.total
            out.append(Measurement(what=f"the volume of {path}", free_percent=free, free_bytes=usage.free))
    try:
        storage = await streams.account_storage(nc)
    except (TimeoutError, BusError) as exc:
        said.failed(ACCOUNT, repr(exc), "disk_watch_account_unreadable")
        return out
    said.read(ACCOUNT, "disk_watch_account_readable")
    limit = storage.limit
    if limit > 0:  # -1: the account has no JetStream storage limit
        left = max(0, limit - storage.used)
        out.append(
            Measurement(what="the NATS account's JetStream storage", free_percent=100.0 * left / limit, free_bytes=left)
        )
    return out
