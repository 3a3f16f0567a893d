"""Event gates with a ``subject`` filter: find the newest event of the gate's type on matching subjects.

The deacon's fold keeps the newest sequence per event type, which answers an unfiltered gate; a filtered one
would need that per subject, for every subject, so it is answered from the stream instead: the messages on the
filter after the gate's cursor are read once (``next_by_subj``), and how far a gate has looked is remembered
in memory. That memory is a cache: after a restart the reading starts again at the cursor from the log.
"""

from __future__ import annotations

import msgspec
import structlog

from shared.bus import streams
from shared.bus.connection import Connection
from shared.core.errors import EventDecodeError
from shared.core.subjects import event_subject
from shared.model.events import decode_envelope

log = structlog.get_logger(__name__)

MAX_PER_PASS = 500
"""Messages read for one gate per reconcile; a long backlog is worked through over several passes."""


class _Progress(msgspec.Struct, kw_only=True):
    on: str
    subject: str
    scanned: int
    """Every message on the filter up to here has been looked at."""
    newest: int | None = None


class EventScanner:
    def __init__(self, nc: Connection, stream: str) -> None:
        self._nc = nc
        self._stream = stream
        self._progress: dict[str, _Progress] = {}

    def forget_except(self, names: set[str]) -> None:
        for name in set(self._progress) - names:
            del self._progress[name]

    async def newest_match(self, automation: str, on: str, subject: str, *, cursor: int, upto: int) -> int | None:
        """The sequence of the newest event of type ``on`` on a subject matching ``subject``, after ``cursor``
        and up to ``upto``; None when there is none (yet). The automation's own events never count.

        Raises:
            BusError, TimeoutError: the stream could not be read; the next pass tries again.
        """
        progress = self._progress.get(automation)
        if progress is None or (progress.on, progress.subject) != (on, subject):
            progress = self._progress[automation] = _Progress(on=on, subject=subject, scanned=cursor)
        own = event_subject("automation", automation)
        start = max(progress.scanned, cursor) + 1
        for _ in range(MAX_PER_PASS):
            if start > upto:
                break
            msg = await streams.next_on_subject(self._nc, self._stream, subject, start)
            if msg is None:
                progress.scanned = max(progress.scanned, upto)  # nothing on the filter from `start` on
                break
            seq = msg.seq
            if seq > upto:
                progress.scanned = max(progress.scanned, upto)
                break
            if msg.subject != own and _type_of(msg.data, seq) == on:
                progress.newest = seq
            progress.scanned = seq
            start = seq + 1
        newest = progress.newest
        return newest if newest is not None and newest > cursor else None


def _type_of(data: bytes, seq: int) -> str | None:
    try:
        return decode_envelope(data).type
    except EventDecodeError:
        log.warning("event_scan_undecodable", seq=seq)
        return None
