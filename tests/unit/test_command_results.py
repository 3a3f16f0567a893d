"""Typed command results: every command names its result type, and outcomes stored before the types existed (the
results were dicts) read into them and encode again to the same JSON."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.refinery.state import MergeRequest
from shared.bus.commands import Outcome, read_payload
from shared.model.commands import (
    COMMANDS,
    BeadCreate,
    BeadSling,
    Command,
    GcSweep,
    LeaseAcquire,
    MailRead,
    MailSend,
    MergeRequestSubmit,
    NudgeSend,
    RigUpdate,
    SessionRecoverHook,
    StepDone,
)
from shared.model.commands.base import result_type
from shared.model.events import CommandAccepted, CommandRejected
from shared.model.leases import Lease
from shared.model.results import UNSET, BeadResult, LeaseResult, MrResult, Result, SlingResult

# Outcomes as the services wrote them while results were dicts (the keys each decision put in, in its order).
OLD_OUTCOMES: list[tuple[type[Command[Any]], dict[str, Any]]] = [
    (BeadCreate, {"id": "hq-abc123", "status": "open", "changed": True}),
    (
        BeadSling,
        {
            "id": "hq-abc123",
            "status": "hooked",
            "changed": True,
            "rig": "demo",
            "convoy": None,
            "formula": "polecat-work",
            "ignored_blockers": ["hq-b1"],
            "parked": True,
        },
    ),
    (BeadSling, {"id": "hq-abc123", "status": "held", "changed": False, "rig": "demo", "waiting_for": ["hq-b1"]}),
    (
        StepDone,
        {"bead": "hq-a", "step": "s2", "status": "done", "changed": True, "done": 2, "total": 2, "complete": True},
    ),
    (
        MailSend,
        {
            "id": "hq-m1",
            "to": "rig:demo",
            "thread": "hq-m1",
            "changed": True,
            "ids": ["hq-m1", "hq-m2"],
            "recipients": ["polecat:demo/ace", "polecat:demo/cat"],
        },
    ),
    (MailRead, {"id": "hq-m1", "read": False, "changed": False, "left_unread_for": None}),
    (
        MergeRequestSubmit,
        {"id": "mr-1", "status": "queued", "changed": True, "bead": "hq-a", "rig": "demo", "head": "abc"},
    ),
    (
        LeaseAcquire,
        {
            "name": "l",
            "holder": "me",
            "token": 2,
            "ttl_s": 30.0,
            "status": "held",
            "acquired_at": "2026-01-01T00:00:00Z",
            "ended_at": None,
            "version": 7,
            "changed": False,
        },
    ),
    (
        RigUpdate,
        {
            "id": "demo",
            "rig": "demo",
            "status": "updated",
            "changed": True,
            "fields": ["gate_env", "stall_after_s"],
            "stall_after_s": 60.0,
            "gate_env": ["A"],
        },
    ),
    (
        NudgeSend,
        {
            "id": "nudge-1",
            "status": "queued",
            "changed": True,
            "rig": "demo",
            "polecat": "ace",
            "session": None,
            "expires_at": "2026-01-01T00:05:00+00:00",
            "live": False,
        },
    ),
    (SessionRecoverHook, {"id": "hq-a", "status": "not_stale", "changed": False, "why": "its session runs"}),
    (GcSweep, {"id": "gc", "cutoff": "2026-01-01T00:00:00+00:00", "ttl_s": 0.0, "changed": True}),
]


def payload(result: dict[str, Any]) -> bytes:
    return msgspec.json.encode({"command_id": "c-1", "command": "x", "result": result})


@pytest.mark.parametrize(("command", "result"), OLD_OUTCOMES)
def test_an_outcome_stored_as_a_dict_reads_into_its_type_and_encodes_the_same(
    command: type[Command[Any]], result: dict[str, Any]
) -> None:
    accepted = read_payload(command, CommandAccepted.TYPE, payload(result))
    assert isinstance(accepted, CommandAccepted)
    assert isinstance(accepted.result, result_type(command))
    again = msgspec.json.decode(msgspec.json.encode(accepted))
    assert again["result"] == result


def test_an_older_outcome_missing_keys_reads_with_their_defaults() -> None:
    accepted = read_payload(BeadCreate, CommandAccepted.TYPE, payload({"id": "hq-abc123"}))
    assert isinstance(accepted, CommandAccepted)
    assert accepted.result == BeadResult(id="hq-abc123")
    assert accepted.result.changed, "unknown: read as changed, as `gt` printed it"


def test_an_outcome_that_fits_no_result_type_is_read_as_its_json_not_raised() -> None:
    accepted = read_payload(BeadCreate, CommandAccepted.TYPE, payload({"id": 5}))
    assert isinstance(accepted, CommandAccepted)
    assert msgspec.to_builtins(accepted.result) == {"id": 5}


def test_a_rejection_reads_its_code_and_message() -> None:
    data = msgspec.json.encode({"command_id": "c-1", "command": "bead.sling", "code": "blocked", "message": "m"})
    rejected = read_payload(BeadSling, CommandRejected.TYPE, data)
    assert isinstance(rejected, CommandRejected)
    assert (rejected.code, rejected.message) == ("blocked", "m")


def test_every_command_names_a_result_type() -> None:
    for subject, command in COMMANDS.items():
        found = result_type(command)
        assert isinstance(found, type), subject
        assert issubclass(found, Result), subject


def test_a_sling_leaves_out_what_it_does_not_say() -> None:
    held = SlingResult(id="hq-a", status="held", changed=False, rig="demo", waiting_for=["hq-b"])
    assert msgspec.to_builtins(held) == {
        "id": "hq-a",
        "status": "held",
        "changed": False,
        "rig": "demo",
        "waiting_for": ["hq-b"],
    }
    assert held.parked is UNSET


@pytest.mark.parametrize(("record", "result"), [(MergeRequest, MrResult), (Lease, LeaseResult)])
def test_a_result_answering_a_whole_record_has_each_of_its_fields(record: type[Any], result: type[Any]) -> None:
    """Asked again unchanged, a merge request or a lease answers its whole record: a field the record gains and its
    result lacks would be dropped from the answer without a word."""
    missing = {f.name for f in msgspec.structs.fields(record)} - {f.name for f in msgspec.structs.fields(result)}
    assert not missing


def test_an_outcome_with_no_answer_prints_its_data_as_an_empty_object() -> None:
    """``gt ... --json`` prints the Outcome as it is; before an answer its ``data`` was ``{}``."""
    outcome: Outcome[BeadResult] = Outcome(command_id="c-1", stored_seq=3)
    printed = msgspec.json.decode(msgspec.json.encode(outcome))
    assert printed["data"] == {}
    assert outcome.accepted is None
    assert outcome.rejected is None
    with pytest.raises(LookupError):
        _ = outcome.result
