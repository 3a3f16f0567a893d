"""The plugin user in account PLUGINS (ops/nats/accounts.conf) on a real nats-server with the shipped accounts file.

The red team's PL1 (../shared/research/redteam-turn4.md): in the town's account GT, the plugin user wrote ``{}`` as
its own mark and direct-got it with the reply subject set to ``$JS.API.STREAM.PURGE.KV_GT_HEARTBEATS``; JetStream
published the stored value there with its own rights and the bucket was purged. NATS never checks a reply subject
against permissions. In PLUGINS (no JetStream, GT's subjects only as imported services) a request that crosses an
import is answered on a reply the server makes (``_R_.<random>`` in GT) and the answer is delivered back into
PLUGINS: whatever reply a plugin sets names a subject of PLUGINS, never one of the town. And a plugin still does all
its work there: it follows the log by batched direct gets, keeps its position and marks, replays and resumes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.plugins.metrics import collect_live
from shared.bus.connection import close_quietly
from shared.bus.kv import Bucket
from shared.bus.permissions import guarded
from shared.core.errors import PermissionDeniedError
from shared.model.events import Envelope, Event
from shared.plugins import PLUGIN_BUCKET, Plugin, PluginSettings
from shared.plugins.settings import position_key
from tests.helpers import assert_eventually
from tests.secured_town import SecuredTown, services_as_themselves

BEAD_TARGET = "gt.evt.bead.hq-forged"
TOWN_TARGETS = (
    "$JS.API.STREAM.PURGE.KV_GT_HEARTBEATS",
    "$JS.API.STREAM.DELETE.GT_EVT",
    "$JS.API.STREAM.PURGE.GT_CMD",
    BEAD_TARGET,
    "gt.cmd.bead.close.svc.refinery",
    "$KV.GT_ACTIVE.mayor",
    "$KV.GT_HEARTBEATS.hq-victim-1",
)
"""Where the red team had JetStream publish the plugin's bytes, and a few more of the town's subjects."""
IMPORTED_TARGETS = (
    "$JS.API.STREAM.PURGE.KV_GT_PLUGINS",
    "$KV.GT_PLUGINS.victim.position.last",
    "gt.q.mayor.status",
)
"""Subjects PLUGINS imports from GT. An answer delivered to one of them in PLUGINS may be carried on into GT as a
request of PLUGINS (nats-server 2.15.1 does, for `$JS.API.STREAM.PURGE.KV_GT_PLUGINS`): no more than what the plugin
may publish there itself, so every imported subject must be one a plugin may send anything to."""
MARK = "attacker.ev-trampoline"


class TownState(msgspec.Struct, frozen=True):
    """What the attack must leave as it was (read as the mayor, who may read everything)."""

    streams: tuple[str, ...]
    evt: tuple[int, int, int]
    """GT_EVT's messages, first and last sequence."""
    evt_last: bytes
    cmd: tuple[int, int, int]
    cmd_consumers: tuple[str, ...]
    evt_consumers: tuple[tuple[str, str], ...]
    """Durable consumers of GT_EVT and where they deliver."""
    heartbeats: tuple[int, int, tuple[tuple[str, bytes], ...]]
    active: tuple[tuple[str, str], ...]
    """Each scope's activity key and the instance holding it."""
    victim_marks: tuple[tuple[str, bytes], ...]


async def town_state(nc: Client) -> TownState:
    js = nc.jetstream()
    evt = (await js.stream_info("GT_EVT")).state
    cmd = (await js.stream_info("GT_CMD")).state
    heartbeats = (await js.stream_info("KV_GT_HEARTBEATS")).state
    durable = [c for c in await js.consumers_info("GT_EVT") if c.config.durable_name]
    evt_consumers = tuple(sorted((str(c.name), str(c.config.deliver_subject)) for c in durable))
    active_kv = await js.key_value("GT_ACTIVE")
    active = []
    for key in sorted(await active_kv.keys()):
        entry = await active_kv.get(key)
        active.append((key, str(json.loads(entry.value or b"{}").get("instance"))))
    return TownState(
        streams=await names(js),
        evt=(int(evt.messages), int(evt.first_seq), int(evt.last_seq)),
        evt_last=(await js.get_msg("GT_EVT", int(evt.last_seq))).data or b"",
        cmd=(int(cmd.messages), int(cmd.first_seq), int(cmd.last_seq)),
        cmd_consumers=tuple(sorted(str(c.name) for c in await js.consumers_info("GT_CMD"))),
        evt_consumers=evt_consumers,
        heartbeats=(int(heartbeats.messages), int(heartbeats.last_seq), await kv_items(js, "GT_HEARTBEATS")),
        active=tuple(active),
        victim_marks=await kv_items(js, PLUGIN_BUCKET, prefix="victim."),
    )


