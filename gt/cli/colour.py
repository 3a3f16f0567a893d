"""ANSI colour for the CLI: on a terminal unless ``NO_COLOR`` is set, never when piped (``--color`` decides)."""

from __future__ import annotations

import os
import re
from typing import TextIO

_CODES = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
    "blue": "34",
    "magenta": "35",
    "cyan": "36",
}

COLOR_CHOICES = ("auto", "always", "never")

_CODE = "|".join(sorted({"0", *_CODES.values()}, key=len, reverse=True))
SEQUENCE = re.compile(f"(\x1b\\[(?:{_CODE})(?:;(?:{_CODE}))*m)")
"""The escape sequences a ``Palette`` writes (a colour set, and reset): the only ones a ``gt`` command prints
(``gt.cli.render.terminal_safe`` escapes every other)."""


def wanted(choice: str, out: TextIO, env: dict[str, str] | None = None) -> bool:
    """``auto``: a terminal, and no ``NO_COLOR`` in the environment (https://no-color.org)."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    environ = os.environ if env is None else env
    return out.isatty() and not environ.get("NO_COLOR")


class Palette:
    """Wraps text in a colour when enabled, returns it as it is otherwise (so plain output stays plain)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str, *styles: str) -> str:
        if not self.enabled or not styles or not text:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


PLAIN = Palette(False)

STATE_STYLES = {
    # services
    "healthy": ("green",),
    "catching up": ("yellow",),
    "paused": ("yellow",),
    "not answering": ("red", "bold"),
    # polecats
    "working": ("green",),
    "starting": ("cyan",),
    "finishing": ("blue",),
    "warranted": ("red",),
    # merge requests
    "queued": ("cyan",),
    "claimed": ("blue",),
    "merged": ("green",),
    "failed": ("red",),
    "blocked": ("yellow",),
    "conflicted": ("yellow",),
    "escalated": ("red", "bold"),
    "rejected": ("dim",),
    # escalations
    "critical": ("red", "bold"),
    "high": ("red",),
    "medium": ("yellow",),
    "low": ("dim",),
}


def styled(palette: Palette, state: str) -> str:
    return palette(state, *STATE_STYLES.get(state, ()))
