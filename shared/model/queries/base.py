"""The query base class, and the queries every service answers (``status``, ``digest``).

One class serves both ends: the client builds it and sends its fields as the body; the service's query server
decodes the body into the same class (``shared.model.queries.registry.decode``), which checks every field's type, so a
service answers a typed query with ``match``. Fields it does not know are ignored, as they always were: an asker of
another version may send one.
"""

from __future__ import annotations

import functools
import typing
from typing import Annotated, Any, ClassVar, Generic, TypeVar

import msgspec

from shared.core import subjects

R = TypeVar("R", covariant=True)
_ENCODER = msgspec.json.Encoder()


LATEST_SEQ = -1
"""A query's ``min_seq`` asking for everything stored when the service gets it: what a polecat session asks,
since its identity may not read the log's state (the service reads it, one request more on its side)."""

Required = Annotated[str, msgspec.Meta(min_length=1)]
"""A string field a query cannot do without: absent or empty, the query is ``invalid``."""
Limit = Annotated[int, msgspec.Meta(ge=0)]
"""How many items a list answers at most (0: all of them)."""
PageBytes = Annotated[int, msgspec.Meta(gt=0)]


class Query(msgspec.Struct, Generic[R], frozen=True, kw_only=True, omit_defaults=True):
    """A question to one service: ``gt.q.<SERVICE>.<NAME>``, its fields the body (those holding their default left
    out, as the service reads an absent field). ``R`` is what the answer's ``result`` is read into: a typed reply
    where callers read its fields, ``Any`` (the JSON as it came) where it is printed or handed to a view."""

    SERVICE: ClassVar[str] = ""
    NAME: ClassVar[str] = ""
    PAGED: ClassVar[bool] = False
    """A list answered a page at a time (``limit``, ``after``, ``page_bytes``: ``Page``)."""
    min_seq: Annotated[int, msgspec.Meta(ge=LATEST_SEQ)] | None = None
    """Answered only once the service has applied the log up to here (read-your-writes); None: at once;
    ``LATEST_SEQ``: up to the log's last sequence when the service gets the query."""

    def addressee(self) -> str:
        """The service that answers it."""
        return self.SERVICE

    def subject(self) -> str:
        return subjects.query_subject(self.addressee(), self.NAME)

    def body(self) -> bytes:
        return _ENCODER.encode(self)


DEFAULT_LIST_LIMIT = 1000
"""How many items a list query (one with ``limit`` and ``after``) answers when its ``limit`` is not given."""


PAGE_BYTES = "page_bytes"
"""The field of a list query (``PAGED``) that bounds a page's encoded items; the query server sets it to what one
reply carries (an asker's smaller value stands)."""


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """What a service's list query returns: ``items`` in the list's order, and ``next``, the cursor (the last item's
    id) to ask the following page with (the query's ``after``), None on the last page. The answer carries them as
    ``result`` and ``next``; the query server cuts a page that would not fit in one reply and sets ``next`` there
    (``shared.service.queries.fit_reply``)."""

    items: list[Any]
    next: str | None = None


@functools.cache
def reply_type(cls: type[Query[Any]]) -> Any:
    """``R`` of ``cls`` (``Query[R]``), what its answer is read into."""
    for klass in cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(base)
            # ``Query[R]``, or a service's base that passes ``R`` on to it (``MayorQuery[R]``).
            if isinstance(origin, type) and issubclass(origin, Query):
                (wanted,) = typing.get_args(base)
                if not isinstance(wanted, TypeVar):
                    return wanted
    return Any


class ServiceStatus(msgspec.Struct, kw_only=True):
    """What every service reports about itself (``Service.status``); a service's subclass adds counters of its own
    (``WitnessStatus``, ``RefineryStatus``, ``DeaconStatus``), which a ``Status`` answer leaves out (``ask_json``
    has them)."""

    service: str = ""
    identity: str = ""
    instance: str = ""
    role: str = ""
    """starting, standby, active or lost."""
    active_since: str | None = None
    active_holder: str | None = None
    connected: bool = False
    caught_up: bool = False
    last_seq: int = 0
    pending: int | None = None
    applied: int = 0
    skipped: int = 0
    fold_errors: int = 0
    reconcile_errors: int = 0
    reconciles: int = 0
    patrol_last_s: float = 0.0
    patrol_max_s: float = 0.0
    patrol_total_s: float = 0.0
    resyncs: int = 0
    gaps: int = 0
    commands_processed: int = 0
    commands_rejected: int = 0
    commands_dropped: int = 0
    queries_refused: int = 0
    snapshot_seq: int = 0
    uptime_s: float = 0.0


class Status(Query[ServiceStatus], frozen=True, kw_only=True):
    """How an instance of ``service`` is doing (answered at once, by a standby too)."""

    NAME: ClassVar[str] = "status"
    service: str
    """Whom to ask: a service's name (not sent: the subject names it)."""

    def addressee(self) -> str:
        return self.service

    def body(self) -> bytes:
        return b"{}"


class DigestReply(msgspec.Struct, kw_only=True):
    last_seq: int
    sha256: str
    """Of the service's serialized projection at ``last_seq``: equal to a fresh replay's up to there."""


class Digest(Query[DigestReply], frozen=True, kw_only=True):
    """A fingerprint of ``service``'s projection, for checks that the live one equals a replay of the log."""

    NAME: ClassVar[str] = "digest"
    service: str
    """Whom to ask (not sent: the subject names it)."""

    def addressee(self) -> str:
        return self.service

    def body(self) -> bytes:
        return _ENCODER.encode({} if self.min_seq is None else {"min_seq": self.min_seq})
