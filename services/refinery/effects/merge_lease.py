"""The rig's merge lease as this refinery holds it while it processes a batch: taken (over), renewed in KV,
released, and the check the merger's thread asks before it pushes (``fencing``: the lease's token against its
events in the log). The lease's events are built by ``shared.model.leases``; this module appends them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import structlog

from services.refinery.state import RefineryState
from shared.bus import lease_kv as lease_kv
from shared.bus.errors import BusError
from shared.bus.fencing import fence_error
from shared.bus.kv import Bucket
from shared.core.aio import pause
from shared.core.ids import merge_lease_name
from shared.model import leases as lease_state
from shared.model.commands import Fence
from shared.service import Service

log = structlog.get_logger(__name__)


class MergeLease:
    """The rigs' merge leases of ``service`` (held as ``service.instance``), each for ``ttl_s`` between renewals."""

    def __init__(self, service: Service[RefineryState], ttl_s: float) -> None:
        self.service = service
        self.ttl_s = ttl_s

    @property
    def holder(self) -> str:
        return self.service.instance

    def _kv(self) -> Bucket:
        assert self.service.nc is not None
        return Bucket(self.service.nc, self.service.config.lease_bucket)

    async def take(self, rig: str, now: datetime) -> int | None:
        """The rig's merge lease for this refinery (its token), taken over from any other holder; None when
        that failed (the lease moved meanwhile: the next reconcile looks again).

        Another holder is a former instance of this refinery: only the instance holding the activity key acts,
        and this one got the key only once the other had stopped acting (died, released it, or lost it). So its
        lease is taken over at once, not after its TTL, and the new token fences out whatever it left running."""
        name = merge_lease_name(rig)
        lease = self.service.projection.state.merge_leases.get(name)
        if lease is not None and lease.status == "held":
            if lease.holder == self.holder:
                return lease.token
            kv = self._kv()
            renewal, revision = await lease_kv.read(kv, name)
            # Marked first, so the former holder's renewals fail from now on (its pushes are checked too).
            last = lease_state.last_renewed(lease, renewal)
            if not await lease_kv.mark_expired(kv, name, lease.holder, lease.token, last, seen_revision=revision):
                return None
            lapsed = lease_state.due_to_expire(lease, renewal, now)
            log.warning(
                "merge_lease_taken_over", rig=rig, lease=name, previous=lease.holder, token=lease.token, lapsed=lapsed
            )
        acquired, token = lease_state.acquisition(lease, name, self.holder, self.ttl_s, now)
        if not await self.service.append_owed([acquired]):
            return None
        return token

    async def release(self, rig: str, token: int) -> None:
        lease = self.service.projection.state.merge_leases.get(merge_lease_name(rig))
        if lease is None or not lease.held_by(self.holder, token):
            return
        await self.service.append_owed([lease_state.release(lease)])

    async def renew(self, rig: str, token: int, lost: list[str]) -> None:
        """Renew while the batch is processed; a renewal refused (the lease lapsed and passed on) is recorded
        in ``lost`` and stops the push."""
        name = merge_lease_name(rig)
        every = self.ttl_s / 3
        while True:
            try:
                await lease_kv.renew(self._kv(), name, self.holder, token, self.service.clock())
            except lease_kv.LeaseLostError as exc:
                lost.append(exc.why)
                log.warning("merge_lease_lost", rig=rig, lease=name, token=token, why=exc.why)
                return
            except (BusError, TimeoutError) as exc:
                log.warning("merge_lease_not_renewed", rig=rig, error=repr(exc))
            await pause(every)

    def lost_check(self, rig: str, token: int, lost: list[str]) -> Callable[[], str | None]:
        """For the merger's thread: why this refinery may not push now (None: it may), asking the log."""
        loop = asyncio.get_running_loop()
        fence = Fence(lease=merge_lease_name(rig), token=token)
        service = self.service

        def check() -> str | None:
            if lost:
                return lost[0]
            if service.activity is None or not service.activity.may_act():
                # Paused (its activity key not renewed in time) or lost: a standby may be taking over.
                return "this refinery may not act now: its activity key is not renewed"
            assert service.nc is not None
            future = asyncio.run_coroutine_threadsafe(fence_error(service.nc, service.config.evt_stream, fence), loop)
            error = future.result(timeout=10)
            return error.message if error is not None else None

        return check
