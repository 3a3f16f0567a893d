"""Reading a command's outcome from the real log (``shared.bus.commands.read_outcome``): direct gets of its subject,
read again until it is there, with no consumer created for it."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime
from pathlib import Path

import nats
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from shared.bus.commands import STORE_ACK_TIMEOUT_S, STORE_DEADLINE_S, read_outcome, send, store
from shared.bus.topology import provision
from shared.core import ids, subjects
from shared.core.config import TownConfig
from shared.model.commands import BeadCreate
from shared.model.events import CommandAccepted, decode_envelope, encode_event
from shared.model.results import BeadResult

TS = datetime(2026, 11, 28, tzinfo=UTC)


async def store_outcome(nc: Client, town: TownConfig, cmd_id: str) -> int:
    outcome = CommandAccepted(command_id=cmd_id, command="bead.create", result={"id": "hq-abc123"})
    data = encode_event(outcome, event_id=f"e-{cmd_id}", ts=TS, actor="mayor")
    ack = await nc.jetstream().publish(subjects.outcome_subject(cmd_id), data, stream=town.evt_stream)
    return int(ack.seq)


async def consumers_of(nc: Client, town: TownConfig) -> int:
    return int((await nc.jetstream().stream_info(town.evt_stream)).state.consumer_count)


async def test_an_outcome_stored_before_the_read_is_found_at_once(nc: Client, town: TownConfig) -> None:
    await provision(nc, town)
    seq = await store_outcome(nc, town, "c-before")
    found = await read_outcome(nc, town.evt_stream, "c-before", timeout=5)
    assert found is not None
    assert found[0] == seq
    assert decode_envelope(found[1]).type == "cmd.accepted"


async def test_an_outcome_stored_while_waiting_is_read_without_a_consumer(nc: Client, town: TownConfig) -> None:
    await provision(nc, town)
    before = await consumers_of(nc, town)
    waiting = asyncio.ensure_future(read_outcome(nc, town.evt_stream, "c-later", timeout=30))
    await asyncio.sleep(0.5)  # it has read a few times and found nothing
    assert not waiting.done()
    assert await consumers_of(nc, town) == before, "no consumer was created to wait for the outcome"
    await store_outcome(nc, town, "c-other")  # another command's outcome is not this one's
    seq = await store_outcome(nc, town, "c-later")
    found = await asyncio.wait_for(waiting, timeout=10)
    assert found is not None
    assert found[0] == seq
    assert decode_envelope(found[1]).id == "e-c-later"


async def test_no_outcome_within_the_timeout_reads_as_none(nc: Client, town: TownConfig) -> None:
    await provision(nc, town)
    assert await read_outcome(nc, town.evt_stream, "c-never", timeout=0.5) is None


async def test_a_command_sent_waits_for_its_outcome_without_a_consumer(nc: Client, town: TownConfig) -> None:
    """What `gt` does for every command. It used to open an ordered consumer on GT_EVT first: a round trip to the
    cluster's meta leader per command, and in a three-node cluster with a node down one placed on that node never
    answered (issue 29)."""
    await provision(nc, town)
    before = await consumers_of(nc, town)
    cmd = BeadCreate(title="waits for a mayor", cmd_id="c-sent")
    sent = asyncio.ensure_future(send(nc, town, cmd, timeout=30, wait_if_down=True))
    await asyncio.sleep(0.5)
    assert not sent.done()
    assert await consumers_of(nc, town) == before, "no consumer was created to wait for the outcome"
    seq = await store_outcome(nc, town, "c-sent")  # as the mayor would, once it has carried it out
    outcome = await asyncio.wait_for(sent, timeout=10)
    # The outcome stored here names only the id: read into the create's result type, the rest at its defaults.
    assert (outcome.type, outcome.outcome_seq, outcome.result) == ("cmd.accepted", seq, BeadResult(id="hq-abc123"))


async def test_a_store_that_got_no_answer_is_resent_with_the_same_id_and_stored_once(
    own_nats_server: EmbeddedServer, tmp_path: Path
) -> None:
    """The nats-server frozen (SIGSTOP) while a command is stored: the first attempt gets no acknowledgement in
    time, the CLI's store resends it under the same id within its deadline, and once the server answers again the
    command is in GT_CMD once (the resend deduplicated against the first copy, whichever arrived)."""
    town = TownConfig(nats_url=own_nats_server.url, gt_home=tmp_path / "home")
    nc = await nats.connect(own_nats_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        await provision(nc, town)
        cmd = BeadCreate(title="stored through a frozen server", cmd_id="cli-frozen-1")
        assert own_nats_server.proc is not None
        own_nats_server.proc.send_signal(signal.SIGSTOP)
        try:
            storing = asyncio.ensure_future(store(nc, town.cmd_stream, cmd, evt_stream=town.evt_stream))
            # Frozen for longer than one attempt's acknowledgement timeout (5 s): the first attempt fails.
            await asyncio.sleep(STORE_ACK_TIMEOUT_S + 1)  # the absence of an answer is what is under test
            assert not storing.done()
        finally:
            own_nats_server.proc.send_signal(signal.SIGCONT)
        seq = (await asyncio.wait_for(storing, timeout=STORE_DEADLINE_S)).seq
        info = await nc.jetstream().stream_info(town.cmd_stream)
        assert info.state.messages == 1, "stored once"
        stored = await nc.jetstream().get_msg(town.cmd_stream, seq)
        assert (stored.headers or {}).get("Nats-Msg-Id") == "cli-frozen-1"
    finally:
        await nc.close()


async def test_an_id_a_session_took_first_is_not_the_services_command(nc: Client, town: TownConfig) -> None:
    """A session that stores a command under the id a service will use (``close-<mr>``, predictable) does not
    make the service's command a duplicate: the service, finding the id held by a message on another subject,
    stores its command again under a fresh id, and both are there. Its own resend (same subject) stays one."""
    await provision(nc, town)
    session = subjects.SessionOrigin("demo", "p1", "s-1")
    squat = BeadCreate(title="an id that is not mine", cmd_id="close-mr-abc")
    await store(nc, town.cmd_stream, squat, evt_stream=town.evt_stream, origin=session)
    mine = BeadCreate(title="the refinery's", cmd_id="close-mr-abc")
    refinery = subjects.ServiceOrigin("refinery")
    stored = await store(nc, town.cmd_stream, mine, evt_stream=town.evt_stream, origin=refinery)
    assert stored.cmd_id.startswith("close-mr-abc-"), stored
    held = await nc.jetstream().get_msg(town.cmd_stream, stored.seq)
    assert held.subject == subjects.sent_subject(BeadCreate.SUBJECT, refinery)
    assert (held.headers or {})["Nats-Msg-Id"] == stored.cmd_id
    assert b"the refinery's" in (held.data or b"")
    again = BeadCreate(title="the refinery's", cmd_id=stored.cmd_id)
    resent = await store(nc, town.cmd_stream, again, evt_stream=town.evt_stream, origin=refinery)
    assert resent == stored, "a resend of the service's own command is the same message"


async def test_a_sessions_command_is_read_back_in_its_own_namespace(nc: Client, town: TownConfig) -> None:
    """The outcome a session waits for is its own scope's (``<session>~<id>``): the outcome of a command under the
    bare id (a service's, the operator's) is not taken for the session's."""
    await provision(nc, town)
    session = subjects.SessionOrigin("demo", "p1", "s-1")
    await store_outcome(nc, town, "c-shared")  # someone else's command of that id, settled
    cmd = BeadCreate(title="mine", cmd_id="c-shared")
    sent = asyncio.ensure_future(send(nc, town, cmd, origin=session, timeout=30, wait_if_down=True))
    await asyncio.sleep(0.5)  # it read the log a few times: the bare id's outcome is not its own
    assert not sent.done()
    seq = await store_outcome(nc, town, "s-1~c-shared")
    outcome = await asyncio.wait_for(sent, timeout=10)
    assert (outcome.command_id, outcome.outcome_seq) == ("s-1~c-shared", seq)


