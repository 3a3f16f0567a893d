"""A command's actor comes from the subject a polecat session may publish on, never from its body. Pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from services.mayor import queries
from services.mayor.decide.mail import own_message
from services.mayor.state import MESSAGE_TYPE, Bead, Convoy, KnownRig, MayorState
from services.witness import queries as witness_queries
from services.witness.state import WitnessState
from shared.core.errors import CommandError, QueryError
from shared.core.subjects import SessionOrigin
from shared.model.commands import BeadClaim, Fence, MailArchive, SessionHandoff, StepDone
from shared.model.queries import registry
from shared.model.queries.base import Page
from shared.service.intake import Sender, command_actor, impersonation
from tests import records

ACE = SessionOrigin("demo", "ace", "hq-a-1")


def ask(state: MayorState, what: str, body: dict[str, Any], *, sees: queries.Sees) -> Any:
    """The mayor's answer to ``gt.q.mayor.<what>`` with ``body``, decoded as its query server decodes it."""
    return queries.answer(state, registry.decode("mayor", what, body), sees=sees)


def check_mayor(state: MayorState, what: str, body: dict[str, Any], session: str) -> None:
    queries.check_session_query(state, registry.decode("mayor", what, body), session)


def witness_state() -> WitnessState:
    """Sessions hq-a-1 (bead hq-a, polecat ace) and hq-b-1 (bead hq-b, polecat bob) of rig demo."""
    state = WitnessState()
    for session, polecat in (("hq-a-1", "ace"), ("hq-b-1", "bob")):
        state.sessions[session] = records.session(id=session, polecat=polecat, bead=session.removesuffix("-1"))
    return state


def check_witness(what: str, body: dict[str, Any], session: str) -> None:
    witness_queries.check_session_query(witness_state(), registry.decode("witness", what, body), session)


def test_the_subject_names_the_actor_whatever_the_body_says() -> None:
    assert command_actor("mayor", ACE) == Sender("polecat:demo/ace", "agent")
    assert command_actor(None, ACE) == Sender("polecat:demo/ace", "agent")
    assert command_actor("operator:ann", None) == Sender("operator:ann", "operator"), "plain subjects: operators"
    assert command_actor(None, None) == Sender("operator", "operator")


def test_a_session_names_only_itself() -> None:
    assert impersonation(SessionHandoff(session="hq-a-1", note=""), ACE) is None
    refused = impersonation(SessionHandoff(session="hq-b-1", note=""), ACE)
    assert refused is not None
    assert refused.code == "unauthorized"
    assert "hq-b-1" in refused.message
    assert impersonation(MailArchive(id="hq-m"), ACE) is None, "no session field, no bead: nothing to check"


def test_a_session_works_only_the_bead_whose_hook_it_holds() -> None:
    own = Fence(lease="hook-hq-b", token=3)
    assert impersonation(StepDone(bead="hq-b", step="s1", fence=own), ACE) is None, "holder checked by the fence"
    for cmd in (
        StepDone(bead="hq-b", step="s1"),
        StepDone(bead="hq-b", step="s1", fence=Fence(lease="hook-hq-c", token=1)),
        BeadClaim(id="hq-b", assignee="me"),
    ):
        refused = impersonation(cmd, ACE)
        assert refused is not None, cmd
        assert refused.code == "unauthorized", cmd
        assert "hook-hq-b" in refused.message, cmd


def mailbox_state() -> MayorState:
    state = MayorState()
    now = datetime.now(UTC)
    state.beads["hq-m"] = Bead(
        id="hq-m",
        title="hi",
        type=MESSAGE_TYPE,
        assignee="polecat:demo/bob",
        metadata={"thread": "hq-m", "from": "operator"},
        created_at=now,
        updated_at=now,
    )
    return state


def test_a_polecat_acts_only_on_mail_in_its_own_inbox() -> None:
    state = mailbox_state()
    assert own_message(state, "hq-m", "polecat:demo/bob").id == "hq-m"
    assert own_message(state, "hq-m", "operator").id == "hq-m", "operators and services act on any mail"
    assert own_message(state, "hq-m", "mayor").id == "hq-m"
    with pytest.raises(CommandError) as refused:
        own_message(state, "hq-m", "polecat:demo/ace")
    assert refused.value.code == "unauthorized"


