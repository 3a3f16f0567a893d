"""Polecat names: short, pronounceable, and derived from state (never stored on their own).

A rig's first polecats are ace, bob, cat, ...; past the list they are p26, p27, ... The witness takes the
first name no session holds (see ``plan._held_names``), so names are recycled once cleaned up.
"""

from __future__ import annotations

import re

POOL = (
    "ace", "bob", "cat", "dot", "eel", "fox", "gus", "hal", "ivy", "jet", "kit", "lux", "max",
    "nix", "oak", "pip", "rex", "sky", "tex", "uma", "val", "wes", "xan", "yak", "zed", "amy",
)  # fmt: skip


POOLED_NAME = re.compile(r"p[0-9]+")
"""The names past the pool's."""


def polecat_name(index: int) -> str:
    """The ``index``-th name of the pool (0-based)."""
    if index < 0:
        raise ValueError(f"polecat index must not be negative, got {index}")
    return POOL[index] if index < len(POOL) else f"p{index}"
