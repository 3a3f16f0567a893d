"""The audit archive's file format. Pure: bytes in, bytes out, no I/O.

An archive is a directory of ``events-<first seq>.jsonl`` files (the sequence zero-padded to 12 digits, so
names sort in log order). Each line is one stored event::

    {"seq": 41, "subject": "gt.evt.bead.hq-1a2b3c", "envelope": {...the stored JSON, byte for byte...}}

Bytes that are not one line of JSON (a foreign writer's) are kept as ``"raw": "<base64>"`` instead of
``envelope``, so nothing stored is lost and every line stays valid JSON.
"""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec

from shared.core.errors import GastownError

FILE_PREFIX = "events-"
FILE_SUFFIX = ".jsonl"
SEQ_DIGITS = 12
_FILE_RE = re.compile(r"^events-(\d{1,20})\.jsonl$")


class ArchivedEvent(NamedTuple):
    """One line read back: what a projection's ``apply(seq, subject, data)`` takes."""

    seq: int
    subject: str
    data: bytes


class ArchiveCorruptError(GastownError):
    """A line that is complete (ends in a newline) and still does not read: the file was damaged."""

    def __init__(self, where: str, detail: str) -> None:
        self.where = where
        super().__init__(f"archive line {where} is damaged: {detail}")


class ArchiveOrderError(GastownError):
    """The lines do not follow the log one by one (a missing or repeated sequence)."""

    def __init__(self, where: str, expected: int, got: int) -> None:
        self.where = where
        self.expected = expected
        self.got = got
        kind = "missing" if got > expected else "repeated or out of order"
        super().__init__(f"archive line {where} has sequence {got}, expected {expected} ({kind})")


class _Line(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    subject: str
    envelope: msgspec.Raw = msgspec.Raw()
    """Empty when absent (msgspec cannot put Raw in a union with None)."""
    raw: str | None = None


class _Stamp(msgspec.Struct, frozen=True):
    ts: datetime


_LINE = msgspec.json.Decoder(_Line)
_STAMP = msgspec.json.Decoder(_Stamp)
_ANY = msgspec.json.Decoder()
_JSON = msgspec.json.Encoder()


def file_name(first_seq: int) -> str:
    return f"{FILE_PREFIX}{first_seq:0{SEQ_DIGITS}d}{FILE_SUFFIX}"


def first_seq_of(name: str) -> int | None:
    """The first sequence a file's name announces, or None when it is not an archive file."""
    match = _FILE_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def is_one_json_line(data: bytes) -> bool:
    """True when ``data`` is valid JSON without line breaks, i.e. can be embedded in a line as it is."""
    if b"\n" in data or b"\r" in data:
        return False
    try:
        _ANY.decode(data)
    except msgspec.DecodeError:
        return False
    return True


def encode_line(seq: int, subject: str, data: bytes) -> bytes:
    """One archive line (with its newline) for the event stored at ``seq``."""
    head = b'{"seq":%d,"subject":%s,' % (seq, _JSON.encode(subject))
    if is_one_json_line(data):
        return head + b'"envelope":' + data + b"}\n"
    return head + b'"raw":' + _JSON.encode(base64.b64encode(data).decode("ascii")) + b"}\n"


def decode_line(line: bytes, where: str = "?") -> ArchivedEvent:
    """The event of one line (without or with its newline); the envelope's bytes exactly as stored.

    Raises:
        ArchiveCorruptError: the line is not an archive line.
    """
    try:
        parsed = _LINE.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ArchiveCorruptError(where, str(exc)) from exc
    if len(parsed.envelope):
        return ArchivedEvent(parsed.seq, parsed.subject, bytes(parsed.envelope))
    if parsed.raw is not None:
        try:
            return ArchivedEvent(parsed.seq, parsed.subject, base64.b64decode(parsed.raw, validate=True))
        except ValueError as exc:
            raise ArchiveCorruptError(where, f"raw is not base64: {exc}") from exc
    raise ArchiveCorruptError(where, "neither envelope nor raw")


def event_time(data: bytes) -> datetime | None:
    """The envelope's ``ts``, or None when the bytes carry none (age rotation then ignores the event)."""
    try:
        ts = _STAMP.decode(data).ts
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    # A foreign writer's timestamp without a zone is read as UTC, so it compares with ours.
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def should_rotate(
    *,
    file_bytes: int,
    line_bytes: int,
    first_ts: datetime | None,
    ts: datetime | None,
    max_bytes: int,
    max_age_s: float,
) -> bool:
    """Start a new file before writing this line? Never for an empty file (a line larger than
    ``max_bytes`` gets a file of its own). Age is event time: a file spans at most ``max_age_s`` of its
    events' timestamps, so the same log always gives the same files, whenever and however often the
    archiver ran."""
    if file_bytes == 0:
        return False
    if max_bytes > 0 and file_bytes + line_bytes > max_bytes:
        return True
    if max_age_s <= 0 or first_ts is None or ts is None:
        return False
    return (ts - first_ts).total_seconds() >= max_age_s