def test_a_session_asks_only_about_its_own_mail_and_record() -> None:
    state = mailbox_state()
    state.rigs["demo"] = KnownRig(name="demo", polecats={"ace": "hq-a-1", "bob": None})
    check_witness("session", {"id": "hq-a-1"}, "hq-a-1")
    check_witness("sessions", {"bead": "hq-a", "all": True}, "hq-a-1")  # its bead's: the earlier ones' notes
    with pytest.raises(QueryError) as refused:
        check_witness("session", {"id": "hq-b-1"}, "hq-a-1")
    assert refused.value.code == "unauthorized"
    # The red team read another session's handoff note and pane through the lists, and the operator's nudges.
    for what, body in (
        ("sessions", {"all": True}),
        ("sessions", {}),
        ("sessions", {"rig": "demo"}),
        ("sessions", {"bead": "hq-b", "all": True}),
        ("nudges", {"all": True}),
        ("nudges", {}),
    ):
        with pytest.raises(QueryError) as listed:
            check_witness(what, body, "hq-a-1")
        assert listed.value.code == "unauthorized", (what, body)
    with pytest.raises(QueryError, match="lists only its own bead"):
        check_witness("sessions", {"bead": "hq-a"}, "hq-gone-1")
    with pytest.raises(QueryError) as other:
        check_mayor(state, "inbox", {"to": "polecat:demo/bob"}, "hq-a-1")
    assert other.value.code == "unauthorized"
    check_mayor(state, "inbox", {"to": "demo/ace"}, "hq-a-1")
    with pytest.raises(QueryError, match="holds mail"):
        check_mayor(state, "thread", {"thread": "hq-m"}, "hq-a-1")
    with pytest.raises(QueryError, match="no live polecat session"):
        check_mayor(state, "inbox", {"to": "polecat:demo/bob"}, "hq-gone-1")
    check_mayor(state, "ready", {}, "hq-a-1")


def test_a_sessions_lists_leave_out_others_mail_and_a_message_of_others_is_refused() -> None:
    """Issue 20: mail is private between polecats at the query level too (``get``, ``list`` and every list)."""
    state = mailbox_state()  # hq-m: from the operator to bob
    state.rigs["demo"] = KnownRig(name="demo", polecats={"ace": "hq-a-1", "bob": "hq-b-1"})
    now = datetime.now(UTC)
    state.beads["hq-own"] = Bead(
        id="hq-own",
        title="for ace",
        type=MESSAGE_TYPE,
        assignee="polecat:demo/ace",
        metadata={"thread": "hq-own", "from": "operator"},
        created_at=now,
        updated_at=now,
    )
    state.beads["hq-sent"] = Bead(
        id="hq-sent",
        title="from ace",
        type=MESSAGE_TYPE,
        assignee="mayor",
        metadata={"thread": "hq-sent", "from": "polecat:demo/ace"},
        created_at=now,
        updated_at=now,
    )
    state.beads["hq-work"] = Bead(id="hq-work", title="work", created_at=now, updated_at=now, needs=["hq-m"])
    state.convoys["cv-1"] = Convoy(id="cv-1", title="c", beads=["hq-work", "hq-m", "hq-own"], created_at=now)
    ace = queries.mail_visible_to(state, "hq-a-1")

    def ids(found: Page) -> list[str]:
        return sorted(b.id for b in found.items)

    assert ids(ask(state, "list", {}, sees=ace)) == ["hq-own", "hq-sent", "hq-work"]
    assert ids(ask(state, "list", {"type": "message"}, sees=ace)) == ["hq-own", "hq-sent"]
    assert ids(ask(state, "list", {}, sees=queries.everything)) == ["hq-m", "hq-own", "hq-sent", "hq-work"]
    assert ids(ask(state, "list", {}, sees=queries.mail_visible_to(state, "hq-b-1"))) == ["hq-m", "hq-work"]
    assert ask(state, "get", {"id": "hq-own"}, sees=ace).id == "hq-own"
    assert ask(state, "get", {"id": "hq-sent"}, sees=ace).id == "hq-sent", "mail it sent"
    for what, body in (
        ("get", {"id": "hq-m"}),
        ("molecule", {"bead": "hq-m"}),
        ("deps", {"id": "hq-m"}),
        ("children", {"id": "hq-m"}),
    ):
        with pytest.raises(QueryError) as refused:
            ask(state, what, body, sees=ace)
        assert refused.value.code == "unauthorized", what
        assert "hq-m" in refused.value.message
    assert ask(state, "deps", {"id": "hq-work"}, sees=ace) == [], "a message it may not see is left out"
    details = ask(state, "convoy", {"id": "cv-1"}, sees=ace).bead_details
    assert [d.id for d in details] == ["hq-work", "hq-own"]
    assert ask(state, "thread", {"thread": "hq-m"}, sees=ace) == []
    # A session no longer live sees no mail at all.
    gone = queries.mail_visible_to(state, "hq-gone-1")
    assert ids(ask(state, "list", {}, sees=gone)) == ["hq-work"]
