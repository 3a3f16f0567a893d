"""Counting a conversation's turns, and the ids the server gives its answers and tool calls. Pure.

Which turn answers a request is derived from the request itself (the assistant turns its conversation already
holds), never from a counter of requests: a retried request (after a 429, a dropped connection) is answered with
the same turn again, and two requests of the same conversation can never skip a turn."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

TURNS_MARKER = "[model-turns:"
"""A marker in a compaction summary (``[model-turns:<n>]``): the conversation it replaces held ``n`` turns."""


def turns_before(text: str) -> int | None:
    """The turns a compaction summary in ``text`` replaced, or None when it holds none."""
    start = text.rfind(TURNS_MARKER)
    if start < 0:
        return None
    end = text.find("]", start)
    digits = text[start + len(TURNS_MARKER) : end] if end > start else ""
    return int(digits) if digits.isdigit() else None


def count_turns(entries: Iterable[tuple[bool, str]]) -> int:
    """The assistant turns of a conversation given as (is an answer, text of a user entry) in order: consecutive
    answer entries (a message and its tool calls, sent as items of their own) are one turn; a user entry holding a
    compaction summary sets the count to the turns it replaced."""
    turns = 0
    answering = False
    for is_answer, text in entries:
        if is_answer:
            if not answering:
                turns += 1
            answering = True
            continue
        answering = False
        summarised = turns_before(text)
        if summarised is not None:
            turns = summarised
    return turns


def digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def call_id(prefix: str, script: str, turn: int, position: int) -> str:
    """A deterministic id for a turn's tool call, in the dialect's shape (``toolu_01`` and 22 characters for
    Anthropic's)."""
    return f"{prefix}{digest(script, turn, position)[:22]}"
