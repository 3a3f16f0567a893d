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


async def measure(nc: Connection, paths: tuple[str, ...]) -> list[Measurement]:
    """Each watched volume once (paths on the same device are one volume: the first path names it), then the
    account's storage."""
    out: list[Measurement] = []
    devices: set[int] = set()
    for path in paths:
        try:
            device = (await asyncio.to_thread(os.stat, path)).st_dev
            usage = await asyncio.to_thread(shutil.disk_usage, path)
        except OSError as exc:
            log.warning("disk_watch_unreadable", path=path, error=repr(exc))
            continue
        if device in devices:
            continue
        devices.add(device)
        if usage.total > 0:
            free = 100.0 * usage.free / usage.total
            out.append(Measurement(what=f"the volume of {path}", free_percent=free, free_bytes=usage.free))
    try:
        storage = await streams.account_storage(nc)
    except (TimeoutError, BusError) as exc:
        log.warning("disk_watch_account_unreadable", error=repr(exc))
        return out
    limit = storage.limit
    if limit > 0:  # -1: the account has no JetStream storage limit
        left = max(0, limit - storage.used)
        out.append(
            Measurement(what="the NATS account's JetStream storage", free_percent=100.0 * left / limit, free_bytes=left)
        )
    return out
