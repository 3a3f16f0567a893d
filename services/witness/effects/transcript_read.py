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


def newest_lines(session_dir: Path, runtime: Runtime) -> list[bytes]:
    """The whole lines of the newest transcript's end (``TRANSCRIPT_READ_BYTES``); none when the runtime keeps no
    transcript or none was written."""
    if not runtime.transcript_files:
        return []
    newest = None
    for path in usage_files(session_dir, runtime.transcript_files):
        try:
            mtime = path.lstat().st_mtime
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, path)
    if newest is None:
        return []
    try:
        with safe_files.open_regular(newest[1]) as file:
            size = os.fstat(file.fileno()).st_size
            start = max(0, size - transcripts.TRANSCRIPT_READ_BYTES)
            file.seek(start)
            data = file.read(transcripts.TRANSCRIPT_READ_BYTES)
    except OSError as exc:
        log.warning("transcript_unreadable", path=str(newest[1]), error=str(exc))
        return []
    lines = data.splitlines()
    return lines[1:] if start > 0 and lines else lines  # begun mid-line: its first is cut