async def names(js: Any) -> tuple[str, ...]:
    return tuple(sorted(str(info.config.name) for info in await js.streams_info()))


async def kv_items(js: Any, bucket: str, *, prefix: str = "") -> tuple[tuple[str, bytes], ...]:
    kv = await js.key_value(bucket)
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return ()
    items = [(k, (await kv.get(k)).value or b"") for k in keys if k.startswith(prefix)]
    return tuple(sorted(items))


async def refused(nc: Client, op: Any, subject: str) -> None:
    with pytest.raises(PermissionDeniedError) as caught:
        await asyncio.wait_for(guarded(nc, op), 10)
    assert caught.value.subject == subject, caught.value


async def allowed(nc: Client, op: Any) -> None:
    await asyncio.wait_for(guarded(nc, op), 10)


async def test_pl1_the_plugin_cannot_make_jetstream_publish_its_bytes_into_the_town(
    st: SecuredTown, tmp_path: Path
) -> None:
    async with services_as_themselves(st, tmp_path, "mayor"):
        created = await st.gt("operator", "bead", "create", "Already here")
        assert created.returncode == 0, created.stderr
        waiting = await st.gt("operator", "mq", "retry", "mr-0123456789")  # waits in GT_CMD: no refinery runs
        assert waiting.returncode == 0, waiting.stderr
        mayor = await st.connect("mayor")
        witness = await st.connect("witness")
        plugin = await st.connect("plugin")
        try:
            heartbeats = await witness.jetstream().key_value("GT_HEARTBEATS")
            await heartbeats.put("hq-victim-1", b'{"note": "alive"}')
            await heartbeats.put("hq-victim-2", b'{"note": "alive too"}')
            await Bucket(mayor, PLUGIN_BUCKET).put("victim.position.last", b"7")  # another plugin's position
            before = await town_state(mayor)
            assert before.cmd[0] >= 1
            assert before.heartbeats[0] == 2
            assert before.active

            trap: asyncio.Queue[Msg] = asyncio.Queue()
            await plugin.subscribe("gt.plugin.trap", cb=trap.put)
            # The plugin's own mark, `{}`: the body a purge or a delete takes (an empty request).
            marks = Bucket(plugin, PLUGIN_BUCKET, keys_only=True)
            await marks.put(MARK, b"{}")

            async def trampolines(target: str) -> None:
                # A direct get of its mark by key, by sequence, and of the log; the mark written again; a query;
                # the log's stream info.
                by_key = f"$JS.API.DIRECT.GET.KV_GT_PLUGINS.$KV.GT_PLUGINS.{MARK}"
                await allowed(plugin, plugin.publish(by_key, b"", reply=target))
                last_by_subject = json.dumps({"last_by_subj": f"$KV.GT_PLUGINS.{MARK}"}).encode()
                await allowed(plugin, plugin.publish("$JS.API.DIRECT.GET.KV_GT_PLUGINS", last_by_subject, reply=target))
                batch = json.dumps({"seq": 1, "batch": 3}).encode()
                await allowed(plugin, plugin.publish("$JS.API.DIRECT.GET.GT_EVT", batch, reply=target))
                await allowed(plugin, plugin.publish(f"$KV.GT_PLUGINS.{MARK}", b"{}", reply=target))
                await allowed(plugin, plugin.publish("gt.q.mayor.status", b"{}", reply=target))
                await allowed(plugin, plugin.publish("$JS.API.STREAM.INFO.GT_EVT", b"", reply=target))

            for target in (*TOWN_TARGETS, "gt.plugin.trap"):
                await trampolines(target)

            # Every answer came back into PLUGINS: the trap got the plugin's own mark (and the others' answers).
            first = await asyncio.wait_for(trap.get(), 10)
            assert first.data == b"{}"
            await plugin.flush()
            await asyncio.sleep(1.0)  # what a trampoline would have done has been done by now

            after = await town_state(mayor)
            assert after == before, "the town is as it was: nothing purged, deleted, forged or taken over"
            with pytest.raises(nats.js.errors.NotFoundError):
                await mayor.jetstream().get_last_msg("GT_EVT", BEAD_TARGET)

            # Pulling from a consumer (its reply is where the events go), making one that delivers into the town,
            # acknowledging, administering streams, the town's subjects: refused by NATS, at once.
            for subject in (
                "$JS.API.CONSUMER.MSG.NEXT.GT_EVT.plugin-x",
                "$JS.API.CONSUMER.MSG.NEXT.GT_CMD.mayor-cmd",
            ):
                await refused(plugin, plugin.publish(subject, b'{"batch": 1}', reply=BEAD_TARGET), subject)
            push = {"stream_name": "GT_EVT", "config": {"durable_name": "pl1", "deliver_subject": BEAD_TARGET}}
            for subject in (
                "$JS.API.CONSUMER.CREATE.GT_EVT",
                "$JS.API.CONSUMER.CREATE.GT_EVT.pl1",
                "$JS.API.CONSUMER.DURABLE.CREATE.GT_EVT.pl1",
                "$JS.API.CONSUMER.CREATE.KV_GT_ACTIVE",
            ):
                await refused(plugin, plugin.publish(subject, json.dumps(push).encode()), subject)
            for subject in (
                "$JS.ACK.GT_CMD.mayor-cmd.1.1.1.1.0",
                "$JS.API.STREAM.DELETE.GT_EVT",
                "$JS.API.STREAM.PURGE.KV_GT_HEARTBEATS",
                "$JS.API.STREAM.CREATE.KV_GT_PLUGINS",
                "$JS.API.STREAM.UPDATE.KV_GT_PLUGINS",
                "$JS.API.STREAM.INFO.GT_CMD",
                "$JS.API.DIRECT.GET.KV_GT_HEARTBEATS.$KV.GT_HEARTBEATS.hq-victim-1",
                "$KV.GT_ACTIVE.mayor",
                "$KV.GT_HEARTBEATS.hq-victim-1",
                BEAD_TARGET,
                "gt.cmd.bead.close.svc.refinery",
                "gt.cmd.bead.create",
            ):
                await refused(plugin, plugin.publish(subject, b"{}"), subject)

            await plugin.flush()
            await asyncio.sleep(0.5)
            assert await town_state(mayor) == before

            # Into what PLUGINS imports: at most the plugins' own bucket (which the plugin may purge itself).
            for target in IMPORTED_TARGETS:
                await trampolines(target)
            await plugin.flush()
            await asyncio.sleep(1.0)
            imported = await town_state(mayor)
            assert msgspec.structs.replace(imported, victim_marks=before.victim_marks) == before
        finally:
            for nc in (plugin, witness, mayor):
                await close_quietly(nc)
    lines = st.violations()
    assert any('"PLUGINS/user:plugin"' in line and "$JS.API.STREAM.DELETE.GT_EVT" in line for line in lines), lines


