"""Who a command is from is decided by who may publish it, never by its body (issue 20, point 4), on a real
nats-server with the shipped accounts file: the operator user may publish only the plain command subjects, so it
can act neither as a service nor as a session, and a body naming a service (or a polecat) there is refused
``unauthorized``; the services send on their own subjects and are recorded as themselves; an operator's own label
is kept, and limited as an operator's. Commands stored before a town's upgrade keep the rule they were sent
under."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.mayor.service import MayorService
from shared.bus.connection import close_quietly
from shared.bus.topology import ORIGIN_CUTOVER_KEY, origin_cutover
from shared.core.config import TownConfig
from shared.model.events import decode_envelope
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually
from tests.log_tools import read_all
from tests.secured_town import SecuredTown, refused, services_as_themselves, snapshot
from tests.witness_town import FAST, TEST_COMMAND, PolecatTown

RESERVED_SUBJECTS = (
    "gt.cmd.bead.close.svc.mayor",
    "gt.cmd.bead.close.svc.refinery",
    "gt.cmd.automation.run.svc.deacon",
    "gt.cmd.session.stop.svc.witness",
    "gt.cmd.mail.send.demo.ace.hq-some-1",
    "gt.cmd.step.done.demo.ace.hq-some-1",
)
"""Services' and a session's own subjects: the operator may publish none of them."""


async def command(nc: Client, subject: str, **body: Any) -> dict[str, Any]:
    cmd_id = f"t-{uuid.uuid4().hex[:12]}"
    return await send_and_wait(nc, subject, json.dumps({**body, "cmd_id": cmd_id}).encode(), cmd_id)


async def events_after(nc: Client, seq: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(type, actor, payload) of every event stored after ``seq``."""
    out = []
    for at, _subject, data in await read_all(nc, "GT_EVT", "gt.evt.>"):
        if at > seq:
            env = decode_envelope(data)
            out.append((env.type, env.actor, json.loads(bytes(env.data))))
    return out


async def event_actor(nc: Client, subject: str, kind: str) -> str:
    for _seq, _subject, data in await read_all(nc, "GT_EVT", subject):
        env = decode_envelope(data)
        if env.type == kind:
            return env.actor
    raise AssertionError(f"no {kind} on {subject}")


def use_the_witness_identity(st: SecuredTown, monkeypatch: pytest.MonkeyPatch) -> None:
    """The witness's credentials and session keys in its environment (as under docker-compose): it gives each
    session its own identity and answers the server's auth callout for it."""
    for key, value in st.witness_env().items():
        monkeypatch.setenv(key, value)


# ---- the operator: plain subjects only, as an operator ---------------------------------------------------


async def test_the_operator_may_publish_neither_a_services_subject_nor_a_sessions(
    st: SecuredTown, tmp_path: Path
) -> None:
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        before = await snapshot(town.nc, "mayor")
        nc = await st.connect("operator")
        js = nc.jetstream()
        try:
            for subject in RESERVED_SUBJECTS:
                body = json.dumps({"id": "hq-x", "actor": "mayor"}).encode()
                denied = await refused(nc, js.publish(subject, body, timeout=5), subject)
                assert (denied.user, denied.operation) == ("operator", "publish")
                await refused(nc, nc.publish(subject, body), subject)  # core, no ack
        finally:
            await close_quietly(nc)
        assert await snapshot(town.nc, "mayor") == before, "nothing was stored, nothing changed"
    lines = st.violations()
    for subject in RESERVED_SUBJECTS:
        assert any('"GT/user:operator"' in line and f'Subject "{subject}"' in line for line in lines), lines


