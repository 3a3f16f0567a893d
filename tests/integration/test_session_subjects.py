"""A polecat session acts only as itself: a command it sends on its own subject
(``gt.cmd.<aggregate>.<verb>.<rig>.<polecat>.<session>``, the only command subjects its NATS identity may publish
on under the shipped accounts) is its polecat's whatever its body claims, cannot name another session, cannot use
another session's fencing token, and cannot touch another polecat's mail; a query asked from a session's private
inbox cannot read another polecat's mail or session record.

Real nats-server, mayor, witness and refinery, two live sessions in real tmux, real git.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import nats

from services.witness.state import Session
from shared.core import subjects
from shared.model.events import decode_envelope
from tests.drivers import send_and_wait
from tests.helpers import assert_eventually
from tests.log_tools import read_all
from tests.witness_town import PolecatTown


async def as_session(pt: PolecatTown, sender: Session, aggregate: str, verb: str, **body: Any) -> dict[str, Any]:
    """Send a command the way a session's `gt` does: on the session's own subject."""
    origin = subjects.SessionOrigin(sender.rig, sender.polecat, sender.id)
    cmd_id = f"t-{uuid.uuid4().hex[:12]}"
    raw = json.dumps({**body, "cmd_id": cmd_id}).encode()
    return await send_and_wait(pt.nc, subjects.session_command_subject(aggregate, verb, origin), raw, cmd_id)


async def operator_mail(pt: PolecatTown, to: str, body: str) -> str:
    cmd_id = f"t-{uuid.uuid4().hex[:12]}"
    raw = json.dumps({"to": to, "subject": "from the operator", "body": body, "cmd_id": cmd_id}).encode()
    outcome = await send_and_wait(pt.nc, "gt.cmd.mail.send", raw, cmd_id)
    assert outcome["type"] == "cmd.accepted", outcome
    return str(outcome["result"]["id"])


async def two_live_sessions(pt: PolecatTown) -> tuple[Session, Session]:
    await pt.add_rig(agent_command="sleep 600", max_polecats=2)
    beads = [await pt.new_bead("First"), await pt.new_bead("Second")]
    for bead in beads:
        await pt.sling(bead)

    def started() -> tuple[Session, Session]:
        found = [pt.sessions_of(bead) for bead in beads]
        for sessions in found:
            assert sessions, found
            assert sessions[-1].status == "started", found
            assert sessions[-1].lease_token is not None, found
        return found[0][-1], found[1][-1]

    result: tuple[Session, Session] = await assert_eventually(started, timeout=60, interval=0.1)
    return result


async def event_actor(pt: PolecatTown, aggregate: str, aggregate_id: str, kind: str) -> str:
    for _seq, _subject, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.{aggregate}.{aggregate_id}"):
        env = decode_envelope(data)
        if env.type == kind:
            return env.actor
    raise AssertionError(f"no {kind} on {aggregate}.{aggregate_id}")


async def test_a_sessions_command_is_its_polecats_whatever_its_body_says(pt: PolecatTown) -> None:
    a, b = await two_live_sessions(pt)
    me = f"polecat:demo/{a.polecat}"

    sent = await as_session(pt, a, "mail", "send", to="mayor", subject="hi", body="it is me", actor="mayor")
    assert sent["type"] == "cmd.accepted", sent
    message = sent["result"]["id"]
    assert await event_actor(pt, "bead", message, "bead.created") == me, "the body's actor is not believed"
    raised = await as_session(pt, a, "escalation", "raise", severity="low", message="help", source="deacon")
    assert raised["type"] == "cmd.accepted", raised
    assert await event_actor(pt, "escalation", raised["result"]["id"], "escalation.raised") == me

    # Another session's name in the body is refused.
    handoff = await as_session(pt, a, "session", "handoff", session=b.id, note="bye")
    assert handoff["type"] == "cmd.rejected", handoff
    assert handoff["code"] == "unauthorized", handoff
    assert b.id in handoff["message"], handoff
    assert pt.sessions_of(b.bead)[-1].status == "started", "the other session was not ended"


async def test_a_session_cannot_use_another_sessions_fence(pt: PolecatTown) -> None:
    a, b = await two_live_sessions(pt)
    assert b.lease_token is not None
    fence = {"lease": f"hook-{b.bead}", "token": b.lease_token}
    molecule = await pt.nc.request("gt.q.mayor.molecule", json.dumps({"bead": b.bead}).encode(), timeout=10)
    step = json.loads(molecule.data)["result"]["steps"][0]["id"]

    stolen = await as_session(pt, a, "step", "start", bead=b.bead, step=step, fence=fence)
    assert stolen["type"] == "cmd.rejected", stolen
    assert stolen["code"] == "unauthorized", stolen
    assert f"not held by session {a.id}" in stolen["message"], stolen

    own = await as_session(pt, b, "step", "start", bead=b.bead, step=step, fence=fence)
    assert own["type"] == "cmd.accepted", own

    # Without a fence at all: a session works only the bead it holds (its hook lease is its fence).
    for verb in ("start", "done"):
        unfenced = await as_session(pt, a, "step", verb, bead=b.bead, step=step)
        assert unfenced["type"] == "cmd.rejected", unfenced
        assert unfenced["code"] == "unauthorized", unfenced
        assert "only the bead it holds" in unfenced["message"], unfenced
    claimed = await as_session(pt, a, "bead", "claim", id=b.bead, assignee="me")
    assert claimed["type"] == "cmd.rejected", claimed
    assert claimed["code"] == "unauthorized", claimed


async def test_a_service_answers_a_query_only_to_an_inbox(pt: PolecatTown) -> None:
    """Answered on a subject the asker chose, the answer would carry the service's own rights: a forged event
    in the log, an overwritten key, a service told it lost its activity key."""
    js = pt.nc.jetstream()
    before = (await js.stream_info("GT_EVT")).state.last_seq
    for reply in ("gt.evt.bead.hq-forged", "$KV.GT_ACTIVE.mayor", "gt.cmd.bead.close", "_INBOX", "_INBOX.>"):
        await pt.nc.publish("gt.q.mayor.status", b"{}", reply=reply)
        await pt.nc.publish("gt.q.witness.status", b"{}", reply=reply)
    # A query through an inbox is still answered, and by then the ones above have been handled.
    for service in ("mayor", "witness"):
        answered = await pt.nc.request(f"gt.q.{service}.status", b"{}", timeout=10)
        assert json.loads(answered.data)["ok"] is True

    def refused() -> bool:
        assert pt.mayor is not None
        assert pt.witness is not None
        assert pt.mayor.queries_refused == 5, pt.mayor.queries_refused
        assert pt.witness.queries_refused == 5, pt.witness.queries_refused
        return True

    assert (await js.stream_info("GT_EVT")).state.last_seq == before, "nothing reached the log"
    await assert_eventually(refused, timeout=10)
    # The mayor still acts (no answer told it that it lost its activity key).
    assert await pt.new_bead("Still here")


async def test_a_session_touches_only_its_own_mail(pt: PolecatTown) -> None:
    a, b = await two_live_sessions(pt)
    to_b = await operator_mail(pt, f"polecat:demo/{b.polecat}", "secret")

    for verb, extra in (("read", {}), ("archive", {}), ("reply", {"body": "ha"})):
        refused = await as_session(pt, a, "mail", verb, id=to_b, **extra)
        assert refused["type"] == "cmd.rejected", (verb, refused)
        assert refused["code"] == "unauthorized", (verb, refused)
    archived = await as_session(pt, b, "mail", "archive", id=to_b)
    assert archived["type"] == "cmd.accepted", archived


async def test_a_query_from_a_sessions_inbox_reads_only_its_own_mail_and_record(pt: PolecatTown) -> None:
    a, b = await two_live_sessions(pt)
    await operator_mail(pt, f"polecat:demo/{b.polecat}", "secret")
    asker = await nats.connect(pt.config.nats_url, inbox_prefix=subjects.session_inbox_prefix(a.id))
    try:

        async def ask(subject: str, **body: Any) -> dict[str, Any]:
            reply = await asker.request(subject, json.dumps(body).encode(), timeout=10)
            answer: dict[str, Any] = json.loads(reply.data)
            return answer

        others = await ask("gt.q.mayor.inbox", to=f"polecat:demo/{b.polecat}")
        assert others["ok"] is False, others
        assert others["code"] == "unauthorized", others
        own = await ask("gt.q.mayor.inbox", to=f"polecat:demo/{a.polecat}")
        assert own["ok"] is True, own
        assert own["result"] == [], own
        record = await ask("gt.q.witness.session", id=b.id)
        assert record["ok"] is False, record
        assert record["code"] == "unauthorized", record
        mine = await ask("gt.q.witness.session", id=a.id)
        assert mine["ok"] is True, mine
        assert mine["result"]["id"] == a.id, mine
    finally:
        await asker.close()
    # An operator (any other inbox) still reads every inbox.
    reply = await pt.nc.request("gt.q.mayor.inbox", json.dumps({"to": f"polecat:demo/{b.polecat}"}).encode(), 10)
    assert len(json.loads(reply.data)["result"]) == 1
