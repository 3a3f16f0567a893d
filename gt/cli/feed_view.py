"""``gt feed`` and ``gt bead history`` as text: filters, lines and timelines. Pure: entries in, text out.

An entry is one event of the log as the CLI reads it (``HistoryEntry``: seq, ts, type, actor, data).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from gt.cli.colour import PLAIN, Palette
from gt.narration import KIND_STYLES, bead_of, describe, excerpt
from shared.core.terminal import escape_line


class Entry(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def ts(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def actor(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True, slots=True)
class Since:
    """Where the feed starts: the whole log, a stream sequence, or a point in time."""

    everything: bool = False
    seq: int | None = None
    time: datetime | None = None


def parse_since(text: str, now: datetime) -> Since:
    """``all``; ``#123`` or ``seq:123`` (a stream sequence); ``90s``, ``10m``, ``2h``, ``1d`` (that long ago);
    or an ISO 8601 time with its zone. Raises ``ValueError`` naming what it accepts."""
    value = text.strip()
    if value in ("all", "0"):
        return Since(everything=True)
    for prefix in ("#", "seq:"):
        if value.startswith(prefix) and value[len(prefix) :].isdigit():
            return Since(seq=max(1, int(value[len(prefix) :])))
    match = _DURATION.match(value)
    if match:
        return Since(time=now - timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)]))
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"--since {text!r}: give `all`, a sequence (#123), a duration (90s, 10m, 2h, 1d) "
            "or an ISO 8601 time with its zone (2026-11-23T10:00:00+00:00)"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"--since {text!r}: an ISO time needs its zone (+00:00 or Z)")
    return Since(time=when)


@dataclass
class Filters:
    """What ``gt feed`` shows. Sessions and merge requests name their rig and bead only when they begin; the
    filter remembers them from what it has seen (and what the services told it) to match their later events."""

    rigs: set[str] = field(default_factory=set)
    beads: set[str] = field(default_factory=set)
    types: list[str] = field(default_factory=list)
    actors: set[str] = field(default_factory=set)
    known: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    """Session or merge request id -> (rig, bead)."""
    bead_rigs: dict[str, str] = field(default_factory=dict)
    """Bead id -> the rig it was last slung to (its sling, a session or a merge request said so): its steps and
    its close are that rig's events too."""

    def learn(self, entry: Entry) -> None:
        d = entry.data
        if entry.type == "session.requested":
            self.remember(str(d.get("session_id")), d.get("rig"), d.get("bead"))
        elif entry.type == "mr.submitted":
            self.remember(str(d.get("mr_id")), d.get("rig"), d.get("bead"))
        elif entry.type == "bead.slung" and isinstance(d.get("rig"), str) and isinstance(d.get("bead_id"), str):
            self.bead_rigs[d["bead_id"]] = d["rig"]

    def remember(self, key: str, rig: object, bead: object) -> None:
        """A session or merge request (``key``) of ``rig`` working ``bead``."""
        rig_name = rig if isinstance(rig, str) else None
        bead_id = bead if isinstance(bead, str) else None
        self.known[key] = (rig_name, bead_id)
        if rig_name and bead_id:
            self.bead_rigs[bead_id] = rig_name

    def _rig_and_bead(self, entry: Entry) -> tuple[str | None, str | None]:
        d = entry.data
        rig, bead = d.get("rig"), bead_of(entry.type, d)
        for key in ("session_id", "mr_id", "session"):
            if isinstance(d.get(key), str) and d[key] in self.known:
                known_rig, known_bead = self.known[d[key]]
                rig, bead = rig or known_rig, bead or known_bead
        if not isinstance(rig, str) and bead is not None and entry.type != "bead.created":
            rig = self.bead_rigs.get(bead)  # its steps and close; not its creation: it is a rig's once slung
        return (rig if isinstance(rig, str) else None), bead

    def matches(self, entry: Entry) -> bool:
        self.learn(entry)
        if self.types and not any(_type_matches(entry.type, t) for t in self.types):
            return False
        if self.actors and entry.actor not in self.actors:
            return False
        if self.rigs or self.beads:
            rig, bead = self._rig_and_bead(entry)
            if self.rigs and rig not in self.rigs:
                return False
            if self.beads and bead not in self.beads:
                return False
        return True


def _type_matches(event_type: str, wanted: str) -> bool:
    """``session.warranted`` exactly, or ``session`` / ``session.*`` for every session event."""
    prefix = wanted.removesuffix("*").removesuffix(".")
    return event_type == wanted or event_type.startswith(prefix + ".")


def _clock(ts: str) -> str:
    return escape_line(ts.replace("T", " ")[:19]) if ts else "-"


ACTOR_WIDTH = 12
"""The actor column's width at least; a longer actor (``polecat:<rig>/<name>``) widens it, never is cut."""


def actor_width(entries: Iterable[Entry], at_least: int = ACTOR_WIDTH) -> int:
    """The actor column's width for these entries: the longest actor's, at least ``at_least``."""
    return max([at_least, *(len(escape_line(e.actor)) for e in entries)])


def feed_line(entry: Entry, palette: Palette = PLAIN, width: int = ACTOR_WIDTH) -> str:
    """``2026-11-23 21:10:01  #123  witness   session s-1 started, pid 4242``; the actor in full, padded to
    ``width``. One line: the sentence and the actor have their control characters escaped (``describe``)."""
    sentence, kind = describe(entry.type, entry.data)
    seq = f"#{entry.seq}"
    return (
        f"{palette(_clock(entry.ts), 'dim')}  {palette(seq, 'dim')}{' ' * max(0, 8 - len(seq))}  "
        f"{escape_line(entry.actor):<{width}}  {palette(sentence, *KIND_STYLES[kind])}"
    )


def timeline(entries: Sequence[Entry], palette: Palette = PLAIN) -> str:
    """A bead's story, oldest first: when, who, what; a new day or a gap over a minute shows the full time. Under a
    warrant, the last lines its session's pane showed (why it died)."""
    if not entries:
        return "(no events)"
    lines = []
    previous: datetime | None = None
    width = actor_width(entries)
    for entry in entries:
        sentence, kind = describe(entry.type, entry.data)
        when = _parse(entry.ts)
        if previous is None or when is None or (when - previous).total_seconds() > 60 or when.date() != previous.date():
            stamp = _clock(entry.ts)
        else:
            stamp = f"{'':>11}{entry.ts[11:19]}"
        previous = when or previous
        actor = escape_line(entry.actor)
        lines.append(f"{palette(stamp, 'dim')}  {actor:<{width}}  {palette(sentence, *KIND_STYLES[kind])}")
        indent = " " * (len(stamp) + 2 + width + 2)
        lines.extend(f"{indent}{palette('| ' + line, 'dim')}" for line in excerpt(entry.type, entry.data))
    return "\n".join(lines)


def _parse(ts: str) -> datetime | None:
    try:
        return datetime.fromisoformat(ts)
    except ValueError:
        return None
