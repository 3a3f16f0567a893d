"""Holding a service scope's activity key in the ``GT_ACTIVE`` KV bucket: the adapter around ``shared.model.activity``.

``acquire`` returns once this instance is the active one (until then it is a standby, polling the key);
``hold`` renews it and raises ``ActivityLostError`` once another instance holds it; ``wait_active`` is the
guard every write awaits first.

A holder that could not renew within its deadline is *paused*, not lost: the key may be unreachable for
everyone (a NATS leader election after a node died takes seconds), and nobody can take it over without
writing it. A paused holder writes nothing and keeps renewing with compare-and-set on its own last revision;
when one lands, nobody wrote the key in between, so nobody else acted, and it resumes. When the key changed,
another instance took over and the holder is lost for good. So an instance that was frozen (SIGSTOP, a long
GC pause, a suspended VM) and wakes up after its deadline writes nothing until it knows it is still the one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.core import logging as gt_logging
from shared.core import subjects
from shared.core.aio import pause, raise_if_cancelling, wait_event
from shared.core.errors import ActivityLostError
from shared.host import processes
from shared.model import activity
from shared.model.activity import Holder, Seen, Take, Timing

log = structlog.get_logger(__name__)

STARTING, STANDBY, ACTIVE, PAUSED, LOST = "starting", "standby", "active", "paused", "lost"
_KV_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, TimeoutError)
_RUNNING: set[str] = set()
"""Instances of this process whose service still runs: a holder in this very process that is not among them has
ended (tests run several instances in one process, one after the other or side by side)."""


class ActivityKeeper:
    """One instance's side of its scope's key. Roles: starting -> standby -> active <-> paused -> lost (or
    stopped). Paused is active past its deadline: it holds the key but may not act until it renewed it."""

    def __init__(
        self,
        nc: Connection,
        bucket: str,
        *,
        identity: str,
        instance: str,
        ttl_s: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._js = nc.jetstream()
        self._bucket = bucket
        self.identity = identity
        self.key = subjects.scope_tokens(identity)
        """The scope's key in the bucket (a gate runner's ``runner.<name>``: one token for its name, so that the
        runners' shared NATS user may write their keys and no other scope's)."""
        self.instance = instance
        self.timing = Timing(ttl_s=ttl_s)
        self._clock = clock
        self._monotonic = monotonic
        self._kv: KeyValue | None = None
        me = processes.ref_of(os.getpid())
        self._pid_started = me.started if me is not None else 0.0
        self._machine = processes.pid_namespace_id()
        self._role = STARTING
        self._revision = 0
        self._deadline = 0.0
        self._since: datetime | None = None
        self._lost = asyncio.Event()
        self._why = ""
        self.holder: Holder | None = None
        """Who holds the key while this instance stands by (None: nobody, or unreadable)."""
        self.took_over_from: str | None = None
        _RUNNING.add(instance)

    def close(self) -> None:
        """The service's run ended (after ``release``, or after a failure): it acts no more."""
        _RUNNING.discard(self.instance)
        if self._role == ACTIVE:
            self._role = STARTING

    # ---- what the rest of the service asks -----------------------------------------------------

    @property
    def role(self) -> str:
        if self._role == ACTIVE and self._monotonic() >= self._deadline:
            return PAUSED  # past its deadline (a KV outage, or frozen): may not act until renewed
        return self._role

    @property
    def active_since(self) -> datetime | None:
        return self._since if self._role == ACTIVE else None

    def may_act(self) -> bool:
        return self._role == ACTIVE and self._monotonic() < self._deadline

    @map_errors
    async def wait_active(self) -> None:
        """Return once this instance may act; raise ``ActivityLostError`` when it may not act again (a standby,
        or another instance holds the key). Awaited before every write: while paused it waits for the
        renewal loop to renew or lose the key."""
        while not self.may_act():
            if self._role != ACTIVE:
                why = self._why or f"this instance is {self._role}, not the active one"
                raise ActivityLostError(self.identity, why)
            await wait_event(self._lost, self.timing.retry_every)

    # ---- standby -------------------------------------------------------------------------------

    @map_errors
    async def acquire(self) -> None:
        """Stand by until this instance holds the key; returns once it is the active one."""
        seen: Seen | None = None
        announced: str | None = None
        waited_from = self._monotonic()
        while True:
            raise_if_cancelling()
            try:
                holder, revision = await self._read()
            except _KV_ERRORS as exc:
                # The bucket not answering yet is expected while a fresh cluster forms (info), not once it lasts.
                quiet = gt_logging.forming(waited_from, self._monotonic())
                (log.info if quiet else log.warning)("activity_read_failed", identity=self.identity, error=repr(exc))
                await pause(self.timing.poll_every)
                continue
            now = self._monotonic()
            seen = activity.observe(seen, holder, revision, now)
            gone = holder is not None and self._gone(holder)
            decision = activity.decide(seen, now, me=self.instance, holder_gone=gone, own_ttl_s=self.timing.ttl_s)
            if isinstance(decision, Take):
                if await self._take(decision, holder):
                    log.info(
                        "activity_acquired",
                        identity=self.identity,
                        why=decision.why,
                        took_over_from=self.took_over_from,
                        waited_s=round(self._monotonic() - waited_from, 3),
                    )
                    return
                continue
            self._role = STANDBY
            self.holder = holder
            current = holder.instance if holder is not None else "?"
            if announced != current:
                announced = current
                log.info(
                    "standby",
                    identity=self.identity,
                    holder=current,
                    host=holder.host if holder else None,
                    lapses_in_s=round(decision.until - now, 1),
                )
            await pause(min(self.timing.poll_every, max(0.01, decision.until - now)))

    async def _take(self, decision: Take, holder: Holder | None) -> bool:
        sent = self._monotonic()
        since_before = self._since
        self._since = since_before or self._clock()  # the tenure's start, as written into the key
        try:
            revision = await self._write(decision.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            self._since = since_before
            return False  # someone else wrote it first: read again
        except _KV_ERRORS as exc:
            self._since = since_before
            log.warning("activity_take_failed", identity=self.identity, error=repr(exc))
            await pause(self.timing.poll_every)
            return False
        self.took_over_from = holder.instance if holder is not None and holder.instance != self.instance else None
        self._revision = revision
        self._deadline = activity.deadline(sent, self.timing)
        self._role = ACTIVE
        self.holder = None
        return True

    # ---- active --------------------------------------------------------------------------------

    @map_errors
    async def hold(self) -> None:
        """Renew the key until cancelled; raises ``ActivityLostError`` once another instance holds it. Past
        its deadline the instance is paused (``wait_active`` blocks every write) until a renewal lands."""
        next_at = self._monotonic() + self.timing.renew_every
        paused_at: float | None = None
        while True:
            now = self._monotonic()
            if self._lost.is_set():
                raise ActivityLostError(self.identity, self._why)
            if now >= self._deadline and paused_at is None:
                paused_at = now
                log.warning(
                    "activity_paused",
                    identity=self.identity,
                    why=f"not renewed within {self.timing.stop_after:.1f}s of its last renewal",
                )
            if now < next_at:
                wake_at = next_at if paused_at is not None else min(next_at, self._deadline)
                await wait_event(self._lost, wake_at - now)
                continue
            sent = self._monotonic()
            try:
                # Never past the deadline: a renewal still hanging then cannot make the instance act longer.
                # Once paused, a renewal may take its time: the instance does not act until it lands.
                limit = self._deadline - sent if paused_at is None else self.timing.renew_every
                async with asyncio.timeout(max(0.01, limit)):
                    revision = await self._renew()
            except _KV_ERRORS as exc:
                log.warning("activity_renewal_failed", identity=self.identity, error=repr(exc))
                next_at = self._monotonic() + self.timing.retry_every
                continue
            if revision is None:
                next_at = self._monotonic()  # our own earlier write had landed: renew once more, timed
                continue
            self._revision = revision
            self._deadline = activity.deadline(sent, self.timing)
            next_at = sent + self.timing.renew_every
            if paused_at is not None:
                log.info("activity_resumed", identity=self.identity, paused_s=round(self._monotonic() - paused_at, 3))
                paused_at = None

    async def _renew(self) -> int | None:
        """The new revision; None when the key held our own write already (a lost reply). Raises
        ``ActivityLostError`` when another instance holds it."""
        try:
            return await self._write(self._revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        holder, revision = await self._read()
        if holder is not None and holder.instance == self.instance and not holder.released:
            self._revision = revision
            return None
        other = f"{holder.instance} on {holder.host}" if holder is not None else "nobody (deleted or unreadable)"
        raise self._lose(f"the key changed under it: {other} holds it now")

    @map_errors
    async def release(self) -> None:
        """After a clean stop: mark the key released, so a standby takes over after the margin instead of the
        whole TTL. Only while this instance still holds it (compare-and-set); errors are logged, not raised."""
        if self.role != ACTIVE:
            return
        self._role = STARTING
        try:
            async with asyncio.timeout(max(0.5, self.timing.renew_every)):
                try:
                    await self._write(self._revision, released=True)
                except nats.js.errors.KeyWrongLastSequenceError:
                    # A renewal cancelled by the stop may have landed after all: still ours, at its revision?
                    holder, revision = await self._read()
                    if holder is None or holder.instance != self.instance:
                        raise
                    await self._write(revision, released=True)
        except _KV_ERRORS as exc:  # a wrong last sequence too: then it is no longer ours to release
            log.warning("activity_release_failed", identity=self.identity, error=repr(exc))
            return
        log.info("activity_released", identity=self.identity)

    def _lose(self, why: str) -> ActivityLostError:
        """Stop being the active one, for good; returns the error for the caller to raise."""
        if self._role != LOST:
            log.error("activity_lost", identity=self.identity, why=why)
        self._role = LOST
        self._why = why
        self._lost.set()
        return ActivityLostError(self.identity, why)

    # ---- KV ------------------------------------------------------------------------------------

    async def _bucket_kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._js.key_value(self._bucket)
        return self._kv

    async def _read(self) -> tuple[Holder | None, int]:
        """The key's holder (None: unreadable) and revision (0: absent or deleted)."""
        kv = await self._bucket_kv()
        try:
            async with asyncio.timeout(max(1.0, self.timing.renew_every)):
                entry = await kv.get(self.key)
        except nats.js.errors.KeyNotFoundError:
            return None, 0
        return activity.decode(entry.value), int(entry.revision or 0)

    async def _write(self, last: int, *, released: bool = False) -> int:
        now = self._clock()
        holder = Holder(
            identity=self.identity,
            instance=self.instance,
            host=socket.gethostname(),
            pid=os.getpid(),
            pid_started=self._pid_started,
            machine=self._machine,
            ttl_s=self.timing.ttl_s,
            since=self._since or now,
            renewed_at=now,
            released=released,
        )
        kv = await self._bucket_kv()
        data = activity.encode(holder)
        if last:
            return int(await kv.update(self.key, data, last=last))
        return int(await kv.create(self.key, data))

    def _gone(self, holder: Holder) -> bool:
        """The holder is known to act no more: it is on this machine (same pids) and that pid with that start
        time is not alive, or it is an instance of this very process whose service has ended."""
        if not holder.machine or holder.machine != self._machine:
            return False
        if holder.pid == os.getpid() and abs(holder.pid_started - self._pid_started) < 1.0:
            return holder.instance not in _RUNNING
        return not processes.is_alive(processes.ProcessRef(pid=holder.pid, started=holder.pid_started))