async def test_a_consumed_duplicate_is_the_senders_own_when_its_outcome_is_there(nc: Client, town: TownConfig) -> None:
    """GT_CMD forgets a command once its owner acked it, its id stays in the dedupe window: a resend of a command
    already carried out (its outcome in the log) is the sender's own, never sent again under a fresh id; one whose
    earlier message is gone with no outcome of that id was someone else's (a session's, settled in its scope)."""
    await provision(nc, town)
    refinery = subjects.ServiceOrigin("refinery")
    js = nc.jetstream()
    for cmd_id, settled in (("close-mr-own", True), ("close-mr-other", False)):
        first = await store(nc, town.cmd_stream, BeadCreate(title="t", cmd_id=cmd_id), evt_stream=town.evt_stream)
        await js.delete_msg(town.cmd_stream, first.seq)  # consumed
        if settled:
            await store_outcome(nc, town, cmd_id)
        again = await store(
            nc, town.cmd_stream, BeadCreate(title="t", cmd_id=cmd_id), evt_stream=town.evt_stream, origin=refinery
        )
        assert (again.cmd_id == cmd_id) is settled, again


async def test_an_id_that_is_no_subject_token_is_sent_and_read_back_as_its_digest(nc: Client, town: TownConfig) -> None:
    """`gt escalate --id Ops-Check-1`: the id is normalised where it is sent, as the intake would settle it, so
    the message id, the body and the outcome read back all name the digest."""
    await provision(nc, town)
    stored = await store(nc, town.cmd_stream, BeadCreate(title="t", cmd_id="Ops-Check-1"), evt_stream=town.evt_stream)
    assert stored.cmd_id == ids.command_id("Ops-Check-1", None, 0) != "Ops-Check-1"
    held = await nc.jetstream().get_msg(town.cmd_stream, stored.seq)
    assert (held.headers or {})["Nats-Msg-Id"] == stored.cmd_id
    assert stored.cmd_id.encode() in (held.data or b"")
