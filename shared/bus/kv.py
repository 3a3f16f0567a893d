"""A KV bucket of the town: what changes too often to be an event and is never the truth of a decision (lease
renewals, agent and service heartbeats, held-command records, plugin marks; docs/architecture.md, "The parts").

``Bucket`` is the port: read a key with its revision, write it, compare-and-set it, read or follow every key.
What a caller expects is answered as a value (a key that is not there: None; a compare-and-set that lost:
False); a failure of NATS raises ``BusError`` or ``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import NamedTuple

import nats.errors
import nats.js.errors
import structlog
from nats.js.kv import KeyValue

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.bus.topology import ERR_STREAM_NAME_IN_USE, create_kv, ensure_heartbeat_bucket
from shared.core.aio import pause, raise_if_cancelling
from shared.core.config import TownConfig
from shared.core.errors import NoStreamError

log = structlog.get_logger(__name__)

READ_TIMEOUT_S = 30.0
WATCH_RETRY_S = 1.0
ERR_WRONG_LAST_SEQUENCE = 10071


class Entry(NamedTuple):
    """A key's value and the revision that wrote it (the bucket stream's sequence)."""

    value: bytes
    revision: int


class Bucket:
    """One KV bucket, opened on first use."""

    def __init__(self, nc: Connection, name: str, *, keys_only: bool = False) -> None:
        """``keys_only``: open it without asking for its stream's info. A polecat session may not (``STREAM.INFO``
        of a bucket lists every key), only put and direct-get its own keys (shared/model/session_identity.py); the
        buckets answer direct gets (``topology.ensure_kv``)."""
        self.name = name
        self._nc = nc
        self._keys_only = keys_only
        self._kv: KeyValue | None = None

    @map_errors
    async def open(self) -> None:
        """Open it now (raises ``BusError`` when it is not there or NATS fails); every other call opens it too."""
        await self._open()

    async def _open(self) -> KeyValue:
        if self._kv is None:
            js = self._nc.jetstream()
            if self._keys_only:
                self._kv = KeyValue(
                    name=self.name, stream=f"KV_{self.name}", pre=f"$KV.{self.name}.", js=js, direct=True
                )
            else:
                self._kv = await js.key_value(self.name)
        return self._kv

    @map_errors
    async def get(self, key: str) -> Entry | None:
        """The key's value and revision; None when it is not there (never written, deleted or aged out)."""
        kv = await self._open()
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return Entry(entry.value or b"", int(entry.revision or 0))

    @map_errors
    async def put(self, key: str, value: bytes) -> int:
        """Write the key whatever it holds; the new revision."""
        return int(await (await self._open()).put(key, value))

    @map_errors
    async def create(self, key: str, value: bytes) -> bool:
        """Write the key only if it is not there; False when it is."""
        try:
            await (await self._open()).create(key, value)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    @map_errors
    async def update(self, key: str, value: bytes, *, last: int) -> bool:
        """Write the key only if ``last`` is still its revision; False when someone wrote it since."""
        try:
            await (await self._open()).update(key, value, last=last)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    @map_errors
    async def delete(self, key: str) -> None:
        await (await self._open()).delete(key)

    @map_errors
    async def entries(self, *, timeout: float = READ_TIMEOUT_S) -> dict[str, Entry]:
        """Every live key with its value and revision (deleted and purged keys left out); {} when the bucket is
        not there (nothing wrote to it yet)."""
        try:
            kv = await self._open()
        except nats.js.errors.BucketNotFoundError:
            return {}
        out: dict[str, Entry] = {}
        watcher = await kv.watchall(ignore_deletes=True)
        try:
            async with asyncio.timeout(timeout):
                async for entry in watcher:
                    if entry is None:  # everything the bucket held when the watch started
                        break
                    if entry.operation in ("DEL", "PURGE") or entry.value is None:
                        out.pop(entry.key, None)
                    else:
                        out[entry.key] = Entry(entry.value, int(entry.revision or 0))
        finally:
            with contextlib.suppress(nats.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]
        return out

    @map_errors
    async def purge_unless_written_since(self, key: str, revision: int) -> bool:
        """Purge ``key`` (all its revisions) unless it was written after ``revision``; True when purged.

        The buckets refuse rollups (``topology.rollup_free_buckets``), so no purge marker: a delete marker written
        only while ``revision`` is still the key's last (compare-and-set), then a purge of the key's subject up to
        and including that marker. A value written in between has a higher sequence and stays. Dying between the
        two steps leaves only the delete marker: the key reads as absent, and the marker ages out with the
        bucket's TTL."""
        marker = await self.delete_unless_written_since(key, revision)
        if marker is None:
            return False
        await self._nc.jetstream().purge_stream(f"KV_{self.name}", subject=f"$KV.{self.name}.{key}", seq=marker + 1)
        return True

    @map_errors
    async def delete_unless_written_since(self, key: str, revision: int) -> int | None:
        """Write a delete marker for ``key`` if ``revision`` is still its last; the marker's sequence, or None."""
        headers = {"KV-Operation": "DEL", "Nats-Expected-Last-Subject-Sequence": str(revision)}
        try:
            ack = await self._nc.jetstream().publish(
                f"$KV.{self.name}.{key}", b"", headers=headers, stream=f"KV_{self.name}"
            )
        except nats.js.errors.APIError as exc:
            if exc.err_code == ERR_WRONG_LAST_SEQUENCE:
                return None
            raise
        return int(ack.seq)

    @map_errors
    async def purge_keys(self, prefix: str) -> None:
        """Forget every key under ``prefix`` (``<prefix>.>``) at once: a filtered purge of the bucket's stream,
        since the buckets refuse rollups."""
        await self._nc.jetstream().purge_stream(f"KV_{self.name}", subject=f"$KV.{self.name}.{prefix}.>")


