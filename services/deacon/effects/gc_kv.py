"""The deacon's KV sweep: after each ``gc.swept`` it purges the entries of dead things (released or expired
leases, old agent heartbeats, stopped service processes). KV entries are caches; the log keeps the record.

Each purge is a compare-and-set on the revision read (``Bucket.purge_unless_written_since``): an entry written
since (a renewal, a fresh heartbeat) is left for the next sweep.
"""

from __future__ import annotations

from datetime import datetime

import msgspec
import structlog

from services.deacon.plan import gc
from services.deacon.state import DeaconState
from shared.bus.connection import Connection
from shared.bus.kv import Bucket
from shared.core.config import TownConfig

log = structlog.get_logger(__name__)


class Purged(msgspec.Struct, kw_only=True):
    leases: int = 0
    heartbeats: int = 0
    services: int = 0


async def _purge_all(bucket: Bucket, found: list[tuple[str, int]]) -> int:
    purged = 0
    for key, revision in found:
        if await bucket.purge_unless_written_since(key, revision):
            purged += 1
    return purged


async def sweep_buckets(nc: Connection, config: TownConfig, state: DeaconState, cutoff: datetime) -> Purged:
    """Purge the dead entries of the lease, agent heartbeat and service heartbeat buckets; how many of each.
    A bucket that is not there (nothing wrote to it yet) has nothing to purge."""
    out = Purged()
    for name, field in (
        (config.lease_bucket, "leases"),
        (config.heartbeat_bucket, "heartbeats"),
        (config.service_bucket, "services"),
    ):
        bucket = Bucket(nc, name)
        entries = await bucket.entries()
        if field == "leases":
            found = gc.select_leases(state.leases, entries, cutoff)
        elif field == "heartbeats":
            found = gc.select_heartbeats(entries, cutoff)
        else:
            found = gc.select_services(state.liveness, entries, cutoff)
        setattr(out, field, await _purge_all(bucket, found))
    log.info(
        "gc_kv_purged",
        cutoff=cutoff.isoformat(),
        leases=out.leases,
        heartbeats=out.heartbeats,
        services=out.services,
    )
    return out
