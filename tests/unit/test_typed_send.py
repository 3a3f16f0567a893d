"""A typed command encodes to the body the services read (every field that holds its default left out, nothing
else), on the subject its type and its sender name; a typed query to the body and subject its service reads; the
CLI leaves an option not given out of the body (docs/architecture.md, "Sending a command and asking a query")."""

from __future__ import annotations

import typing
from typing import Any, ClassVar

import msgspec
import pytest

from gt.cli.common import given
from shared.bus.commands import encode, owner, subject_of
from shared.bus.query import reply_of
from shared.core import subjects
from shared.core.errors import QueryError
from shared.model.beads import HoldView
from shared.model.commands import (
    COMMANDS,
    BeadCreate,
    BeadSling,
    BeadUpdate,
    Command,
    Fence,
    GcSweep,
    MergeRequestDone,
    RigUpdate,
    StepDone,
)
from shared.model.queries import Digest, Query, ServiceStatus, Status, mayor, refinery, witness


def test_a_command_leaves_out_exactly_the_fields_that_hold_their_default() -> None:
    assert encode(BeadCreate(title="t")) == b'{"title":"t"}'
    # Values a field does not hold by default are sent, falsy or not: "" clears an assignee, 0 is a priority.
    cleared = msgspec.json.decode(encode(BeadUpdate(id="hq-1", assignee="", priority=0, labels=[])))
    assert cleared == {"id": "hq-1", "assignee": "", "priority": 0}
    assert msgspec.json.decode(encode(RigUpdate(name="demo", gate_env=[]))) == {"name": "demo", "gate_env": []}
    no = msgspec.json.decode(encode(RigUpdate(name="demo", gate_pristine=False)))
    assert no == {"name": "demo", "gate_pristine": False}, "`--gate-pristine no` is sent, not left out"
    assert msgspec.json.decode(encode(GcSweep(ttl_s=0.0))) == {"ttl_s": 0.0}
    fenced = StepDone(bead="hq-1", step="s", fence=Fence(lease="hook-hq-1", token=2), cmd_id="c-1", actor="a")
    assert msgspec.json.decode(encode(fenced)) == {
        "cmd_id": "c-1",
        "actor": "a",
        "fence": {"lease": "hook-hq-1", "token": 2},
        "bead": "hq-1",
        "step": "s",
    }


def sample(kind: Any) -> Any:
    """A value of ``kind`` that differs from any default."""
    if typing.get_origin(kind) in (typing.Union, type(int | None)):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    origin = typing.get_origin(kind)
    if origin is list:
        return ["a-1"]
    if origin is dict:
        return {"k": "v"}
    if kind is Fence:
        return Fence(lease="hook-x", token=3)
    return {str: "x-1", int: 7, float: 2.5, bool: True}[kind]


@pytest.mark.parametrize("cls", [COMMANDS[s] for s in sorted(COMMANDS)], ids=sorted(COMMANDS))
def test_every_command_reads_back_as_it_was_sent(cls: type[Command]) -> None:
    hints = typing.get_type_hints(cls)
    fields = msgspec.structs.fields(cls)
    required = {f.name: sample(hints[f.name]) for f in fields if f.required}
    everything = {f.name: sample(hints[f.name]) for f in fields}
    for values in (required, everything):
        cmd = cls(**values)
        assert msgspec.json.decode(encode(cmd), type=cls) == cmd
        assert set(msgspec.json.decode(encode(cmd))) == {k for k, v in values.items() if v is not None}


def test_the_subject_comes_from_the_type_and_the_sender() -> None:
    done = MergeRequestDone(bead="b", rig="r", branch="x", head="0", session="s")
    assert subject_of(done) == MergeRequestDone.SUBJECT == "gt.cmd.mr.done"
    assert subject_of(done, subjects.SessionOrigin("demo", "ace", "hq-1-1")) == "gt.cmd.mr.done.demo.ace.hq-1-1"
    assert subject_of(BeadSling(id="b", rig="r"), subjects.ServiceOrigin("witness-east")) == (
        "gt.cmd.bead.sling.svc.witness-east"
    )
    assert (owner(done), owner(BeadSling(id="b", rig="r")), owner(GcSweep())) == ("refinery", "mayor", "deacon")


def test_an_option_not_given_on_the_command_line_is_a_field_not_sent() -> None:
    # argparse gives None for an option left out, whatever the field's type.
    built = BeadCreate(title="t", type=None, priority=None, labels=None, metadata={}, prefix=None)  # type: ignore[arg-type]
    assert given(built) == BeadCreate(title="t")
    assert encode(given(built)) == b'{"title":"t"}'
    assert given(BeadUpdate(id="hq-1", assignee=None, parent="")).parent == "", "a value given stays"


def test_a_query_names_its_service_and_sends_its_fields() -> None:
    assert mayor.Get(id="hq-1").subject() == "gt.q.mayor.get"
    assert mayor.Get(id="hq-1", min_seq=7).body() == b'{"min_seq":7,"id":"hq-1"}'
    assert mayor.Beads(limit=0).body() == b'{"limit":0}', "0 is all: sent as given"
    assert witness.Sessions().body() == b"{}"
    assert (Status(service="deacon").subject(), Status(service="deacon").body()) == ("gt.q.deacon.status", b"{}")
    assert Digest(service="witness", min_seq=4).subject() == "gt.q.witness.digest"
    assert Digest(service="witness", min_seq=4).body() == b'{"min_seq":4}'


class Untyped(Query[Any], frozen=True, kw_only=True):
    """A query whose answer is read as it came (none of the services' is)."""

    SERVICE: ClassVar[str] = "mayor"
    NAME: ClassVar[str] = "untyped"


def test_an_answer_reads_into_the_querys_reply_type() -> None:
    where = {"worktree": "/w", "branch": "b", "tmux_name": "t", "attempt": 1, "requested_at": "2026-11-23T10:00:00Z"}
    sessions = [
        {"id": "s-1", "rig": "demo", "polecat": "ace", "bead": "hq-1", "status": "started", **where, "extra": 1}
    ]
    [read] = reply_of(witness.Sessions(), sessions)
    assert (read.id, read.bead, read.status) == ("s-1", "hq-1", "started")
    submitted = {"branch": "b", "target": "main", "head": "c0", "submitted_at": where["requested_at"]}
    mr = {"id": "mr-1", "rig": "demo", "bead": "hq-1", **submitted, "queued_at": where["requested_at"]}
    assert reply_of(refinery.Mrs(), [mr])[0].bead == "hq-1"
    assert reply_of(Status(service="mayor"), {"caught_up": True, "last_seq": 9}) == ServiceStatus(
        caught_up=True, last_seq=9
    )
    anything = {"anything": ["as", "it", "came"]}
    assert reply_of(Untyped(), anything) == anything, "an untyped answer stays as it came"
    got = {"id": "hq-1", "title": "t", "created_at": "2026-11-23T10:00:00Z", "updated_at": "2026-11-23T10:00:00Z"}
    bead = reply_of(mayor.Get(id="hq-1"), {**got, "hold": {"rig": "demo", "since": got["created_at"]}})
    assert (bead.id, bead.status, bead.created_at.year, bead.hold) == (
        "hq-1",
        "open",
        2026,
        HoldView(rig="demo", since=bead.created_at),
    )
    assert reply_of(mayor.Get(id="hq-1"), got).hold is msgspec.UNSET, "an unheld bead's answer has no hold"
    with pytest.raises(QueryError) as info:
        reply_of(witness.Sessions(), [{"id": 1}])
    assert info.value.code == "malformed"
