"""What `gt` prints as a command's answer (issue 39): the id chosen by the sender and honoured by the mayor, one
line per message of a mail to a rig, when a rig's changed settings take effect, a header over every column."""

from __future__ import annotations

import itertools

import pytest

from gt.cli import render
from gt.cli.mail import sent_lines
from gt.cli.rigs import _update_line
from services.mayor.decide import beads as decide_beads
from services.mayor.decide import mail as decide_mail
from shared.core.errors import CommandError
from shared.model.beads import Bead
from shared.model.commands import BeadCreate, BeadUpdate, ConvoyCreate, EscalationRaise, MailSend
from shared.model.decision import DecideContext
from shared.model.events import BeadCreated
from shared.model.results import RigResult
from tests import records
from tests.unit.test_prime_mail_pure import STATE_EVENTS, T0, mayor_state, session

_drawn = itertools.count()


def ctx() -> DecideContext:
    return DecideContext(now=T0, command_id="c-1", actor="operator", new_id=lambda p: f"{p}-drawn{next(_drawn)}")


def test_a_bead_is_created_under_the_id_its_sender_chose_and_a_taken_one_is_refused() -> None:
    state = mayor_state(*STATE_EVENTS)
    accepted = decide_beads.create(state, BeadCreate(title="t", new_id="hq-abc123"), ctx())
    assert accepted.result.id == "hq-abc123"
    assert isinstance(accepted.events[0].payload, BeadCreated)
    assert accepted.events[0].payload.bead_id == "hq-abc123"
    taken = mayor_state(*STATE_EVENTS, BeadCreated(bead_id="hq-abc123", title="first"))
    with pytest.raises(CommandError) as info:
        decide_beads.create(taken, BeadCreate(title="t", new_id="hq-abc123"), ctx())
    assert info.value.code == "conflict"
    assert "hq-abc123 is taken" in info.value.message


@pytest.mark.parametrize(
    "cmd",
    [
        BeadCreate(title="t", new_id="de-abc123"),  # another prefix than the bead's
        BeadCreate(title="t", prefix="de", new_id="hq-abc123"),
        BeadCreate(title="t", new_id="hq-ABC123"),
        BeadCreate(title="t", new_id="hq-abc1234"),
        ConvoyCreate(title="t", new_id="hq-abc123"),
        EscalationRaise(severity="low", message="m", new_id="cv-abc123"),
        MailSend(to="mayor", body="b", new_id="esc-abc123"),
    ],
)
def test_a_chosen_id_of_another_shape_is_invalid(cmd: BeadCreate | ConvoyCreate | EscalationRaise | MailSend) -> None:
    with pytest.raises(CommandError) as info:
        cmd.validate()
    assert info.value.code == "invalid"
    assert "`new_id`" in info.value.message


def test_a_command_on_a_bead_queued_behind_its_creation_is_decided_after_it() -> None:
    assert BeadCreate(title="t", new_id="hq-abc123").ordering_key() == BeadUpdate(id="hq-abc123").ordering_key()
    assert BeadCreate(title="t").ordering_key() is None


def test_a_mail_to_a_rig_prints_one_line_per_message_each_with_its_id() -> None:
    """The trial: `gt mail send toolz` printed only `hq-4dugg6: sent to rig:toolz` for two messages."""
    state = mayor_state(*STATE_EVENTS, session("gt-c-1", "cat"))
    accepted = decide_mail.send(state, MailSend(to="demo", body="all hands", new_id="hq-abc123"), ctx())
    ids = [e.payload.aggregate_id() for e in accepted.events]
    assert len(ids) == 2
    assert ids[0] == "hq-abc123", "the sender's id is the first copy's"
    lines = sent_lines(accepted.result).splitlines()
    assert lines == [
        f"{ids[0]}: sent to polecat:demo/ace (thread hq-abc123, rig:demo)",
        f"{ids[1]}: sent to polecat:demo/cat (thread hq-abc123, rig:demo)",
    ]
    one = decide_mail.send(state, MailSend(to="mayor", body="hi", new_id="hq-def456"), ctx())
    assert sent_lines(one.result) == "hq-def456: sent to mayor (thread hq-def456)"


def test_a_rig_update_says_running_sessions_take_a_new_stall_limit() -> None:
    """The trial: `gt rig update mi --stall-after 60` said running sessions keep theirs; they take the new one."""
    line = _update_line(RigResult(id="mi", rig="mi", fields=["stall_after_s"], stall_after_s=60.0, changed=True))
    assert (
        line
        == "rig mi updated: stall_after_s=60 (stall_after_s from the witness's next patrol, running sessions included)"
    )
    assert "keep" not in line
    both = _update_line(
        RigResult(id="mi", rig="mi", fields=["agent_command", "test_command"], agent_command="a", test_command="t")
    )
    assert "agent_command in new sessions (running ones keep what they started with)" in both
    assert "test_command at the refinery's next merge" in both


def test_a_rig_update_of_gate_pristine_takes_effect_at_the_next_merge() -> None:
    line = _update_line(RigResult(id="mi", rig="mi", fields=["gate_pristine"], gate_pristine=False, changed=True))
    assert line == "rig mi updated: gate_pristine=False (gate_pristine at the refinery's next merge)"


def test_every_column_of_the_inbox_and_the_convoy_list_has_a_header() -> None:
    inbox = render.message_table(
        [Bead(id="hq-1", metadata={"from": "operator"}, created_at=T0, updated_at=T0, title="hello")]
    )
    header, row = inbox.splitlines()
    assert header.split() == ["ID", "STATE", "FROM", "SENT", "SUBJECT"]
    assert row.split()[:2] == ["hq-1", "new"]
    convoys = render.convoy_table([records.convoy(id="cv-1", total=1, title="t")])
    header, row = convoys.splitlines()
    assert header.split() == ["ID", "STATUS", "CLOSES", "PROGRESS", "TITLE"]
    assert row.split()[2] == "auto"
