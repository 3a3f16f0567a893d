"""Poison commands on a real server: no body ever ends an intake loop. Bodies that break the JSON decoder in
ways other than a plain syntax error (invalid UTF-8 inside a string, nesting 100,000 deep, numbers out of
range, lone surrogate escapes) are each answered by one rejection; a command whose processing keeps failing
is set aside after a few deliveries (rejected with ``set_aside``, escalated), never retried forever."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from services.deacon.service import DeaconService
from services.mayor.service import MayorService
from shared.core.config import TownConfig
from shared.model.commands import BeadCreate, Command
from shared.model.events import BeadCreated, encode_event
from shared.service import ServiceSettings
from tests.helpers import assert_eventually
from tests.integration.test_deacon import FAST as DEACON_FAST
from tests.integration.test_deacon import WATCH, Town
from tests.integration.test_mayor_service import ask, latest_seq, pub, run_mayor
from tests.log_tools import events_of, outcome_of
from tests.service_process import ServiceProcess

DEEP = 100_000
POISON: list[tuple[str, bytes, str | None]] = [
    ("poison-utf8", b'{"title": "\xff\xfe"}', "malformed"),
    ("poison-utf8-key", b'{"\xff": 1, "title": "x"}', "malformed"),
    ("poison-deep-array", b'{"title": "x", "labels": ' + b"[" * DEEP + b"]" * DEEP + b"}", "malformed"),
    ("poison-deep-object", b'{"a":' * DEEP + b"1" + b"}" * DEEP, "malformed"),
    ("poison-huge-float", b'{"title": "x", "priority": 1e400}', "malformed"),
    ("poison-huge-int", b'{"title": "x", "priority": ' + str(10**400).encode() + b"}", "invalid"),
    ("poison-enormous-int", b'{"title": "x", "priority": 1' + b"0" * 5_000 + b"}", "malformed"),
    ("poison-surrogate", b'{"title": "\\ud800"}', "malformed"),
    ("poison-surrogate-pair", b'{"title": "\\udfff\\ud800"}', "malformed"),
    ("poison-raw-nul", b'{"title": "a\x00b"}', "malformed"),
    ("poison-nul-escape", b'{"title": "a\\u0000b"}', None),  # a title may hold any character: one outcome
]


def mayor_process(gt_env: dict[str, str], town: TownConfig, log: Path, **extra: str) -> ServiceProcess:
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home), **extra}
    return ServiceProcess("mayor", env, log)


@contextlib.contextmanager
def stopped_at_exit(proc: ServiceProcess) -> Iterator[ServiceProcess]:
    try:
        yield proc
    finally:
        proc.stop()


async def outcome_while_alive(
    nc: Client, proc: ServiceProcess, command_id: str, *, resend: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The command's stored outcome; fails at once when the service process exits first. ``resend``: publish
    this body under ``command_id`` at each try (a command sent before the service opened GT_CMD is lost)."""

    async def answered() -> dict[str, Any]:
        if proc.returncode() is not None:
            pytest.fail(f"the {proc.service} exited:\n{proc.log_text()[-4000:]}")
        if resend is not None:
            await pub(nc, "gt.cmd.bead.create", resend, msg_id=command_id)
        return await outcome_of(nc, command_id, timeout=0.5)

    result: dict[str, Any] = await assert_eventually(answered, timeout=90, interval=0.1)
    return result


async def test_each_poison_body_gets_one_rejection_and_the_mayor_keeps_serving(nc: Client, town: TownConfig) -> None:
    async with run_mayor(town) as mayor:
        for cmd_id, body, _ in POISON:
            await pub(nc, "gt.cmd.bead.create", body, msg_id=cmd_id)
        await pub(nc, "gt.cmd.bead.create", {"title": "after the poison"}, msg_id="good-after")
        for cmd_id, _, code in POISON:
            outcome = await outcome_of(nc, cmd_id)
            if code is not None:
                assert (outcome["type"], outcome["code"]) == ("cmd.rejected", code), (cmd_id, outcome)
                assert outcome["message"]
        assert (await outcome_of(nc, "good-after"))["type"] == "cmd.accepted"
        assert mayor.intake is not None
        for body in (b'{"id": "\xff"}', b"[" * DEEP + b"]" * DEEP):
            reply = json.loads((await nc.request("gt.q.mayor.get", body, timeout=15)).data)
            assert (reply["ok"], reply["code"]) == (False, "malformed"), reply


