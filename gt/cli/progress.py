"""Progress bars for long CLI operations (replaying a large log, slinging a large convoy), on stderr.

Shown on a terminal only, redrawn in place at most every ``MIN_REDRAW_S``; ``GT_PROGRESS=always`` shows them
when piped too (one line per redraw), ``GT_PROGRESS=never`` hides them. Stdout stays the command's answer.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

MIN_REDRAW_S = 0.1
WIDTH = 30


def bar_line(label: str, done: int, total: int, width: int = WIDTH) -> str:
    """``replaying the log [##########....................] 1200/3600  33%``."""
    total = max(total, 0)
    done = min(max(done, 0), total) if total else done
    filled = round(width * done / total) if total else width
    percent = f"{100 * done // total:3d}%" if total else "100%"
    return f"{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {percent}"


def wanted(out: TextIO, env: dict[str, str] | None = None) -> bool:
    choice = (os.environ if env is None else env).get("GT_PROGRESS", "auto")
    if choice == "always":
        return True
    if choice == "never":
        return False
    return out.isatty()


class Progress:
    """``update`` as work is done, ``finish`` once at the end (draws the last state and ends the line)."""

    def __init__(self, label: str, total: int, out: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.out = out or sys.stderr
        self.enabled = wanted(self.out) if enabled is None else enabled
        self.inline = self.enabled and self.out.isatty()
        self.done = 0
        self._drawn_at = 0.0
        self._finished = False

    def update(self, done: int, total: int | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        now = time.monotonic()
        if now - self._drawn_at >= MIN_REDRAW_S:
            self._draw()
            self._drawn_at = now

    def advance(self, by: int = 1) -> None:
        self.update(self.done + by)

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._draw()
        if self.enabled and self.inline:
            self.out.write("\n")
            self.out.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        line = bar_line(self.label, self.done, self.total)
        self.out.write(f"\r\x1b[2K{line}" if self.inline else line + "\n")
        self.out.flush()