class Recorder(Plugin):
    def __init__(self, st: SecuredTown, settings: PluginSettings) -> None:
        super().__init__(st.config("plugin"), settings)
        self.seqs: list[int] = []
        self.firsts: list[bool] = []

    async def handle(self, seq: int, env: Envelope, payload: Event | None) -> None:
        async with self.once(env.id) as claim:
            self.seqs.append(seq)
            self.firsts.append(claim.first)


async def follow(plugin: Recorder, until: int) -> None:
    task = asyncio.create_task(plugin.run())
    try:
        await assert_eventually(lambda: plugin.last_seq >= until or task.done(), timeout=30)
        assert not task.done(), task
    finally:
        await plugin.shutdown()
        await asyncio.wait_for(task, 30)


async def test_a_plugin_follows_resumes_and_replays_as_the_plugin_user(st: SecuredTown, tmp_path: Path) -> None:

    def settings(**fields: Any) -> PluginSettings:
        return PluginSettings(name="secured", poll_s=0.02, max_poll_s=0.2, batch=3, **fields)

    async with services_as_themselves(st, tmp_path, "mayor") as town:
        for n in range(3):
            assert (await st.gt("operator", "bead", "create", f"bead {n}")).returncode == 0
        last = int((await town.nc.jetstream().stream_info("GT_EVT")).state.last_seq)

        first = Recorder(st, settings(subjects=("gt.evt.bead.>", "gt.evt.cmd.*")))
        await follow(first, last)
        assert first.seqs == list(range(1, last + 1))
        assert all(first.firsts)

        for n in range(3, 5):
            assert (await st.gt("operator", "bead", "create", f"bead {n}")).returncode == 0
        newest = int((await town.nc.jetstream().stream_info("GT_EVT")).state.last_seq)
        again = Recorder(st, settings(subjects=("gt.evt.bead.>", "gt.evt.cmd.*")))
        await follow(again, newest)
        assert again.start_plan == (last + 1, "position")
        assert again.seqs == list(range(last + 1, newest + 1))

        replay = Recorder(st, settings(replay_from_start=True))
        await follow(replay, newest)
        assert replay.seqs == list(range(1, newest + 1))
        assert all(replay.firsts), "its marks were purged: every event is new again"

        plugin_nc = await st.connect("plugin")
        try:
            live = await collect_live(plugin_nc, "GT_EVT", ("mayor",), timeout=2.0, skip_plugin="metrics")
            kv = Bucket(plugin_nc, PLUGIN_BUCKET, keys_only=True)
            entry = await kv.get(position_key("secured"))
        finally:
            await close_quietly(plugin_nc)
        assert live.plugins == {"secured": newest}
        assert live.stream_last_seq == newest
        assert entry is not None
        assert entry.value == str(newest).encode()
    assert st.violations() == [], "the plugin did all of that with nothing refused"
