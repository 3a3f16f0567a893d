"""The deacon's watch over services and leases: the adapter around the pure ``plan.liveness`` and the lease
record's rules (``shared.model.leases``: when a held lease lapsed, the expiry event).

Both KV buckets (service heartbeats, lease renewals) are followed with a KV watch, so a tick reads memory, not
NATS: with a thousand live leases a tick is a loop over a dict. What a tick owes is stored through the
service's ``append_owed`` (each event with its aggregate's expected sequence, so two deacons never both expire a
lease or record the same down).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

import structlog

from services.deacon.plan import liveness
from services.deacon.state import LeaseState, LivenessState
from shared.bus import lease_kv as lease_kv
from shared.bus.commands import StoreCommand
from shared.bus.connection import Connection
from shared.bus.kv import Bucket, BucketMirror
from shared.model import heartbeats
from shared.model.commands import EscalationRaise
from shared.model.decision import NewEvent
from shared.model.heartbeats import ServiceHeartbeat
from shared.model.leases import Renewal, due_to_expire, expiry, last_renewed

log = structlog.get_logger(__name__)

AppendOwed = Callable[[list[NewEvent]], Awaitable[int]]
"""Appends events the deacon decided by itself (``Service.append_owed``); how many were stored."""


class Supervision:
    def __init__(
        self,
        *,
        service_bucket: str,
        lease_bucket: str,
        liveness_policy: liveness.Policy,
        append_owed: AppendOwed,
        store: StoreCommand,
        clock: Callable[[], datetime],
    ) -> None:
        self.services = BucketMirror(service_bucket)
        self.renewals = BucketMirror(lease_bucket)
        self.policy = liveness_policy
        self._append_owed = append_owed
        self._store = store
        self._clock = clock
        self._lease_kv: Bucket | None = None
        self._watching_since: datetime | None = None
        self.expired = 0

    def start(self, tg: asyncio.TaskGroup, nc: Connection) -> None:
        self._lease_kv = Bucket(nc, self.renewals.name)
        self._watching_since = self._clock()
        tg.create_task(self.services.run(nc), name="watch-services")
        tg.create_task(self.renewals.run(nc), name="watch-leases")

    def beats(self) -> list[ServiceHeartbeat]:
        out = []
        for key, (value, _rev) in self.services.entries.items():
            beat = heartbeats.decode(value)
            if beat is None:
                log.warning("heartbeat_unreadable", key=key)
                continue
            out.append(beat)
        return out

    async def check_services(self, state: LivenessState) -> None:
        if not self.services.ready.is_set() or self._watching_since is None:
            return
        owed = liveness.plan(state, self.beats(), self._clock(), self._watching_since, self.policy)
        if owed.events:
            await self._append_owed(owed.events)
            for new in owed.events:
                log.info(new.payload.TYPE.replace(".", "_"), service=new.payload.aggregate_id())
        for esc in owed.escalations:
            source = f"deacon/{esc.service}"
            await self._store(
                EscalationRaise(
                    severity="high",
                    message=esc.message,
                    source=source,
                    resolved_when=[f"service:{esc.service}"],  # closed by the mayor once it is up again
                    cmd_id=esc.command_id,
                )
            )

    def renewal_of(self, lease: str) -> tuple[Renewal | None, int]:
        found = self.renewals.entries.get(lease)
        if found is None:
            return None, 0
        return lease_kv.decode_renewal(found[0]), found[1]

    async def expire_leases(self, state: LeaseState) -> int:
        """Expire every held lease whose TTL passed since its last renewal; how many."""
        if not self.renewals.ready.is_set():
            return 0
        now = self._clock()
        owed: list[NewEvent] = []
        for lease in state.leases.values():
            renewal, revision = self.renewal_of(lease.name)
            if not due_to_expire(lease, renewal, now):
                continue
            if renewal is None or not renewal.expired or renewal.token != lease.token:
                # Mark first: a renewal that lands before the mark keeps the lease, one after it is refused.
                assert self._lease_kv is not None
                last = last_renewed(lease, renewal)
                marked = await lease_kv.mark_expired(
                    self._lease_kv, lease.name, lease.holder, lease.token, last, seen_revision=revision
                )
                if not marked:
                    continue  # renewed meanwhile: looked at again next tick
            owed.append(expiry(lease, renewal))
        if owed:
            stored = await self._append_owed(owed)
            self.expired += stored
            for new in owed:
                log.info("lease_expired", lease=new.payload.aggregate_id())
        return len(owed)
