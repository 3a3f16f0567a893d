"""Durations as operators write them in TOML files (automations, formula gates): ``"90s"``, ``"10m"``, ``"1h30m"``."""

from __future__ import annotations

import re

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"1h30m"`` or a number of seconds; raises ValueError (TypeError
    for a value that is neither a number nor a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f'must be a duration like "30s", "10m", "2h" or a number of seconds, got {value!r}')
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f'{value!r} is not a duration: use e.g. "30s", "10m", "2h", "1d", "1h30m"')
    return sum(float(n) * _UNITS[u] for n, u in parts)


def duration_text(seconds: float) -> str:
    """``seconds`` as an operator would write it: ``1h30m``, ``10m``, ``45s``."""
    whole = round(seconds)
    if whole <= 0:
        return f"{seconds:g}s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            out.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(out)