async def test_a_poison_command_does_not_crash_loop_the_mayor_process(
    nc: Client, town: TownConfig, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """Before the fix the mayor died on the command and again on every restart (it stayed in GT_CMD)."""
    with stopped_at_exit(mayor_process(gt_env, town, tmp_path / "mayor.log").start()) as mayor:
        await outcome_while_alive(nc, mayor, "warm-up", resend={"title": "warm up"})
        await pub(nc, "gt.cmd.bead.create", b'{"title": "\xff\xfe"}', msg_id="poison-live")
        outcome = await outcome_while_alive(nc, mayor, "poison-live")
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "malformed"), outcome

        # Stored while the mayor is down: the restarted mayor meets it first thing, and answers it.
        mayor.kill()
        await pub(nc, "gt.cmd.bead.create", b'{"title": ' + b"[" * DEEP + b"]" * DEEP + b"}", msg_id="poison-down")
        await pub(nc, "gt.cmd.bead.create", {"title": "behind the poison"}, msg_id="good-down")
        mayor.start()
        outcome = await outcome_while_alive(nc, mayor, "poison-down")
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "malformed"), outcome
        assert (await outcome_while_alive(nc, mayor, "good-down"))["type"] == "cmd.accepted"
        assert mayor.returncode() is None


class PreparingFails(MayorService):
    """A mayor with a bug a command's content triggers while it is processed (after decoding)."""

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, BeadCreate) and cmd.title == "trigger the bug":
            raise ZeroDivisionError("division by zero")
        return await super().prepare(cmd)


async def test_a_command_whose_processing_keeps_failing_is_set_aside_and_escalated(
    nc: Client, town: TownConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GT_CMD_MAX_DELIVER_CRASHES", "3")
    settings = ServiceSettings(patrol_interval=0.5, idle_heartbeat=0.5)
    async with run_mayor(town, settings, service_class=PreparingFails) as mayor:
        await pub(nc, "gt.cmd.bead.create", {"title": "trigger the bug"}, msg_id="buggy")
        await pub(nc, "gt.cmd.bead.create", {"title": "unaffected"}, msg_id="fine")
        assert (await outcome_of(nc, "fine"))["type"] == "cmd.accepted"
        outcome = await outcome_of(nc, "buggy", timeout=90)
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "set_aside"), outcome
        assert "ZeroDivisionError" in outcome["message"]
        assert mayor.intake is not None
        assert mayor.intake.set_aside == 1

        async def escalated() -> dict[str, Any]:
            found: list[dict[str, Any]] = (await ask(nc, "escalations"))["result"]
            about = [e for e in found if "buggy" in e["message"]]
            assert about, found
            return about[0]

        escalation: dict[str, Any] = await assert_eventually(escalated, timeout=30)
        assert escalation["severity"] == "high"
        assert json.dumps(escalation)


def poisoned_events() -> list[tuple[str, bytes]]:
    """(subject, stored bytes): events of a registered type whose payload (or envelope) cannot be decoded, as a
    buggy or hostile writer with rights on gt.evt could store them."""

    def bead_created(bead: str, title: str, actor: str = "mayor") -> bytes:
        event = BeadCreated(bead_id=bead, title=title)
        return encode_event(event, event_id=f"ev-{bead}", ts=datetime.now(UTC), actor=actor)

    return [
        ("gt.evt.bead.hq-bad1", bead_created("hq-bad1", "TITLE").replace(b'"TITLE"', b'"\xff\xfe"')),
        ("gt.evt.bead.hq-bad2", bead_created("hq-bad2", "TITLE").replace(b'"TITLE"', b"[" * DEEP + b"]" * DEEP)),
        ("gt.evt.bead.hq-bad3", bead_created("hq-bad3", "x", actor="ACTOR").replace(b'"ACTOR"', b'"\xff"')),
        ("gt.evt.bead.hq-bad4", bead_created("hq-bad4", "TITLE").replace(b'"TITLE"', b'"\\ud800"')),
        ("gt.evt.bead.hq-bad5", b'{"a":' * DEEP + b"1" + b"}" * DEEP),
    ]


async def test_an_undecodable_event_is_skipped_live_and_on_replay(nc: Client, town: TownConfig) -> None:
    """Before the fix the mayor's fold raised on such an event and the mayor stopped, at once and again on every
    replay: the event stays in the log forever."""
    js = nc.jetstream()
    async with run_mayor(town) as mayor:
        for subject, data in poisoned_events():
            await js.publish(subject, data)  # the test's own connection: services alone may write gt.evt
        await pub(nc, "gt.cmd.bead.create", {"title": "after the bad events"}, msg_id="good-live")
        created = await outcome_of(nc, "good-live")
        assert created["type"] == "cmd.accepted"
        # Read-your-writes: answered once the fold has applied everything stored, the bad events included.
        bead = await ask(nc, "get", {"id": created["result"]["id"], "min_seq": await latest_seq(nc)})
        assert "result" in bead, bead
        assert bead["result"]["title"] == "after the bad events"
        assert mayor.projection.skipped >= len(poisoned_events())
    replay = ServiceSettings(patrol_interval=0.5, idle_heartbeat=0.5, use_snapshots=False)
    async with run_mayor(town, replay, rigs=()) as mayor:
        await pub(nc, "gt.cmd.bead.create", {"title": "after the replay"}, msg_id="good-replay")
        assert (await outcome_of(nc, "good-replay"))["type"] == "cmd.accepted"
        assert mayor.projection.skipped >= len(poisoned_events())
        assert "hq-bad1" not in mayor.projection.state.beads


