"""Fold helpers every projection's handlers use: look an aggregate up and move its version (``touch``), or move
it to another status too (``advance``). No I/O; they mutate the record they are given."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol, TypeVar


class Versioned(Protocol):
    version: int
    """Stream sequence of the aggregate's last event: the expected sequence of its next one."""


V = TypeVar("V", bound=Versioned)


def touch(items: Mapping[str, V], key: str, seq: int) -> V | None:
    """The aggregate ``key`` of ``items``, its version moved to ``seq``, the sequence of the event on its subject
    being folded; None when the projection does not know it (the event changes nothing then)."""
    item = items.get(key)
    if item is not None:
        item.version = seq
    return item


class HasStatus(Versioned, Protocol):
    status: Any
    """A status vocabulary's ``Literal`` (``shared.model.events``): each aggregate has its own."""


H = TypeVar("H", bound=HasStatus)


def advance(items: Mapping[str, H], key: str, seq: int, to: str, *, only_from: Collection[str] = ()) -> H | None:
    """``touch`` the aggregate ``key``, then move it to status ``to`` if it may: from one of ``only_from``, or
    (``only_from`` empty) from any status but ``to``. The aggregate when it moved (the handler sets what else the
    event records on it); None when it did not move or is not known."""
    item = touch(items, key, seq)
    if item is None or item.status == to or (only_from and item.status not in only_from):
        return None
    item.status = to
    return item
