"""A session's last words from its runtime's transcript, read when the witness cleans the ended session
(``shared.model.transcripts`` says what an entry is). Adapter: file I/O, call it in a thread.

The agent owns its runtime dir: only files really below it are read (``usage_files``), never through a link or
from a FIFO (``safe_files``), and only the file's end (``TRANSCRIPT_READ_BYTES``)."""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from services.witness.effects.usage_watch import usage_files
from shared.host import safe_files
from shared.model import transcripts
from shared.model.runtimes import Runtime

log = structlog.get_logger()


def last_entries(session_dir: Path, runtime: Runtime) -> str:
    """The newest transcript's last entries, one per line; "" when the runtime keeps none or none was written."""
    return transcripts.tail(newest_lines(session_dir, runtime), runtime.transcript_entries)


ANSWER_READ_BYTES = 16 * 1024 * 1024
"""The most of a transcript read from where a request was typed (``lines_since``): a turn may write far more than a
tail holds (its tools' output), never more than this is read."""


def newest(session_dir: Path, runtime: Runtime) -> Path | None:
    """The runtime's newest transcript (really below ``session_dir``), or None."""
    if not runtime.transcript_files:
        return None
    found = None
    for path in usage_files(session_dir, runtime.transcript_files):
        try:
            mtime = path.lstat().st_mtime
        except OSError:
            continue
        if found is None or mtime > found[0]:
            found = (mtime, path)
    return found[1] if found is not None else None


def size_of(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0


def lines_since(session_dir: Path, runtime: Runtime, name: str, offset: int) -> list[bytes]:
    """The whole lines of transcript ``name`` (relative to ``session_dir``) from ``offset`` (where it ended when a
    request was typed), at most ``ANSWER_READ_BYTES``; and of a newer transcript, if the runtime began one since,
    its end. Nothing when neither is there."""
    transcripts_now = usage_files(session_dir, runtime.transcript_files) if runtime.transcript_files else []
    out: list[bytes] = []
    named = session_dir / name
    if name and named in transcripts_now:
        try:
            with safe_files.open_regular(named) as file:
                file.seek(offset)
                out = file.read(ANSWER_READ_BYTES).splitlines()
        except OSError as exc:
            log.warning("transcript_unreadable", path=str(named), error=str(exc))
    latest = newest(session_dir, runtime)
    if latest is not None and latest != named:
        out += newest_lines(session_dir, runtime)
    return out


def newest_lines(session_dir: Path, runtime: Runtime) -> list[bytes]:
    """The whole lines of the newest transcript's end (``TRANSCRIPT_READ_BYTES``); none when the runtime keeps no
    transcript or none was written."""
    path = newest(session_dir, runtime)
    if path is None:
        return []
    try:
        with safe_files.open_regular(path) as file:
            size = os.fstat(file.fileno()).st_size
            start = max(0, size - transcripts.TRANSCRIPT_READ_BYTES)
            file.seek(start)
            data = file.read(transcripts.TRANSCRIPT_READ_BYTES)
    except OSError as exc:
        log.warning("transcript_unreadable", path=str(path), error=str(exc))
        return []
    lines = data.splitlines()
    return lines[1:] if start > 0 and lines else lines  # begun mid-line: its first is cut
