"""The pure parts of "Before you" and agent mail: the pane tail's cleaning, the witness's record of earlier
sessions and of unread mail (announced once per message), the mayor's address checks, and `gt prime`'s text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.mayor.decide import mail as decide_mail
from services.mayor.projection import new_projection as new_mayor_projection
from services.mayor.state import MayorState
from services.witness.plan.actions import NudgeMail, Spawn
from services.witness.queries import answer
from services.witness.state import mail_nudge_id
from shared.core.errors import CommandError
from shared.host.tmux import TAIL_CHARS, TAIL_LINE_CHARS, clean_tail
from shared.model.commands.mail import normalise_address
from shared.model.events import (
    BeadClosed,
    BeadCreated,
    BeadUpdated,
    Event,
    GcSwept,
    NudgeExpired,
    NudgeQueued,
    RigAdded,
    SessionEnded,
    SessionRequested,
    SessionWarranted,
)
from shared.model.prime import before_you_lines, mail_lines
from shared.model.queries import witness
from tests import records
from tests.memory_log import MemoryLog
from tests.unit.test_witness_plan import World, only

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


# ---- the pane's tail ---------------------------------------------------------------------------


def test_a_pane_tail_is_its_last_lines_without_escapes_or_control_characters() -> None:
    screen = "\n".join(f"line {i}" for i in range(30)) + "\n\x1b[31mred\x1b[0m \x07bell\r\n\x1b]0;title\x07done\n\n\n"
    tail = clean_tail(screen, lines=5)
    assert tail.splitlines() == ["line 27", "line 28", "line 29", "red bell", "done"]


def test_a_pane_tail_is_bounded() -> None:
    tail = clean_tail("\n".join("x" * 1000 for _ in range(50)))
    assert max(len(line) for line in tail.splitlines()) <= TAIL_LINE_CHARS
    assert len(tail) <= TAIL_CHARS
    lines = [f"{i:02d} " + "y" * 200 for i in range(20)]  # 20 lines, over the bound in all
    kept = clean_tail("\n".join(lines)).splitlines()
    assert kept == lines[-len(kept) :], "whole lines only: the first one kept is not cut at its start"


# ---- the witness's record of earlier sessions --------------------------------------------------


def test_a_session_is_told_how_the_ones_before_it_ended_newest_first() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    first = w.running("gt-abc")
    w.add(SessionEnded(session_id=first, reason="handoff", detail="context full; parser half done"))
    second = w.running("gt-abc")
    w.add(SessionWarranted(session_id=second, reason="stalled", detail="no heartbeat for 700s", pane_tail="x\ny"))
    w.add(SessionEnded(session_id=second, reason="stalled", detail="killed after warrant"))
    third = w.running("gt-abc")
    view = answer(w.state, witness.Session(id=third))
    earlier = view.earlier_sessions
    assert [e.id for e in earlier] == [second, first]
    assert (earlier[0].warrant_reason, earlier[0].warrant_detail, earlier[0].pane_tail) == (
        "stalled",
        "no heartbeat for 700s",
        "x\ny",
    )
    assert (earlier[1].end_reason, earlier[1].end_detail) == ("handoff", "context full; parser half done")
    text = "\n".join(before_you_lines(earlier))
    assert f"- {second} (attempt 2): warranted (stalled): no heartbeat for 700s" in text
    assert "  | x\n  | y" in text
    assert f"- {first} (attempt 1): handed off; its note: context full; parser half done" in text
    assert answer(w.state, witness.Session(id=first)).earlier_sessions == []


def test_only_the_last_few_earlier_sessions_are_shown() -> None:
    w = World()
    w.rig(max_respawns=10)
    w.bead("gt-abc")
    for _ in range(5):
        session = w.running("gt-abc")
        w.add(SessionEnded(session_id=session, reason="handoff"))
    last = w.running("gt-abc")
    earlier = answer(w.state, witness.Session(id=last)).earlier_sessions
    assert [e.attempt for e in earlier] == [5, 4, 3]
    assert "handed off (no note)" in "\n".join(before_you_lines(earlier))


# ---- the witness announces mail ----------------------------------------------------------------


def message(message_id: str, to: str, subject: str = "Use v2") -> BeadCreated:
    return BeadCreated(
        bead_id=message_id,
        title=subject,
        type="message",
        description="body",
        assignee=to,
        metadata={"from": "operator:ann", "thread": message_id},
    )


def test_mail_to_a_polecat_is_announced_once_while_it_has_a_live_session() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    w.add(message("hq-m1", "polecat:demo/ace"), message("hq-m2", "mayor"))
    assert not [a for a in w.plan() if isinstance(a, NudgeMail)], "nobody to tell yet"
    spawn = only(w.plan(), Spawn)
    session = w.request(spawn)
    assert not [a for a in w.plan() if isinstance(a, NudgeMail)], "not while its session is starting"
    w.start(session)
    assert [a for a in w.plan() if isinstance(a, NudgeMail)] == [NudgeMail(message="hq-m1")]
    w.add(
        NudgeQueued(
            nudge_id=mail_nudge_id("hq-m1"), rig="demo", polecat="ace", message="You have mail", expires_at=w.clock
        )
    )
    assert not [a for a in w.plan() if isinstance(a, NudgeMail)], "announced once"
    w.add(message("hq-m3", "polecat:demo/ace"), message("hq-m4", "polecat:demo/ace"))
    w.add(BeadUpdated(bead_id="hq-m3", add_labels=["read"]), BeadClosed(bead_id="hq-m4", reason="archived"))
    assert not [a for a in w.plan() if isinstance(a, NudgeMail)], "read or archived mail is not announced"
    assert list(w.state.mail) == ["hq-m1"]


# ---- the mayor checks addresses ----------------------------------------------------------------


def mayor_state(*events: Event) -> MayorState:
    log, projection = MemoryLog(), new_mayor_projection()
    log.record(events, ts=T0)
    log.replay(projection)
    state: MayorState = projection.state
    return state


def session(session_id: str, polecat: str, rig: str = "demo") -> SessionRequested:
    return SessionRequested(
        session_id=session_id,
        rig=rig,
        polecat=polecat,
        bead="gt-abc",
        worktree="/w",
        branch="b",
        tmux_name=f"gt-{rig}-{polecat}",
        attempt=1,
    )


STATE_EVENTS: tuple[Event, ...] = (
    RigAdded(rig="demo", repo="/r", prefix="de", agent_command="gt-agent"),
    RigAdded(rig="idle", repo="/r", prefix="id", agent_command="gt-agent"),
    session("gt-a-1", "ace"),
    session("gt-b-1", "bob"),
    SessionEnded(session_id="gt-b-1", reason="done"),
)


@pytest.mark.parametrize(
    ("to", "address", "inboxes"),
    [
        ("mayor", "mayor", ["mayor"]),
        ("operator", "operator", ["operator"]),
        ("operator:ann", "operator:ann", ["operator:ann"]),
        ("polecat:demo/ace", "polecat:demo/ace", ["polecat:demo/ace"]),
        ("demo/bob", "polecat:demo/bob", ["polecat:demo/bob"]),  # a polecat between sessions is still there
        ("rig:demo", "rig:demo", ["polecat:demo/ace"]),  # every polecat at work now
        ("demo", "rig:demo", ["polecat:demo/ace"]),
    ],
)
def test_addresses_the_mayor_accepts(to: str, address: str, inboxes: list[str]) -> None:
    assert decide_mail.recipients(mayor_state(*STATE_EVENTS), to) == (address, inboxes)


@pytest.mark.parametrize(
    ("to", "code", "words"),
    [
        ("polecat:demo/zed", "not_found", "rig demo has no polecat 'zed' (its polecats: ace, bob)"),
        ("polecat:nope/ace", "not_found", "no rig 'nope'"),
        ("nope", "not_found", "no rig 'nope'"),
        ("idle", "not_found", "no polecat is at work on rig idle"),
        ("polecat:demo", "invalid", "accepted addresses: mayor, operator"),
        ("someone:x", "invalid", "polecat:<rig>/<name>"),
        ("Two Words", "invalid", "rig:<rig>"),
    ],
)
def test_addresses_the_mayor_refuses(to: str, code: str, words: str) -> None:
    with pytest.raises(CommandError) as info:
        decide_mail.recipients(mayor_state(*STATE_EVENTS), to)
    assert info.value.code == code
    assert words in info.value.message


def test_the_short_polecat_form_is_normalised_and_others_are_left_alone() -> None:
    assert normalise_address(" demo/ace ") == "polecat:demo/ace"
    assert normalise_address("operator:ann") == "operator:ann"


def test_prime_lists_unread_mail() -> None:
    mail = records.prime(mail=[{"id": "hq-m1", "title": "Use v2", "metadata": {"from": "operator:ann"}}]).mail
    text = "\n".join(mail_lines(mail))
    assert "Mail (1 unread)" in text
    assert "- hq-m1 from operator:ann: Use v2" in text
    assert mail_lines([]) == []


def test_announced_mail_leaves_the_witness_with_its_nudge_at_gc() -> None:
    w = World()
    w.rig()
    w.add(message("hq-m1", "polecat:demo/ace"), message("hq-m2", "polecat:demo/ace"))
    w.add(
        NudgeQueued(
            nudge_id=mail_nudge_id("hq-m1"), rig="demo", polecat="ace", message="You have mail", expires_at=w.clock
        ),
        NudgeExpired(nudge_id=mail_nudge_id("hq-m1")),
    )
    w.add(GcSwept(cutoff=w.clock + timedelta(seconds=1), ttl_s=1.0))
    assert list(w.state.mail) == ["hq-m2"], "the one never announced stays owed"
