"""The deacon's KV sweep: after each ``gc.swept`` it purges the entries of dead things (released or expired
leases, old agent heartbeats, stopped service processes). KV entries are caches; the log keeps the record.

Each purge is a compare-and-set on the revision read: an entry written since (a renewal, a fresh heartbeat)
is left for the next sweep. No rollup: the buckets refuse them (anyone who may write one key could otherwise
wipe the bucket), so a compare-and-set delete, then a purge of that key's subject up to the delete marker.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js.client import JetStreamContext

from services.deacon.plan import gc
from services.deacon.state import DeaconState
from shared.config import TownConfig

log = structlog.get_logger(__name__)

READ_TIMEOUT_S = 30.0
ERR_WRONG_LAST_SEQUENCE = 10071


class Purged(msgspec.Struct, kw_only=True):
    leases: int = 0
    heartbeats: int = 0
    services: int = 0


async def read_entries(js: JetStreamContext, bucket: str) -> gc.KvEntries:
    """Every live key of ``bucket`` with its value and revision (deleted and purged keys left out)."""
    kv = await js.key_value(bucket)
    out: gc.KvEntries = {}
    watcher = await kv.watchall(ignore_deletes=True)
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            async for entry in watcher:
                if entry is None:  # everything the bucket held when the watch started
                    break
                if entry.operation in ("DEL", "PURGE") or entry.value is None:
                    out.pop(entry.key, None)
                else:
                    out[entry.key] = (entry.value, int(entry.revision or 0))
    finally:
        with contextlib.suppress(nats.errors.Error):
            await watcher.stop()  # type: ignore[no-untyped-call]
    return out


async def purge(js: JetStreamContext, bucket: str, key: str, revision: int) -> bool:
    """Purge ``key`` (all its revisions) unless it was written after ``revision``; True when purged.

    The buckets refuse rollups (``shared.bus.topology.rollup_free_buckets``), so no purge marker: a delete
    marker written only while ``revision`` is still the key's last (compare-and-set), then a purge of the
    key's subject up to and including that marker. A value written in between has a higher sequence and
    stays. Dying between the two steps leaves only the delete marker: the key reads as absent, and the marker
    ages out with the bucket's TTL."""
    marker = await delete_unless_written_since(js, bucket, key, revision)
    if marker is None:
        return False
    await js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}", seq=marker + 1)
    return True


async def delete_unless_written_since(js: JetStreamContext, bucket: str, key: str, revision: int) -> int | None:
    """Write a delete marker for ``key`` if ``revision`` is still its last; the marker's sequence, or None."""
    headers = {"KV-Operation": "DEL", "Nats-Expected-Last-Subject-Sequence": str(revision)}
    try:
        ack = await js.publish(f"$KV.{bucket}.{key}", b"", headers=headers, stream=f"KV_{bucket}")
    except nats.js.errors.APIError as exc:
        if exc.err_code == ERR_WRONG_LAST_SEQUENCE:
            return None
        raise
    return int(ack.seq)


async def _purge_all(js: JetStreamContext, bucket: str, found: list[tuple[str, int]]) -> int:
    purged = 0
    for key, revision in found:
        if await purge(js, bucket, key, revision):
            purged += 1
    return purged


async def sweep_buckets(js: JetStreamContext, config: TownConfig, state: DeaconState, cutoff: datetime) -> Purged:
    """Purge the dead entries of the lease, agent heartbeat and service heartbeat buckets; how many of each.
    A bucket that is not there (nothing wrote to it yet) has nothing to purge."""
    out = Purged()
    for bucket, field in (
        (config.lease_bucket, "leases"),
        (config.heartbeat_bucket, "heartbeats"),
        (config.service_bucket, "services"),
    ):
        try:
            entries = await read_entries(js, bucket)
        except nats.js.errors.BucketNotFoundError:
            continue
        if field == "leases":
            found = gc.select_leases(state.leases, entries, cutoff)
        elif field == "heartbeats":
            found = gc.select_heartbeats(entries, cutoff)
        else:
            found = gc.select_services(state.liveness, entries, cutoff)
        setattr(out, field, await _purge_all(js, bucket, found))
    log.info(
        "gc_kv_purged",
        cutoff=cutoff.isoformat(),
        leases=out.leases,
        heartbeats=out.heartbeats,
        services=out.services,
    )
    return out