async def test_an_operator_naming_a_service_is_refused_and_limited_as_an_operator(
    st: SecuredTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Five commands at once per operator label, then about one per 100 s: a service would not be limited at all.
    monkeypatch.setenv("GT_RATE_OPERATOR", "0.01")
    monkeypatch.setenv("GT_RATE_OPERATOR_BURST", "5")
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        nc = town.nc  # the operator's connection
        js = nc.jetstream()
        start = int((await js.stream_info("GT_EVT")).state.last_seq)
        posing = await command(nc, "gt.cmd.bead.create", title="As the mayor", actor="mayor")
        assert (posing["type"], posing["code"]) == ("cmd.rejected", "unauthorized"), posing
        assert "decided by the subject" in posing["message"], posing
        assert [kind for kind, _actor, _ in await events_after(nc, start)] == ["cmd.rejected"], "only the refusal"
        for label in ("refinery", "polecat:demo/ace", "automation:nightly", " Deacon "):
            other = await command(nc, "gt.cmd.bead.create", title="As someone else", actor=label)
            assert (other["type"], other["code"]) == ("cmd.rejected", "unauthorized"), (label, other)
        # Charged as the operator it is, not exempt as the service it named: its burst of five is spent.
        assert (await command(nc, "gt.cmd.bead.create", title="x", actor="mayor"))["code"] == "rate_limited"
        assert not [e for e in await events_after(nc, start) if e[0] == "bead.created"], "nothing was created"

        # An operator's own label is kept, and limited as an operator's (its own bucket).
        for n in range(5):
            made = await command(nc, "gt.cmd.bead.create", title=f"Ann's {n}", actor="operator:ann")
            assert made["type"] == "cmd.accepted", made
            assert await event_actor(nc, f"gt.evt.bead.{made['result']['id']}", "bead.created") == "operator:ann"
        limited = await command(nc, "gt.cmd.bead.create", title="Ann's sixth", actor="operator:ann")
        assert (limited["type"], limited["code"]) == ("cmd.rejected", "rate_limited"), limited
        assert "operator:ann sends commands faster than an operator may" in limited["message"]


# ---- the services: their own subjects, recorded as themselves ---------------------------------------------


@contextlib.asynccontextmanager
async def commands_seen(st: SecuredTown) -> AsyncIterator[list[str]]:
    """The subjects of the commands stored in GT_CMD from now on (an ordered consumer, as a service may make)."""
    nc = await st.connect("mayor")
    seen: list[str] = []

    async def on_command(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await nc.jetstream().subscribe("gt.cmd.>", stream="GT_CMD", ordered_consumer=True, cb=on_command)
    try:
        yield seen
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        await close_quietly(nc)


async def test_a_services_commands_come_on_its_own_subject_and_are_recorded_as_it(
    st: SecuredTown, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_the_witness_identity(st, monkeypatch)
    automations = st.home / "automations"
    automations.mkdir(parents=True)
    # A formula nobody has: the deacon's run files a bead, its sling is refused, it closes the bead again.
    (automations / "broken.toml").write_text('[automation]\ngate = "manual"\nformula = "no-such"\nrig = "demo"\n')
    async with (
        services_as_themselves(st, tmp_path, "mayor", "witness", "refinery", "deacon") as town,
        commands_seen(st) as seen,
    ):
        added = await st.gt(
            "operator", "rig", "add", "demo", str(town.origin), "--test", TEST_COMMAND, "--agent", "gt-agent"
        )
        assert added.returncode == 0, added.stderr
        created = await st.gt("operator", "bead", "create", "Merge me")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        assert (await st.gt("operator", "sling", bead, "demo")).returncode == 0

        def closed() -> bool:
            assert town.mayor is not None
            return town.mayor.projection.state.beads[bead].status == "closed"

        await assert_eventually(closed, timeout=120, interval=0.1)  # the agent worked it, the refinery merged it
        assert await event_actor(town.nc, f"gt.evt.bead.{bead}", "bead.closed") == "refinery"
        assert "gt.cmd.bead.close.svc.refinery" in seen, seen

        ran = await command(town.nc, "gt.cmd.automation.run", name="broken", actor="operator:ann")
        assert ran["type"] == "cmd.accepted", ran

        async def filed_and_closed() -> str:
            made = [e for e in await events_after(town.nc, 0) if e[0] == "bead.created" and e[2]["title"] != "Merge me"]
            assert made, "the automation filed its bead"
            _kind, actor, payload = made[-1]
            assert await event_actor(town.nc, f"gt.evt.bead.{payload['bead_id']}", "bead.closed") == actor
            return actor

        automation_actor: str = await assert_eventually(filed_and_closed, timeout=60)
        assert automation_actor == "automation:broken"
        assert "gt.cmd.bead.create.svc.deacon" in seen, seen
        # Nothing a service sent came on a plain subject (those are the operator's: rig add, create, sling, run).
        plain = [s for s in seen if s.count(".") == 3]
        assert sorted(set(plain)) == [
            "gt.cmd.automation.run",
            "gt.cmd.bead.create",
            "gt.cmd.bead.sling",
            "gt.cmd.rig.add",
        ]
    assert st.violations() == []


# ---- an upgrade: commands stored before it keep their rule ------------------------------------------------


async def test_commands_stored_before_the_upgrade_are_settled_as_they_were_sent(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    """A town upgraded from a version whose services sent their commands on the plain subjects, naming themselves
    in the body: a command of theirs still waiting in GT_CMD (here the refinery's close, while the mayor was down)
    is carried out as theirs, and only commands stored after the upgrade are held to the subject."""
    js = nc.jetstream()
    handle = PolecatTown(town, nc, tmp_path, "unused")
    handle.mayor = MayorService(town, FAST)
    await handle.start("mayor", handle.mayor)
    info = await js.stream_info("GT_CMD")
    assert origin_cutover(info.config.metadata) == 1, "a new town: every command is held to its subject"
    bead = await handle.new_bead("Merged before the upgrade")
    await handle.stop("mayor")

    # GT_CMD as the older version left it, holding the old refinery's close for the mayor.
    info = await js.stream_info("GT_CMD")
    metadata = {k: v for k, v in (info.config.metadata or {}).items() if k != ORIGIN_CUTOVER_KEY}
    await js.update_stream(dataclasses.replace(info.config, metadata=metadata))
    old_close = {"id": bead, "reason": "merged", "actor": "refinery", "cmd_id": "close-mr-old"}
    stored = await js.publish("gt.cmd.bead.close", json.dumps(old_close).encode(), stream="GT_CMD")

    handle.mayor = MayorService(town, FAST)
    await handle.start("mayor", handle.mayor)
    try:
        info = await js.stream_info("GT_CMD")
        assert origin_cutover(info.config.metadata) == stored.seq + 1, info.config.metadata
        outcome: dict[str, Any] = await assert_eventually(lambda: stored_outcome(nc, "close-mr-old"), timeout=30)
        assert outcome["type"] == "cmd.accepted", outcome
        assert await event_actor(nc, f"gt.evt.bead.{bead}", "bead.closed") == "refinery"
        # The same form sent now is an operator's naming a service.
        now = await command(nc, "gt.cmd.bead.create", title="Forged", actor="refinery")
        assert (now["type"], now["code"]) == ("cmd.rejected", "unauthorized"), now
        # A second start records nothing new: the cut-over stays where the upgrade put it.
        await handle.stop("mayor")
        handle.mayor = MayorService(town, FAST)
        await handle.start("mayor", handle.mayor)
        info = await js.stream_info("GT_CMD")
        assert origin_cutover(info.config.metadata) == stored.seq + 1
    finally:
        await handle.stop_all()


async def stored_outcome(nc: Client, cmd_id: str) -> dict[str, Any]:
    for _seq, _subject, data in await read_all(nc, "GT_EVT", f"gt.evt.cmd.{cmd_id}"):
        env = decode_envelope(data)
        return {"type": env.type, **json.loads(bytes(env.data))}
    raise AssertionError(f"no outcome of {cmd_id} yet")
