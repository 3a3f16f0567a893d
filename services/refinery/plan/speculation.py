"""Which prefixes of a stack to gate next: speculation with ``width`` gates at once, bisection with one. Pure.

A stack of ``n`` merge requests has ``n`` prefixes (1..n). What is known: the longest prefix known green (``lo``,
0 for none: the target's tip is green) and the shortest known red (``hi``, None while none is). Nothing red yet:
the ``width`` prefixes cutting (lo, n] into ``width`` equal parts, ``n`` among them (all green: the whole stack
lands). A red one: the culprit is in (lo, hi], and the prefixes cutting that interval into ``width + 1`` parts
are gated next (with a width of one: the middle, bisection), until ``hi`` is next to ``lo``. With a width of at
least ``n``, every prefix is gated at once, and one round decides.
"""

from __future__ import annotations

import math


def next_prefixes(lo: int, hi: int | None, n: int, width: int) -> list[int]:
    """The prefix lengths to gate next, ascending; empty when ``hi`` is next to ``lo`` or all is green."""
    width = max(1, width)
    if hi is None:
        span = n - lo
        return sorted({lo + math.ceil(k * span / width) for k in range(1, width + 1)}) if span > 0 else []
    span = hi - lo
    return sorted({lo + (k * span) // (width + 1) for k in range(1, width + 1)} - {lo, hi})


def narrowed(lo: int, hi: int | None, gated: list[int], first_red: int | None) -> tuple[int, int | None]:
    """(lo, hi) once ``gated`` (ascending) were gated and ``first_red`` is the index in it of the first that
    failed (None: all passed): the prefixes before a red one passed."""
    if first_red is None:
        return gated[-1], hi
    return (gated[first_red - 1] if first_red > 0 else lo), gated[first_red]
