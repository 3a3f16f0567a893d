"""Hostile command bodies and subjects for every command type: built from a ``random.Random``, so hypothesis can
drive (and shrink) them in unit tests and a seeded generator can replay a bounded corpus against real services.

Besides ordinary wrong values, a body may carry what breaks decoders in less usual ways: invalid UTF-8 inside
a string or a key, nesting far past the recursion limit, numbers out of every range (``1e400``, ``10**400``,
5,000 digits), lone and reversed surrogate escapes, raw and escaped NUL, truncation and stray bytes.

A command's subject says who sent it (``shared/core/subjects.py``): besides the plain one, a polecat session's own
(``gt.cmd.<aggregate>.<verb>.<rig>.<polecat>.<session>``) and a service's (``...svc.<service>``), valid or forged:
another session's, a service nobody runs, too many or too few tokens, empty tokens, non-ASCII and very long
tokens."""

from __future__ import annotations

import json
import random

import msgspec

from shared.core.subjects import ServiceOrigin, SessionOrigin, service_command_subject, session_command_subject
from shared.model.commands import COMMANDS, Command

SUBJECTS = sorted(COMMANDS)
"""Every command type the registries in ``shared/model/commands`` know."""
UNKNOWN_SUBJECTS = ("gt.cmd.bead.explode", "gt.cmd.frobnicator.spin")
REASON_CODES = frozenset(
    {"malformed", "invalid", "unknown_command", "not_found", "backward_transition", "conflict", "too_large"}
)
"""What parsing alone may answer (``unauthorized`` and ``set_aside`` come later, from the intake)."""
SESSION = SessionOrigin("demo", "ace", "hq-fuzz-1")
"""The session the fuzzer sends as (none such runs: its commands are judged on what the log knows)."""
SERVICES = ("mayor", "witness", "witness-east", "refinery", "deacon")
LONG_TOKEN = "x" * 1_000
"""Long, yet well inside the server's 4 KiB control line (a longer subject ends the connection, not the service)."""

PLAUSIBLE: tuple[bytes, ...] = (
    b'"hq-abc12"',
    b'"gt-0"',
    b'"x"',
    b'"main"',
    b'"task"',
    b'"high"',
    b'"operator"',
    b"0",
    b"1",
    b"[]",
    b"{}",
    b'["hq-abc12"]',
    b'{"k": "v"}',
    b"true",
    b"null",
)
STRANGE: tuple[bytes, ...] = (
    b'"\xff\xfe"',  # invalid UTF-8 inside a string
    b'"ok\xc3("',  # a truncated two-byte sequence
    b'"\xed\xa0\x80"',  # a surrogate encoded as UTF-8 (invalid UTF-8)
    b'"\\ud800"',  # lone high surrogate escape
    b'"\\udc00"',  # lone low surrogate escape
    b'"\\udfff\\ud800"',  # reversed pair
    b'"a\\u0000b"',  # escaped NUL
    b'"a\x00b"',  # raw NUL
    b"1e400",
    b"-1e400",
    str(10**400).encode(),
    b"1" + b"0" * 5_000,
    b"-" + b"9" * 5_000,
    b"1.0e-400",
    b"NaN",
    b"Infinity",
    b"-0",
    b"18446744073709551616",
    b"-9223372036854775809",
)


def deep(depth: int, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def text(rng: random.Random) -> bytes:
    """A JSON string of random code points (surrogates included: ``json.dumps`` writes them as escapes)."""
    chars = "".join(
        chr(rng.choice((rng.randrange(0, 0x80), rng.randrange(0, 0x110000)))) for _ in range(rng.randrange(0, 12))
    )
    return json.dumps(chars).encode()


def value(rng: random.Random, depth: int = 0) -> bytes:
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(PLAUSIBLE)
    if roll < 0.55:
        return rng.choice(STRANGE)
    if roll < 0.7:
        return text(rng)
    if roll < 0.75:
        return deep(rng.choice((64, 1_000, 100_000)), rng)
    if roll < 0.8:
        return str(rng.randrange(-(2**70), 2**70)).encode()
    if depth >= 3:
        return rng.choice(PLAUSIBLE)
    if roll < 0.9:
        return b"[" + b",".join(value(rng, depth + 1) for _ in range(rng.randrange(0, 4))) + b"]"
    return obj(rng, [key(rng) for _ in range(rng.randrange(0, 4))], depth + 1)


def key(rng: random.Random) -> bytes:
    return rng.choice((text(rng), b'"\xff"', b'"\\ud800"', b'"a\\u0000"', b'"cmd_id"', b'"actor"'))


def obj(rng: random.Random, keys: list[bytes], depth: int = 0) -> bytes:
    return b"{" + b",".join(k + b":" + value(rng, depth) for k in keys) + b"}"


def field_keys(cls: type[Command]) -> list[bytes]:
    return [json.dumps(f.encode_name).encode() for f in msgspec.structs.fields(cls)]


def body_for(subject: str, rng: random.Random) -> bytes:
    """One hostile body for ``subject``: mostly an object over the command's own fields, some of them strange."""
    cls = COMMANDS.get(subject)
    roll = rng.random()
    if cls is not None and roll < 0.75:
        fields = field_keys(cls)
        keys = rng.sample(fields, rng.randrange(0, len(fields) + 1))
        if rng.random() < 0.2:
            keys.append(key(rng))
        body = obj(rng, keys)
    elif roll < 0.9:
        body = value(rng)
    else:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
    return mangle(body, rng) if rng.random() < 0.15 else body


def mangle(body: bytes, rng: random.Random) -> bytes:
    """Truncate it, or put a stray byte somewhere."""
    if not body:
        return b"\xff"
    at = rng.randrange(len(body))
    if rng.random() < 0.5:
        return body[:at]
    return body[:at] + bytes([rng.choice((0x00, 0x22, 0x5C, 0x80, 0xC0, 0xFF))]) + body[at:]


def subject_for(command: str, rng: random.Random) -> str:
    """A subject for ``command`` (``gt.cmd.<aggregate>.<verb>``): plain, a session's or a service's, valid or
    forged."""
    aggregate, verb = command.split(".")[2:4]
    forms = (
        lambda: command,
        lambda: session_command_subject(aggregate, verb, SESSION),
        lambda: session_command_subject(aggregate, verb, SessionOrigin("demo", "bob", "hq-other-2")),  # another's
        lambda: service_command_subject(aggregate, verb, ServiceOrigin(rng.choice(SERVICES))),
        lambda: service_command_subject(aggregate, verb, ServiceOrigin(rng.choice(("bob", "operator", "witness-")))),
        lambda: f"{command}.svc",  # too few
        lambda: f"{command}.demo.ace",  # too few
        lambda: f"{command}.demo.ace.hq-fuzz-1.extra",  # too many
        lambda: f"{command}.svc.refinery.extra",  # too many
        lambda: f"{command}.svc.refinery.x.y.z.w",
        lambda: f"{command}.démo.äce.hq-ß-1",  # non-ASCII
        lambda: f"{command}.svc.máyor",
        lambda: f"{command}.{LONG_TOKEN}.ace.hq-fuzz-1",
        lambda: f"{command}.svc.{LONG_TOKEN}",
        lambda: f"{command}.demo.{LONG_TOKEN}.{LONG_TOKEN}",
    )
    return rng.choice(forms)()


EMPTY_TOKEN_SUBJECTS = ("gt.cmd.mail.send..ace.hq-fuzz-1", "gt.cmd.mail.send.svc.", "gt.cmd.bead.close.demo..")
"""Subjects with empty tokens: the server may refuse to store them; any it stores is answered like the others."""
