"""Rollups refused on the lease, heartbeat, service and plugin-mark buckets (issue 20, point 5), on a real
nats-server. One publish with ``KV-Operation: PURGE`` and ``Nats-Rollup: all`` to any key emptied a whole bucket,
and NATS permissions cannot filter headers: the streams themselves refuse rollups, whoever publishes. A town
started on buckets made before (rollups allowed) has them updated; the deacon's KV sweep still purges dead
entries without a rollup, and never a value written after it read the entry."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.client import JetStreamContext

from services.deacon.service import DeaconService
from services.deacon.settings import DeaconSettings
from shared.bus.kv import Bucket
from shared.bus.topology import provision
from shared.core.config import TownConfig
from shared.plugins.settings import PLUGIN_BUCKET
from shared.service import ServiceSettings
from tests.helpers import assert_eventually

ERR_ROLLUP_NOT_PERMITTED = 10111
WATCH = DeaconSettings(
    stale_after_s=3600.0, startup_grace_s=3600.0, escalate_after_s=3600.0, watched=(), tick_s=0.1, gc_interval_s=0.0
)


def buckets(town: TownConfig) -> list[str]:
    return [town.lease_bucket, town.heartbeat_bucket]


async def stored(js: JetStreamContext, bucket: str) -> dict[str, bytes]:
    """Every live key of ``bucket`` and its value."""
    kv = await js.key_value(bucket)
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return {}
    out = {}
    for key in keys:
        entry = await kv.get(key)
        assert entry.value is not None
        out[key] = entry.value
    return out


async def roll_up(js: JetStreamContext, bucket: str, key: str, scope: str) -> nats.js.errors.APIError:
    """What an agent did to wipe a bucket: a purge marker that rolls up the subject or the whole stream."""
    headers = {"KV-Operation": "PURGE", "Nats-Rollup": scope}
    with pytest.raises(nats.js.errors.APIError) as refused:
        await js.publish(f"$KV.{bucket}.{key}", b"", headers=headers, stream=f"KV_{bucket}")
    return refused.value


async def test_a_rollup_to_the_lease_or_heartbeat_bucket_is_refused_and_nothing_is_lost(
    nc: Client, town: TownConfig
) -> None:
    js = nc.jetstream()
    await provision(nc, town)
    for bucket in buckets(town):
        kv = await js.key_value(bucket)
        await kv.put("sess-a", b"a's lease")
        await kv.put("sess-b", b"b's lease")
        before = await stored(js, bucket)
        for scope in ("all", "sub"):
            refused = await roll_up(js, bucket, "sess-a", scope)
            assert refused.err_code == ERR_ROLLUP_NOT_PERMITTED, f"{bucket}: {refused!r}"
            assert "rollup not permitted" in str(refused.description)
        assert await stored(js, bucket) == before == {"sess-a": b"a's lease", "sess-b": b"b's lease"}
        info = await js.stream_info(f"KV_{bucket}")
        assert info.config.allow_rollup_hdrs is False


async def test_a_town_started_on_buckets_that_allowed_rollups_gets_them_updated(nc: Client, town: TownConfig) -> None:
    js = nc.jetstream()
    # Buckets as an older version made them: nats-py's defaults, rollups allowed.
    for bucket in (*buckets(town), town.service_bucket, PLUGIN_BUCKET):
        kv = await js.create_key_value(KeyValueConfig(bucket=bucket, history=1, ttl=3600.0))
        await kv.put("kept", b"written before the upgrade")
        assert (await js.stream_info(f"KV_{bucket}")).config.allow_rollup_hdrs is True

    deacon = DeaconService(town, ServiceSettings(heartbeat_interval=0.0), deacon=WATCH)
    task = asyncio.create_task(deacon.run())
    try:
        await assert_eventually(lambda: deacon.ready.is_set() or task.done(), timeout=30)
        assert not task.done(), task
        for bucket in (*buckets(town), town.service_bucket, PLUGIN_BUCKET):
            info = await js.stream_info(f"KV_{bucket}")
            assert info.config.allow_rollup_hdrs is False, f"{bucket} still allows rollups"
            assert (await stored(js, bucket))["kept"] == b"written before the upgrade"
            refused = await roll_up(js, bucket, "kept", "all")
            assert refused.err_code == ERR_ROLLUP_NOT_PERMITTED
    finally:
        await deacon.shutdown()
        await asyncio.wait_for(task, 30)


async def test_the_services_make_the_plugins_marks_bucket_without_rollups(nc: Client, town: TownConfig) -> None:
    # Plugins (account PLUGINS) may not create a stream: the services' provisioning makes their bucket.
    js = nc.jetstream()
    await provision(nc, town)
    config = (await js.stream_info(f"KV_{PLUGIN_BUCKET}")).config
    assert (config.allow_rollup_hdrs, config.allow_direct, config.allow_msg_ttl) == (False, True, True)
    kv = Bucket(nc, PLUGIN_BUCKET, keys_only=True)  # as a plugin opens it: direct gets only
    await kv.put("other.evt-1", b"done")
    refused = await roll_up(js, PLUGIN_BUCKET, "mine.evt-1", "all")
    assert refused.err_code == ERR_ROLLUP_NOT_PERMITTED
    assert await stored(js, PLUGIN_BUCKET) == {"other.evt-1": b"done"}


async def test_the_kv_sweep_purges_a_dead_entry_without_a_rollup_and_leaves_nothing_of_it(
    nc: Client, town: TownConfig
) -> None:
    js = nc.jetstream()
    await provision(nc, town)
    for bucket in (*buckets(town), town.service_bucket):
        kv = await js.key_value(bucket)
        revision = await kv.put("dead", b"old")
        await kv.put("alive", b"live")
        assert await Bucket(nc, bucket).purge_unless_written_since("dead", revision) is True
        assert await stored(js, bucket) == {"alive": b"live"}
        # Not even a delete marker is left of it: the subject holds nothing.
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.dead")
        assert not (info.state.subjects or {}).get(f"$KV.{bucket}.dead"), info.state.subjects
        with pytest.raises(nats.js.errors.KeyNotFoundError):
            await kv.get("dead")


async def test_the_kv_sweep_never_purges_a_value_written_after_it_read_the_entry(nc: Client, town: TownConfig) -> None:
    js = nc.jetstream()
    await provision(nc, town)
    kv = await js.key_value(town.lease_bucket)
    read = await kv.put("res-1", b"released")
    await kv.put("res-1", b"renewed since")  # taken again after the sweep read it
    assert await Bucket(nc, town.lease_bucket).purge_unless_written_since("res-1", read) is False
    assert (await kv.get("res-1")).value == b"renewed since"


class WriteBeforePurge:
    """A JetStream context whose stream purge lets a writer in first: the write lands between the sweep's
    delete marker and its purge of the subject."""

    def __init__(self, js: JetStreamContext, write: Any) -> None:
        self._js = js
        self._write = write
        self.purges = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._js, name)

    def jetstream(self) -> WriteBeforePurge:
        """Handed to the sweep's ``Bucket`` as its connection: the purge goes through this context."""
        return self

    async def purge_stream(self, name: str, **kwargs: Any) -> bool:
        self.purges += 1
        await self._write()
        return await self._js.purge_stream(name, **kwargs)


async def test_a_write_between_the_sweeps_delete_and_its_purge_survives(nc: Client, town: TownConfig) -> None:
    js = nc.jetstream()
    await provision(nc, town)
    kv = await js.key_value(town.heartbeat_bucket)
    read = await kv.put("sess-1", b"old beat")
    racing = WriteBeforePurge(js, lambda: kv.put("sess-1", b"fresh beat"))
    sweeping = Bucket(cast(Client, racing), town.heartbeat_bucket)
    assert await sweeping.purge_unless_written_since("sess-1", read) is True
    assert racing.purges == 1, "the sweep is expected to purge the subject after its delete marker"
    assert (await kv.get("sess-1")).value == b"fresh beat"
