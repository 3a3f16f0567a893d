"""Every query the witness, the refinery and the deacon answer, asked of a state that has something to show: the
answer as the wire carries it (JSON) reads back into the query's reply type, field for field. (The mayor's are
checked the same way by every contract test: ``tests/drivers.py`` ``read_as_declared``.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec
import pytest

from services.deacon import queries as deacon_queries
from services.deacon.projection import new_projection as deacon_projection
from services.deacon.state import DeaconState
from services.refinery import plan as refinery_plan
from services.refinery import queries as refinery_queries
from services.witness import queries as witness_queries
from shared.bus.query import reply_of
from shared.model import events as ev
from shared.model.queries import Query, deacon, refinery, witness
from tests.memory_log import Fed
from tests.unit.test_gc import Refinery
from tests.unit.test_witness_plan import World

_JSON = msgspec.json.Encoder()


def on_the_wire(answer: Any) -> Any:
    """The answer's ``result`` as a client decodes it from the reply."""
    return msgspec.json.decode(_JSON.encode(answer))


def assert_reads_back(query: Query[Any], answer: Any) -> Any:
    """``answer`` read from the wire into ``query``'s reply type loses and changes nothing; the typed reply."""
    typed = reply_of(query, on_the_wire(answer))
    assert msgspec.to_builtins(typed) == msgspec.to_builtins(answer), query.subject()
    return typed


def witness_world() -> World:
    """A rig with a session that handed off, its successor at work, and a nudge for it."""
    w = World()
    w.rig()
    w.bead("de-1")
    first = w.running("de-1")
    w.add(ev.SessionEnded(session_id=first, reason="handoff", detail="half done"))
    w.running("de-1")
    w.add(
        ev.NudgeQueued(
            nudge_id="n-1", rig="demo", polecat="ace", message="look", expires_at=w.clock + timedelta(hours=1)
        )
    )
    return w


@pytest.mark.parametrize(
    "query",
    [
        witness.Rigs(),
        witness.Rigs(all=True),
        witness.Rig(name="demo"),
        witness.Sessions(all=True),
        witness.Nudges(all=True),
    ],
    ids=lambda q: q.NAME,
)
def test_every_witness_answer_reads_into_its_reply_type(query: Query[Any]) -> None:
    w = witness_world()
    answer = witness_queries.answer(w.state, query)
    assert answer, "something to show"
    assert_reads_back(query, answer)


def test_a_session_answer_carries_its_earlier_sessions_rig_and_nudges_typed() -> None:
    w = witness_world()
    current = next(s for s in w.state.sessions.values() if s.status == "started")
    query = witness.Session(id=current.id)
    session = assert_reads_back(query, witness_queries.answer(w.state, query))
    assert session.rig_config is not None
    assert session.rig_config.name == "demo"
    assert [(e.end_reason, e.end_detail) for e in session.earlier_sessions] == [("handoff", "half done")]
    assert session.current
    assert session.bead_status is not None
    assert [n.message for n in session.nudges] == ["look"]


@pytest.mark.parametrize(
    "query", [refinery.Mrs(), refinery.Mrs(rig="demo"), refinery.Mr(id="mr-de-2")], ids=lambda q: q.NAME
)
def test_every_refinery_answer_reads_into_its_reply_type(query: Query[Any]) -> None:
    r = Refinery()
    r.submit("de-1")
    failed = r.submit("de-2")
    r.add(ev.MergeRequestClaimed(mr_id=failed, attempt=1, holder="r", lease_until=r.clock))
    r.add(ev.MergeRequestFailed(mr_id=failed, gate="test", exit_code=2, tail="boom", escalated=True))
    answer = refinery_queries.answer(r.state, query, r.clock, refinery_plan.Policy())
    assert answer, "something to show"
    assert_reads_back(query, answer)


@pytest.mark.parametrize(
    "query", [deacon.Leases(), deacon.Leases(held=True), deacon.Lease(name="hook-de-1")], ids=lambda q: q.NAME
)
def test_every_deacon_lease_answer_reads_into_its_reply_type(query: Query[Any]) -> None:
    d: Fed[DeaconState] = Fed(deacon_projection())
    d.add(
        ev.LeaseAcquired(lease="hook-de-1", holder="s1", token=1, ttl_s=60.0, expires_at=d.clock + timedelta(minutes=1))
    )
    answer = deacon_queries.answer(d.state, query, lambda _name: None)
    assert answer, "something to show"
    assert_reads_back(query, answer)
