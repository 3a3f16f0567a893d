"""Projection snapshots in a JetStream object store. A snapshot is a cache: losing it only costs a replay.

Objects are written with nats-py's object store (so ``nats object get`` can read them) but read back with
a chunk reader of our own: nats-py 2.16 concatenates chunks with ``bytes +=``, which is quadratic and
took seconds for a 30 MiB snapshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from typing import Any

import nats.errors
import nats.js.errors
import structlog
from nats.js.api import ConsumerConfig, DeliverPolicy, ObjectStoreConfig, StorageType
from nats.js.object_store import ObjectStore

from shared.bus.connection import Connection
from shared.bus.errors import map_errors
from shared.core.subjects import parse_js_reply

log = structlog.get_logger(__name__)

LOAD_TIMEOUT_S = 60.0
_DIGEST_PREFIX = "SHA-256="


class SnapshotStore:
    """Named blobs (one per service) in the object store bucket ``bucket``."""

    def __init__(self, nc: Connection, bucket: str, *, replicas: int = 1) -> None:
        self._js = nc.jetstream()
        self._bucket = bucket
        self._replicas = replicas
        self._store: ObjectStore | None = None

    async def _open(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await self._js.object_store(self._bucket)
            except nats.js.errors.BucketNotFoundError:
                self._store = await self._js.create_object_store(
                    self._bucket,
                    config=ObjectStoreConfig(storage=StorageType.FILE, replicas=self._replicas),
                )
        return self._store

    @map_errors
    async def load(self, key: str, *, starting: bool = False) -> bytes | None:
        """The stored snapshot for ``key``, or None when absent or unreadable (never raises for a bad store).
        ``starting``: a store that does not answer yet (a cluster still forming) is said at info, not warning."""
        try:
            store = await self._open()
            info = await store.get_info(key)
            data = await self._read_chunks(info)
        except nats.js.errors.ObjectNotFoundError:
            return None
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            (log.info if starting else log.warning)(
                "snapshot_load_failed", key=key, error=repr(exc), then="replaying the log from its start"
            )
            return None
        except (nats.errors.Error, ValueError) as exc:
            log.warning("snapshot_load_failed", key=key, error=repr(exc))
            return None
        return data

    async def _read_chunks(self, info: Any) -> bytes:
        if not info.size:
            return b""
        chunks: list[bytes] = []
        done = asyncio.Event()

        async def on_chunk(msg: Any) -> None:
            chunks.append(msg.data)
            if parse_js_reply(msg.reply).pending == 0:
                done.set()

        sub = await self._js.subscribe(
            f"$O.{self._bucket}.C.{info.nuid}",
            stream=f"OBJ_{self._bucket}",
            cb=on_chunk,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        try:
            async with asyncio.timeout(LOAD_TIMEOUT_S):
                await done.wait()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        data = b"".join(chunks)
        if len(data) != info.size:
            raise ValueError(f"snapshot is {len(data)} bytes, its metadata says {info.size}")
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()
        if info.digest and info.digest.removeprefix(_DIGEST_PREFIX).rstrip("=") != digest.rstrip("="):
            raise ValueError("snapshot digest does not match its contents")
        return data

    @map_errors
    async def save(self, key: str, data: bytes) -> None:
        store = await self._open()
        await store.put(key, data)