GARBAGE = (
    b'{"holder": "\xff"}',  # invalid UTF-8 in a string field
    b'{"service": "\xff"}',
    b'{"ts": "\xff"}',
    b'{"zzz": ' + b"[" * DEEP + b"]" * DEEP + b"}",  # nested past the recursion limit under an unknown key
    b'{"service": "\\ud800"}',
    b"\x00\xff",
)


async def test_garbage_kv_values_do_not_stop_the_deacon(nc: Client, town: TownConfig) -> None:
    """Heartbeats, service heartbeats and lease renewals are written by others (agents write theirs): a value
    nobody can read is passed over, and the deacon goes on supervising (here: it expires a lease whose renewal
    entry is garbage). Before the fix its patrol failed on every tick."""
    handle = Town(town, nc)
    await handle.start("mayor", MayorService(town, DEACON_FAST))
    await handle.start("deacon", DeaconService(town, DEACON_FAST, deacon=WATCH))
    try:
        js = nc.jetstream()
        got = await handle.command("gt.cmd.lease.acquire", lease="res-g", holder="alice", ttl_s=1.0)
        assert got["type"] == "cmd.accepted", got
        services_kv = await js.key_value(town.service_bucket)
        agents_kv = await js.key_value(town.heartbeat_bucket)
        leases_kv = await js.key_value(town.lease_bucket)
        for i, value in enumerate(GARBAGE):
            await services_kv.put(f"mayor.garbage{i}", value)
            await agents_kv.put(f"garbage-{i}", value)
        await leases_kv.put("res-g", GARBAGE[0])
        deacon = handle.deacon()
        errors_before = deacon.watch_errors

        async def expired() -> list[str]:
            assert not handle.tasks["deacon"][1].done()
            kinds = [kind for kind, _ in await events_of(nc, "gt.evt.lease.res-g")]
            assert kinds == ["lease.acquired", "lease.expired"]
            return kinds

        kinds: list[str] = await assert_eventually(expired, timeout=30)
        assert kinds[-1] == "lease.expired"
        checks = deacon.gc_checks
        await assert_eventually(lambda: deacon.gc_checks >= checks + 3, timeout=30)  # whole watch ticks
        assert deacon.watch_errors == errors_before
    finally:
        for name in list(handle.tasks):
            await handle.stop(name)


async def test_a_command_the_mayor_process_dies_on_is_set_aside_after_a_few_restarts(
    nc: Client, town: TownConfig, gt_env: dict[str, str], tmp_path: Path
) -> None:
    """The mayor process dies (SIGKILL, as a segfault would) each time it settles one command. A restarted
    instance settles first what its predecessor held, read from the stream where no delivery count exists; the
    record of its held phase names the command it died on, and after GT_CMD_MAX_DELIVER_CRASHES deaths the
    command is set aside and escalated, and the commands behind it are settled. Before, every restart died on
    it again."""
    extra = {"GT_CRASH_AT": "intake.settle.crashy", "GT_CMD_MAX_DELIVER_CRASHES": "2"}
    proc = mayor_process(gt_env, town, tmp_path / "mayor.log", **extra)
    with stopped_at_exit(proc.start()) as mayor:
        await outcome_while_alive(nc, mayor, "warm-up", resend={"title": "warm up"})
        await pub(nc, "gt.cmd.bead.create", {"title": "kills the mayor"}, msg_id="crashy")
        await pub(nc, "gt.cmd.bead.create", {"title": "stored behind it"}, msg_id="behind")

        async def set_aside() -> dict[str, Any]:
            if mayor.returncode() is not None:  # the test is the supervisor: restart it at once
                assert mayor.starts < 12, f"still dying after {mayor.starts} starts:\n{mayor.log_text()[-3000:]}"
                mayor.start()
            return await outcome_of(nc, "crashy", timeout=0.5)

        outcome: dict[str, Any] = await assert_eventually(set_aside, timeout=180, interval=0.2)
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "set_aside"), outcome
        assert "stopped while settling it" in outcome["message"]
        assert mayor.starts >= 3
        assert (await outcome_while_alive(nc, mayor, "behind"))["type"] == "cmd.accepted"

        async def escalated() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = (await ask(nc, "escalations"))["result"]
            about = [e for e in found if "crashy" in e["message"]]
            assert about, found
            return about

        about: list[dict[str, Any]] = await assert_eventually(escalated, timeout=30)
        assert about[0]["severity"] == "high"
        assert mayor.returncode() is None