@map_errors
async def open_or_create(nc: Connection, name: str, *, ttl_s: float, replicas: int) -> Bucket:
    """The bucket, created when missing, refusing rollups (``topology.kv_stream_config``): for a bucket clients
    share and create themselves (the plugins' marks), where a rollup to any key would wipe every client's keys.
    An existing one is brought to that by the town's provisioning."""
    js = nc.jetstream()
    bucket = Bucket(nc, name)
    try:
        await bucket._open()
    except nats.js.errors.BucketNotFoundError:
        pass
    else:
        return bucket
    try:
        await create_kv(js, name, ttl=ttl_s, replicas=replicas)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != ERR_STREAM_NAME_IN_USE:
            raise
        return bucket  # another client created it first
    log.info("bucket_created", bucket=name, ttl_s=ttl_s)
    return bucket


@map_errors
async def put_agent_heartbeat(nc: Connection, config: TownConfig, session: str, value: bytes) -> None:
    """A polecat session's heartbeat, its own key of the agent heartbeat bucket; the bucket is created when it is
    not there yet (a town whose services have not provisioned it: only a user who may create it can)."""
    bucket = Bucket(nc, config.heartbeat_bucket, keys_only=True)
    try:
        await bucket.put(session, value)
    except NoStreamError:
        await ensure_heartbeat_bucket(nc, config)
        await bucket.put(session, value)


class BucketMirror:
    """The latest value and revision of every key of a KV bucket, kept current by a watch: a reader of many keys
    reads memory, not NATS."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.entries: dict[str, Entry] = {}
        self.ready = asyncio.Event()
        """Set once the watch delivered everything the bucket held when it started."""

    @map_errors
    async def run(self, nc: Connection) -> None:
        """Follow the bucket until cancelled; a failed watch is opened again."""
        while True:
            try:
                kv = await nc.jetstream().key_value(self.name)
                watcher = await kv.watchall()
                try:
                    async for entry in watcher:
                        raise_if_cancelling()
                        self._apply(entry)
                finally:
                    with contextlib.suppress(nats.errors.Error):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("bucket_watch_failed", bucket=self.name, error=repr(exc))
            await pause(WATCH_RETRY_S)

    def _apply(self, entry: KeyValue.Entry | None) -> None:
        if entry is None:  # the watch has delivered what the bucket held at its start
            self.ready.set()
            return
        if entry.operation in ("DEL", "PURGE") or entry.value is None:
            self.entries.pop(entry.key, None)
        else:
            self.entries[entry.key] = Entry(entry.value, int(entry.revision or 0))
