"""Token usage of agent sessions, read from the files their runtime writes it to and recorded as ``session.usage``
events.

For each session of a rig whose runtime writes its usage (``Runtime.usage_files``; Claude Code: its transcripts,
``<session dir>/home/.claude/projects/*/*.jsonl``), the witness reads what the files gained (the runtime's
``usage_reader``, ``shared.model.usage.Transcript`` for Claude Code; the offsets are a cache kept in memory) and, when
the totals differ from the last recorded ones, appends the session's running totals: at most every
``interval_s`` while the session runs, and once more, ``final``, after it ended and its agent's process is gone
(Claude Code writes its last message after ``gt done``). A restarted witness reads the files from the start,
reaches the same totals and records nothing new: the event holds totals, not a delta, so nothing counts twice.
Runtimes that write no usage (``gt-agent``, a command line) record nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Protocol

import structlog

from services.witness.state import Session, WitnessState, agent_of
from shared.host import processes, safe_files
from shared.model.decision import NewEvent
from shared.model.events.usage import SessionUsage
from shared.model.runtimes import Runtime, UsageReader, runtime_for

log = structlog.get_logger(__name__)

FINAL_AFTER_S = 60.0
"""An ended session whose agent process still runs this long after its end is read for the last time anyway."""


class Host(Protocol):
    @property
    def state(self) -> WitnessState: ...

    async def append_owed(self, owed: list[NewEvent], *, causation_id: str | None = None) -> int: ...


def usage_files(session_dir: Path, patterns: tuple[str, ...]) -> list[Path]:
    """The files a session's runtime writes its usage to (``patterns``: globs relative to its runtime dir), only
    those really below it (the agent owns the dir: a link in it may name any file)."""
    inside = session_dir.resolve()
    found = (path for pattern in patterns for path in session_dir.glob(pattern))
    return sorted(path for path in found if path.resolve().is_relative_to(inside))


USAGE_READ_CAP = 64 * 1024 * 1024
"""The most of a usage file read at once (the rest at the next read): a transcript a hostile agent points at
/dev/zero or grows without end never fills the witness's memory."""


def read_new(reader: UsageReader, session_dir: Path, patterns: tuple[str, ...]) -> None:
    """Feeds what the usage files gained since the last read. I/O: call it in a thread."""
    for path in usage_files(session_dir, patterns):
        key = str(path)
        offset = reader.offsets.get(key, 0)
        try:
            # The agent owns the file: never a link followed or a FIFO waited on, never more than a cap at once.
            with safe_files.open_regular(path) as file:
                file.seek(offset)
                data = file.read(USAGE_READ_CAP)
        except OSError:
            continue
        if data:
            reader.feed(key, data)


class UsageWatch:
    def __init__(
        self,
        host: Host,
        session_dir: Callable[[Session], Path],
        serves: Callable[[str], bool],
        *,
        interval_s: float,
        clock: Callable[[], datetime],
    ) -> None:
        self.host = host
        self.session_dir = session_dir
        self.serves = serves
        self.interval_s = interval_s
        self.clock = clock
        self.readers: dict[str, UsageReader] = {}
        self._read_at: dict[str, float] = {}

    def _patterns(self, session: Session) -> tuple[str, ...]:
        runtime = self._runtime(session)
        return runtime.usage_files if runtime is not None else ()

    def _watched(self, session: Session) -> bool:
        mark = self.host.state.usage.get(session.id)
        return (
            bool(self._patterns(session))
            and self.serves(session.rig)
            and session.status in ("started", "ended")
            and session.started_at is not None
            and not (mark is not None and mark.final)
        )

    def _agent_gone(self, session: Session) -> bool:
        if session.ended_at is not None and (self.clock() - session.ended_at).total_seconds() > FINAL_AFTER_S:
            return True
        if not session.pane_pid:
            return True
        ref = processes.ProcessRef(pid=session.pane_pid, started=session.pid_started or 0.0)
        return not processes.is_alive(ref)

    def _runtime(self, session: Session) -> Runtime | None:
        rig = self.host.state.rigs.get(session.rig)
        return runtime_for(agent_of(session, rig)) if rig is not None else None

    async def tick(self) -> int:
        """Records what is owed; returns how many events were stored."""
        stored = 0
        for session in list(self.host.state.sessions.values()):
            if not self._watched(session):
                self.readers.pop(session.id, None)
                continue
            ended = session.status == "ended"
            final = ended and await asyncio.to_thread(self._agent_gone, session)
            now = time.monotonic()
            if not final and now - self._read_at.get(session.id, float("-inf")) < self.interval_s:
                continue
            self._read_at[session.id] = now
            runtime = self._runtime(session)
            reader = self.readers.get(session.id) or (runtime.usage_reader() if runtime is not None else None)
            if runtime is None or reader is None:
                continue
            self.readers[session.id] = reader
            await asyncio.to_thread(read_new, reader, self.session_dir(session), runtime.usage_files)
            models = reader.snapshot()
            context = reader.context()
            tokens = context.tokens if context is not None else 0
            window = (context.window if context is not None else 0) or runtime.context_window
            mark = self.host.state.usage.get(session.id)
            if mark is not None and (mark.models, mark.context_tokens) == (models, tokens) and not final:
                continue
            if mark is None and not models and not final:
                continue
            event = SessionUsage(
                session_id=session.id,
                rig=session.rig,
                bead=session.bead,
                models=models,
                final=final,
                context_tokens=tokens,
                context_window=window,
            )
            stored += await self.host.append_owed([NewEvent(payload=event, expected_seq=mark.version if mark else 0)])
            if final:
                self.readers.pop(session.id, None)
                self._read_at.pop(session.id, None)
        return stored

    async def run(self, poll_s: float) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                # A transcript or an append that failed is read again next time: usage is never lost, only late.
                log.exception("usage_watch_failed")
            await asyncio.sleep(poll_s)
