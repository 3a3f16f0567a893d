"""Archive files on disk: the writer (append, rotate, sync, recover after a crash) and the reader.

The files are the archiver's record of how far it got. A crash can leave the newest file with a torn last
line, or without lines the process had buffered and already acknowledged; on start the writer cuts the
torn line and reports the last sequence that is really there, and the archiver has its consumer deliver
from the next one. So the lines are exactly-once even though delivery is at-least-once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

import structlog

from services.plugins.archive_format import (
    ArchiveCorruptError,
    ArchivedEvent,
    ArchiveOrderError,
    decode_line,
    encode_line,
    event_time,
    file_name,
    first_seq_of,
    should_rotate,
)

log = structlog.get_logger(__name__)

WRITE_BUFFER_BYTES = 1024 * 1024


def archive_files(directory: Path) -> list[Path]:
    """The archive's files in log order (other files in the directory are ignored)."""
    found = []
    for path in directory.iterdir() if directory.is_dir() else ():
        first = first_seq_of(path.name)
        if first is not None and path.is_file():
            found.append((first, path))
    return [path for _, path in sorted(found)]


def read_archive(directory: Path) -> Iterator[ArchivedEvent]:
    """Every archived event, in log order, as (seq, subject, data): feed them to ``Projection.apply``.

    The newest file's last line is left out while it is incomplete (being written, or torn by a crash
    the archiver has not recovered from yet).

    Raises:
        ArchiveCorruptError: a complete line does not read, or a file's name and first line disagree.
        ArchiveOrderError: a sequence is missing or repeated.
    """
    files = archive_files(directory)
    expected: int | None = None
    for index, path in enumerate(files):
        newest = index == len(files) - 1
        with path.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                where = f"{path}:{number}"
                if not line.endswith(b"\n"):
                    if newest:
                        return
                    raise ArchiveCorruptError(where, "incomplete line in a file that is not the newest")
                event = decode_line(line, where)
                if number == 1 and event.seq != first_seq_of(path.name):
                    raise ArchiveCorruptError(where, f"first sequence {event.seq} differs from the file's name")
                if expected is not None and event.seq != expected:
                    raise ArchiveOrderError(where, expected, event.seq)
                expected = event.seq + 1
                yield event


class ArchiveWriter:
    """Appends events to the newest file of one directory; one writer per directory at a time."""

    def __init__(self, directory: Path, *, max_bytes: int, max_age_s: float) -> None:
        if max_bytes < 0 or max_age_s < 0:
            raise ValueError("max_bytes and max_age_s must be 0 (off) or more")
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.last_seq = 0
        """The last sequence in the files (written, maybe not yet synced)."""
        self.rotations = 0
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._size = 0
        self._first_ts: datetime | None = None
        self._dirty = False
        self._broken = False

    def open(self) -> int:
        """Recover the directory after whatever happened to the last writer; returns the last sequence."""
        self._close_quietly()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.last_seq, self.path, self._size, self._first_ts = 0, None, 0, None
        for path in reversed(archive_files(self.directory)):
            last, first_ts, size = _recover(path)
            if last is None:
                # Created by a rotation that crashed before its first line: it holds nothing.
                path.unlink()
                log.info("archive_empty_file_removed", file=str(path))
                continue
            self.last_seq, self.path, self._size, self._first_ts = last, path, size, first_ts
            self._file = path.open("ab", buffering=WRITE_BUFFER_BYTES)
            break
        self._broken = False
        return self.last_seq

    def append(self, seq: int, subject: str, data: bytes) -> bool:
        """Write the event stored at ``seq``; False when the archive holds it already.

        Raises:
            ArchiveOrderError: ``seq`` is not the next sequence (the archive would get a hole).
            OSError: the disk refused; the next call recovers the files first.
        """
        if self._broken:
            self.open()
        if seq <= self.last_seq:
            return False
        if self.last_seq and seq != self.last_seq + 1:
            raise ArchiveOrderError(str(self.path), self.last_seq + 1, seq)
        line = encode_line(seq, subject, data)
        ts = event_time(data)
        try:
            if self._file is None or should_rotate(
                file_bytes=self._size,
                line_bytes=len(line),
                first_ts=self._first_ts,
                ts=ts,
                max_bytes=self.max_bytes,
                max_age_s=self.max_age_s,
            ):
                self._start_file(seq)
            assert self._file is not None
            self._file.write(line)
        except OSError:
            self._broken = True  # a partial write may sit in the buffer or the file: recover before the next
            raise
        self._size += len(line)
        if self._first_ts is None:
            self._first_ts = ts
        self.last_seq = seq
        self._dirty = True
        return True

    def sync(self) -> None:
        """Flush and fsync the current file."""
        if self._file is not None and self._dirty:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._dirty = False

    async def sync_async(self) -> None:
        """``sync`` with the fsync in a thread, so the event loop keeps serving meanwhile."""
        if self._file is None or not self._dirty or self._broken:
            return
        self._file.flush()
        self._dirty = False
        fd = os.dup(self._file.fileno())  # stays valid if the file is rotated and closed meanwhile
        try:
            await asyncio.to_thread(os.fsync, fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._file is not None and not self._broken:
            self.sync()
        self._close_quietly()

    def _start_file(self, first_seq: int) -> None:
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None
            self.rotations += 1
        path = self.directory / file_name(first_seq)
        self._file = path.open("ab", buffering=WRITE_BUFFER_BYTES)
        _fsync_directory(self.directory)  # the new name survives a power loss
        log.info("archive_file_started", file=str(path), first_seq=first_seq, previous=str(self.path))
        self.path, self._size, self._first_ts = path, 0, None

    def _close_quietly(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def _recover(path: Path) -> tuple[int | None, datetime | None, int]:
    """(last sequence, first event time, size) of a file after cutting a torn last line off it."""
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut != len(data):
        os.truncate(path, cut)
        log.warning("archive_torn_line_cut", file=str(path), bytes=len(data) - cut)
        data = data[:cut]
    if not data:
        return None, None, 0
    lines = data.splitlines()
    last = decode_line(lines[-1], f"{path}:{len(lines)}")
    first_ts = None
    for number, line in enumerate(lines, 1):
        first_ts = event_time(decode_line(line, f"{path}:{number}").data)
        if first_ts is not None:
            break
    return last.seq, first_ts, len(data)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
