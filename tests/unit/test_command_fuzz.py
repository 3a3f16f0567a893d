"""The command fuzzer on the decoding and validation path (pure, no server): for every command type and for
subjects nobody owns, no body makes reading a command raise; each is a typed command or a rejection with a
reason code and a message, and its id, actor and correlation can always be peeked (or are absent). On any
subject (a session's, a service's, forged ones), telling who sent a command never raises either."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.errors import CommandError
from shared.model.commands import COMMANDS, Command, peek_body_fields, read_command
from shared.service.intake import Delivery
from tests.command_fuzz import (
    EMPTY_TOKEN_SUBJECTS,
    REASON_CODES,
    STRANGE,
    SUBJECTS,
    UNKNOWN_SUBJECTS,
    body_for,
    deep,
    field_keys,
    subject_for,
)

EXAMPLES_PER_SUBJECT = 60
"""Bounded so that the whole run (every command type) stays within a few seconds."""


def check_read(subject: str, body: bytes) -> Command | CommandError:
    peeked = peek_body_fields(body)
    assert len(peeked) == 3
    assert all(p is None or isinstance(p, str) for p in peeked)
    out = read_command(subject, body)
    if isinstance(out, CommandError):
        assert out.code in REASON_CODES, out
        assert out.message.strip()
        return out
    assert isinstance(out, Command)
    key = out.ordering_key()
    assert key is None or isinstance(key, str)
    return out


@pytest.mark.parametrize("subject", [*SUBJECTS, *UNKNOWN_SUBJECTS])
@settings(
    max_examples=EXAMPLES_PER_SUBJECT,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rng=st.randoms(use_true_random=False))
def test_no_body_makes_reading_a_command_raise(subject: str, rng: random.Random) -> None:
    check_read(subject, body_for(subject, rng))


@pytest.mark.parametrize("subject", SUBJECTS)
@pytest.mark.parametrize("strange", STRANGE)
def test_each_strange_value_in_each_field_is_answered(subject: str, strange: bytes) -> None:
    """Every strange value in every field of every command type, and as the whole body."""
    check_read(subject, strange)
    for key in field_keys(COMMANDS[subject]):
        check_read(subject, b"{" + key + b":" + strange + b"}")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"title": "\xff\xfe"}', "not valid UTF-8"),
        (b'{"\xff": 1}', "not valid UTF-8"),
        (deep(100_000, random.Random(0)), "nested too deeply"),
        (b'{"title": "x", "labels": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"title": "x", "priority": 1e400}', "out of range"),
        (b'{"title": "x", "priority": 1' + b"0" * 5_000 + b"}", "out of range"),
        (b'{"title": "\\ud800"}', "not valid JSON"),
        (b'{"title": "a\x00b"}', "not valid JSON"),
    ],
)
def test_undecodable_bodies_are_malformed_with_a_reason(body: bytes, says: str) -> None:
    out = read_command("gt.cmd.bead.create", body)
    assert isinstance(out, CommandError)
    assert out.code == "malformed"
    assert says in out.message
    assert peek_body_fields(body) == (None, None, None)


def check_delivery(subject: str, body: bytes, origin_from: int) -> None:
    delivery = Delivery(
        subject=subject, body=body, headers=None, stream_seq=5, delivered=1, max_bytes=1 << 20, origin_from=origin_from
    )
    assert delivery.actor.strip(), delivery.actor
    assert delivery.actor_class in ("agent", "service", "operator")
    if delivery.refusal is not None:
        assert delivery.refusal.code == "unauthorized", delivery.refusal
        assert delivery.refusal.message.strip()
    assert delivery.name == delivery.command_subject.removeprefix("gt.cmd.")
    check_read(delivery.command_subject, body)


@pytest.mark.parametrize("command", [*SUBJECTS, *UNKNOWN_SUBJECTS])
@settings(
    max_examples=EXAMPLES_PER_SUBJECT // 2,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(rng=st.randoms(use_true_random=False), origin_from=st.sampled_from((0, 1, 10)))
def test_no_subject_makes_telling_the_sender_raise(command: str, rng: random.Random, origin_from: int) -> None:
    check_delivery(subject_for(command, rng), body_for(command, rng), origin_from)


@pytest.mark.parametrize("subject", EMPTY_TOKEN_SUBJECTS)
def test_a_subject_with_empty_tokens_is_nobodys_command(subject: str) -> None:
    check_delivery(subject, b'{"actor": "mayor"}', 1)
    assert isinstance(read_command(subject, b"{}"), CommandError)
