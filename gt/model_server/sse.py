"""Server-sent events as the model APIs send them. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def sse_record(data: Mapping[str, Any] | str, *, event: str | None = None) -> bytes:
    """One SSE record: an ``event:`` line when the API names its events, then the data on one line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {payload}\n\n".encode()


def chunks(text: str, size: int) -> list[str]:
    """``text`` in pieces of ``size`` characters (one empty piece for empty text): how a stream splits it."""
    return [text[start : start + size] for start in range(0, len(text), size)] or [""]
