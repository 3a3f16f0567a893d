"""The audit archiver: every event of ``GT_EVT`` into rotating JSONL files (``gt-plugin-archiver``).

Run: ``python -m services.plugins.archiver --dir /srv/gt-archive``. The file format is in
``archive_format``; ``archive_files.read_archive`` reads an archive back, e.g. to rebuild a projection.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import structlog

from services.plugins.archive_files import ArchiveWriter
from shared.core.aio import pause
from shared.core.config import TownConfig
from shared.core.faults import crash_point
from shared.plugins.process import non_negative_int, plugin_parser, positive_float, run_plugin
from shared.plugins.sdk import Delivery, Plugin
from shared.plugins.settings import ALL_EVENTS, PluginSettings

log = structlog.get_logger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_AGE_S = 24 * 3600.0


class ArchiverOptions(msgspec.Struct, frozen=True, kw_only=True):
    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES
    """Start a new file before one would grow past this (0: no size limit)."""
    max_age_s: float = DEFAULT_MAX_AGE_S
    """Start a new file when an event is this much younger than the file's first (0: no age limit)."""
    fsync_interval_s: float = 1.0
    """Flush and fsync the current file this often (and always on rotation and shutdown)."""


class ArchiverPlugin(Plugin):
    """Writes each stored event, as stored, to the archive; its files are its position in the log."""

    def __init__(self, config: TownConfig, options: ArchiverOptions, *, name: str = "archiver") -> None:
        # The archive must hold every event in order: an event that keeps failing (a full disk) stops the
        # archiver instead of leaving a hole; restarted, it continues from its files.
        settings = PluginSettings(name=name, subjects=(ALL_EVENTS,), batch=256, max_attempts=8, on_exhausted="stop")
        super().__init__(config, settings)
        if options.fsync_interval_s <= 0:
            raise ValueError("fsync_interval_s must be above 0")
        self.options = options
        self.writer = ArchiveWriter(options.directory, max_bytes=options.max_bytes, max_age_s=options.max_age_s)
        self.archived = 0

    async def prepare(self) -> None:
        last = self.writer.open()
        log.info("archive_opened", directory=str(self.options.directory), last_seq=last, file=str(self.writer.path))

    async def resume_after(self) -> int:
        return self.writer.last_seq

    async def handle_message(self, delivery: Delivery) -> None:
        # The stored bytes as they are: an envelope this code cannot decode is archived all the same.
        if self.writer.append(delivery.seq, delivery.subject, delivery.data):
            self.archived += 1
            crash_point("archiver_line_written")

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self._sync_loop(), name="archive-sync")

    async def _sync_loop(self) -> None:
        while True:
            await pause(self.options.fsync_interval_s)
            await self.writer.sync_async()

    async def close(self) -> None:
        self.writer.close()
        log.info("archive_closed", last_seq=self.writer.last_seq, archived=self.archived)


def main(argv: Sequence[str] | None = None) -> int:
    parser = plugin_parser("archiver", "Archive every event of the town's log to rotating JSONL files.")
    parser.add_argument("--dir", type=Path, help="archive directory (env GT_ARCHIVE_DIR; default <GT_HOME>/archive)")
    parser.add_argument(
        "--max-bytes",
        type=non_negative_int,
        default=DEFAULT_MAX_BYTES,
        help="start a new file before one grows past this many bytes (0: no size limit)",
    )
    parser.add_argument(
        "--max-age",
        type=float,
        default=DEFAULT_MAX_AGE_S,
        help="start a new file when an event is this many seconds younger than the file's first (0: off)",
    )
    parser.add_argument("--fsync-interval", type=positive_float, default=1.0, help="seconds between fsyncs")
    parser.add_argument("--name", default="archiver", help="plugin name: its marks <name>.* (default archiver)")
    args = parser.parse_args(argv)

    def build(config: TownConfig) -> Plugin:
        directory = args.dir or Path(os.environ.get("GT_ARCHIVE_DIR") or config.gt_home / "archive")
        if args.max_age < 0:
            raise ValueError(f"--max-age must be 0 (off) or a number of seconds, got {args.max_age}")
        options = ArchiverOptions(
            directory=directory.expanduser(),
            max_bytes=args.max_bytes,
            max_age_s=args.max_age,
            fsync_interval_s=args.fsync_interval,
        )
        return ArchiverPlugin(config, options, name=args.name)

    return run_plugin(args.name, args, build)


if __name__ == "__main__":
    sys.exit(main())
