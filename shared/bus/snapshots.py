"""Projection snapshots in a JetStream object store. A snapshot is a cache: losing it only costs a replay."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import structlog
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.object_store import ObjectStore

log = structlog.get_logger(__name__)


class SnapshotStore:
    def __init__(self, js: JetStreamContext, bucket: str, *, replicas: int = 1) -> None:
        self._js = js
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

    async def load(self, key: str) -> bytes | None:
        """The stored snapshot for ``key``, or None when absent or unreadable (never raises for a bad store)."""
        try:
            store = await self._open()
            result = await store.get(key)
        except nats.js.errors.ObjectNotFoundError:
            return None
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning("snapshot_load_failed", key=key, error=repr(exc))
            return None
        return result.data

    async def save(self, key: str, data: bytes) -> None:
        store = await self._open()
        await store.put(key, data)
