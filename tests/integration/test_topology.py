"""Provisioning the streams: idempotent, racing-safe, and never silently changing what exists."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import urllib.request
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import RetentionPolicy

from shared.bus import topology
from shared.bus.topology import (
    cmd_stream_config,
    command_consumer_config,
    command_consumer_name,
    evt_stream_config,
    provision,
)
from shared.core.config import TownConfig
from shared.core.errors import StreamConfigMismatchError
from tests.helpers import assert_eventually


def _plain(value: object) -> object:
    return getattr(value, "value", value)


EVERYTHING = {
    "GT_EVT",
    "GT_CMD",
    "GT_CMD/mayor-cmd",
    "GT_CMD/witness-cmd",
    "GT_CMD/refinery-cmd",
    "GT_CMD/deacon-cmd",
    "KV GT_HEARTBEATS",
    "KV GT_SERVICES",
    "KV GT_ACTIVE",
    "KV GT_LEASES",
    "KV GT_PLUGINS",
}


async def test_first_provision_creates_then_reports_existing(nc: Client, town: TownConfig) -> None:
    first = await provision(nc, town)
    assert set(first.created) == EVERYTHING
    second = await provision(nc, town)
    assert second.created == []
    assert set(second.existing) == set(first.created)


async def test_concurrent_provisioners_agree(nc: Client, town: TownConfig) -> None:
    reports = await asyncio.gather(*(provision(nc, town) for _ in range(5)))
    assert all(set(r.created) | set(r.existing) == EVERYTHING for r in reports)


async def test_the_event_log_is_immutable_and_keeps_everything(nc: Client, town: TownConfig) -> None:
    await provision(nc, town)
    info = await nc.jetstream().stream_info("GT_EVT")
    cfg = info.config
    assert cfg.subjects == ["gt.evt.>"]
    assert _plain(cfg.storage) == "file"
    assert (cfg.deny_delete, cfg.deny_purge, cfg.allow_atomic) == (True, True, True)
    assert _plain(cfg.discard) == "new"
    assert cfg.duplicate_window == 120
    assert (cfg.max_age or 0, cfg.max_msgs_per_subject) == (0, -1)
    cmd = (await nc.jetstream().stream_info("GT_CMD")).config
    assert cmd.subjects == ["gt.cmd.>"]
    assert _plain(cmd.retention) == "interest"  # stored until its owning service has processed it


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_age": 3600.0}, "max_age"),
        ({"deny_delete": False, "deny_purge": False}, "deny_delete"),
        ({"max_msgs_per_subject": 1}, "max_msgs_per_subject"),
        ({"subjects": ["gt.evt.bead.>"]}, "subjects"),
    ],
)
async def test_an_incompatible_existing_stream_is_reported_and_left_alone(
    nc: Client, town: TownConfig, change: dict[str, Any], field: str
) -> None:
    js = nc.jetstream()
    wanted = evt_stream_config(town)
    await js.add_stream(dataclasses.replace(wanted, **change))
    before = (await js.stream_info("GT_EVT")).config
    with pytest.raises(StreamConfigMismatchError) as info:
        await provision(nc, town)
    assert info.value.stream == "GT_EVT"
    assert field in info.value.differences
    assert field in str(info.value)
    after = (await js.stream_info("GT_EVT")).config
    assert after == before


async def test_a_command_stream_with_work_queue_retention_is_refused(nc: Client, town: TownConfig) -> None:
    js = nc.jetstream()
    wanted = cmd_stream_config(town)
    await js.add_stream(dataclasses.replace(wanted, retention=RetentionPolicy.WORK_QUEUE))
    await js.add_stream(evt_stream_config(town))
    with pytest.raises(StreamConfigMismatchError, match="retention"):
        await provision(nc, town)


def test_the_embedded_server_syncs_every_write_to_disk(own_nats_server: Any) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{own_nats_server.http_port}/varz", timeout=5) as reply:
        varz = json.load(reply)
    assert varz["jetstream"]["config"]["sync_always"] is True


async def test_an_older_command_consumer_is_widened_with_its_pending_commands_kept(
    nc: Client, town: TownConfig
) -> None:
    """An upgrade that gives a service more commands (the deacon got `gc`): its consumer reads them too, and a
    command stored before the upgrade is still there to be answered."""
    js = nc.jetstream()
    await provision(nc, town)
    name = command_consumer_name("deacon")
    older = dataclasses.replace(command_consumer_config("deacon"), filter_subjects=["gt.cmd.lease.>"])
    await js.delete_consumer(town.cmd_stream, name)
    await js.add_consumer(town.cmd_stream, older)
    await js.publish("gt.cmd.lease.acquire", b'{"lease": "x", "holder": "me", "ttl_s": 5}', stream=town.cmd_stream)
    report = await provision(nc, town)
    assert f"GT_CMD/{name}" in report.existing
    info = await js.consumer_info(town.cmd_stream, name)
    assert sorted(info.config.filter_subjects or []) == sorted(command_consumer_config("deacon").filter_subjects or [])
    assert info.num_pending == 1, "the command stored before the upgrade is still owed"


async def test_a_command_consumer_reading_other_subjects_is_refused(nc: Client, town: TownConfig) -> None:
    js = nc.jetstream()
    await provision(nc, town)
    name = command_consumer_name("deacon")
    other = dataclasses.replace(command_consumer_config("deacon"), filter_subjects=["gt.cmd.somebody.>"])
    await js.delete_consumer(town.cmd_stream, name)
    await js.add_consumer(town.cmd_stream, other)
    with pytest.raises(StreamConfigMismatchError) as refused:
        await provision(nc, town)
    assert "filter_subjects" in str(refused.value)


async def test_a_command_sent_while_the_intake_is_being_provisioned_is_refused_or_kept_never_dropped(
    nc: Client, town: TownConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GT_CMD keeps a command only while a consumer is interested in it: one stored after the stream exists
    but before its consumers do would be acknowledged and dropped at once (seen in the cluster chaos run, where
    provisioning takes long enough for the first command to land in that window). A command sent in that
    window must be refused, so its sender knows to send it again, or kept and delivered."""
    js = nc.jetstream()
    sent: list[str] = []
    real = topology.ensure_consumer

    async def command_arrives_first(js_: Any, stream: str, wanted: Any) -> bool:
        if not sent:
            try:
                await nc.jetstream().publish("gt.cmd.bead.create", b'{"title": "early"}', timeout=2)
                sent.append("stored")
            except (nats.errors.Error, TimeoutError) as exc:
                sent.append(f"refused: {type(exc).__name__}")
        return await real(js_, stream, wanted)

    monkeypatch.setattr(topology, "ensure_consumer", command_arrives_first)
    await provision(nc, town)
    assert sent, "the command was not sent in the window"
    info = await js.stream_info(town.cmd_stream)
    if sent[0] == "stored":
        assert info.state.messages == 1, f"the command was acknowledged and dropped: {info.state}"
    else:
        assert info.state.last_seq == 0, "a refused command must not be stored"
    # Once provisioned, the intake takes commands and keeps them for their service.
    assert sorted(info.config.subjects or []) == ["gt.cmd.>"]
    await js.publish("gt.cmd.bead.create", b'{"title": "later"}', stream=town.cmd_stream)

    async def pending_for_the_mayor() -> bool:
        # The server counts a consumer's pending messages a moment after the publish is acknowledged.
        mayor = await js.consumer_info(town.cmd_stream, command_consumer_name("mayor"))
        return (mayor.num_pending or 0) >= 1

    pending: bool = await assert_eventually(pending_for_the_mayor, timeout=10)
    assert pending


async def test_a_half_provisioned_command_intake_is_finished_by_the_next_provisioner(
    nc: Client, town: TownConfig
) -> None:
    """A provisioner that died after creating GT_CMD (still closed) but before its consumers: the next one
    creates them and opens the intake, instead of refusing the stream as misconfigured."""
    js = nc.jetstream()
    await js.add_stream(topology.evt_stream_config(town))  # provisioning makes the log first, then the intake
    closed = dataclasses.replace(cmd_stream_config(town), subjects=[topology.closed_intake_subject(town)])
    await js.add_stream(closed)
    report = await provision(nc, town)
    assert "GT_CMD" in report.existing
    assert "GT_CMD/mayor-cmd" in report.created
    assert sorted((await js.stream_info(town.cmd_stream)).config.subjects or []) == ["gt.cmd.>"]
    again = await provision(nc, town)
    assert not again.created
