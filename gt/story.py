"""A bead's story: its events and those of everything that worked on it (its molecule, hook lease, sessions,
merge requests, escalations), read from the log in order. ``gt bead history`` prints it; the dashboard shows it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from shared.bus import streams
from shared.bus.query import ask, ask_all
from shared.core import subjects
from shared.core.config import TownConfig
from shared.core.errors import EventDecodeError, QueryError, UnknownEventTypeError
from shared.model.events import REGISTRY, decode_envelope
from shared.model.queries import mayor, refinery, witness

if TYPE_CHECKING:
    from shared.bus.connection import Connection

QUERY_TIMEOUT_S = 3.0
"""How long a story waits for each service's part (a service that is down leaves its part out, said so)."""

_DECODE = msgspec.json.Decoder()


class Sequenced(Protocol):
    @property
    def seq(self) -> int: ...


S = TypeVar("S", bound=Sequenced)


class HistoryEntry(msgspec.Struct, kw_only=True):
    """One event of an aggregate, as ``gt bead history`` shows it."""

    seq: int
    ts: str
    type: str
    actor: str
    causation_id: str | None
    data: dict[str, Any]


async def history(nc: Connection, config: TownConfig, aggregate: str, aggregate_id: str) -> list[HistoryEntry]:
    """Every event of one aggregate, straight from the log, in order."""
    subject = subjects.event_subject(aggregate, aggregate_id)
    last = await streams.last_on_subject(nc, config.evt_stream, subject)
    if last is None:
        return []
    last_seq = last.seq
    entries: list[HistoryEntry] = []
    done = asyncio.Event()

    def on_message(seq: int, data: bytes) -> None:
        if seq > last_seq:
            return
        entries.append(history_entry(seq, data))
        if seq >= last_seq:
            done.set()

    async with streams.following(nc, config.evt_stream, subject, on_message), asyncio.timeout(60):
        await done.wait()
    return entries


def history_entry(seq: int, raw: bytes) -> HistoryEntry:
    try:
        env = decode_envelope(raw)
    except EventDecodeError:
        return HistoryEntry(seq=seq, ts="", type="?", actor="?", causation_id=None, data={"undecodable": _text(raw)})
    try:
        REGISTRY.decode_payload(env)
        data = _DECODE.decode(env.data)
    except (EventDecodeError, UnknownEventTypeError):
        data = {"undecodable": _text(bytes(env.data))}
    return HistoryEntry(
        seq=seq, ts=env.ts.isoformat(), type=env.type, actor=env.actor, causation_id=env.causation_id, data=data
    )


def _text(raw: bytes) -> str:
    return raw[:200].decode("utf-8", "replace")


async def _ids_for(nc: Connection, bead: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Subjects (aggregate, id) of the sessions, merge requests and escalations of the bead, and which
    services did not answer (their part is missing from the story)."""
    found: list[tuple[str, str]] = []
    missing: list[str] = []
    sessions, mrs, escalations = await asyncio.gather(
        ask(nc, witness.Sessions(bead=bead, all=True), timeout=QUERY_TIMEOUT_S),
        ask(nc, refinery.Mrs(), timeout=QUERY_TIMEOUT_S),
        ask_all(nc, mayor.Escalations(include_closed=True, limit=0), timeout=QUERY_TIMEOUT_S),  # read in pages
        return_exceptions=True,
    )
    for service, answer in (("witness", sessions), ("refinery", mrs), ("mayor", escalations)):
        if isinstance(answer, QueryError):
            missing.append(service)
        elif isinstance(answer, BaseException):
            raise answer
    if not isinstance(sessions, BaseException):
        found += [("session", s.id) for s in sessions]
    if not isinstance(mrs, BaseException):
        found += [("mr", m.id) for m in mrs if m.bead == bead]
    if not isinstance(escalations, BaseException):
        found += [("escalation", e["id"]) for e in escalations.items if e.get("bead") == bead]
    return found, missing


async def bead_story(nc: Connection, config: TownConfig, bead: str) -> tuple[list[HistoryEntry], list[str]]:
    """The bead's events and those of everything that worked on it, in log order; and the services that did
    not answer (so the story may lack their parts)."""
    others, missing = await _ids_for(nc, bead)
    aggregates = [("bead", bead), ("mol", bead), ("lease", f"hook-{bead}"), *others]
    groups = await asyncio.gather(*(history(nc, config, agg, agg_id) for agg, agg_id in aggregates))
    entries: list[HistoryEntry] = merge_by_seq(groups)
    return entries, missing


def merge_by_seq(groups: Iterable[Iterable[S]]) -> list[S]:
    """Entries of several subjects as one list in log order, each event once."""
    seen: dict[int, S] = {}
    for group in groups:
        for entry in group:
            seen.setdefault(entry.seq, entry)
    return [seen[s] for s in sorted(seen)]
