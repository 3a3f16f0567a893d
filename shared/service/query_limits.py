"""Per-session limits on queries: a polecat session asks a service at most ``GT_RATE_AGENT_QUERIES`` queries a
second (bursts of ``GT_RATE_AGENT_QUERIES_BURST``). Pure: the caller passes ``now`` (seconds, monotonic).

A query costs the service its answer (a list, a digest of its whole state) and nothing bounds an agent's asking but
this: unlimited, one session's flood kept a service from answering anyone else for a minute. A query over the limit
is answered ``rate_limited`` (cheaply: nothing is decoded or read), up to as many refusals as queries again; past
those it is dropped unanswered (its asker times out), so a flood costs the service a counter per message. Services
and operators are not limited here (the town's own traffic, and its people: the command intake limits their
commands)."""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from shared.service.intake.rate_limit import Bucket, Limit, limit_from_env

QUERIES = Limit(rate=50, burst=500)
"""An agent's `gt` call asks a few queries, a long list one per page: far below this."""
MAX_SESSIONS = 10_000
"""Sessions' buckets kept before full (idle) ones are forgotten."""


class QueryVerdict(msgspec.Struct, frozen=True, kw_only=True):
    """``answer``: answer it. Else ``message`` is the refusal to answer with, or, ``drop``, nothing is answered."""

    answer: bool = True
    drop: bool = False
    message: str = ""


ANSWER = QueryVerdict()
DROP = QueryVerdict(answer=False, drop=True)


def load(env: Mapping[str, str] | None = None) -> Limit:
    """``GT_RATE_AGENT_QUERIES`` (0: no limit) and ``GT_RATE_AGENT_QUERIES_BURST``; ValueError names a setting whose
    value cannot be used."""
    return limit_from_env(os.environ if env is None else env, "GT_RATE_AGENT_QUERIES", QUERIES)


class _Session:
    __slots__ = ("dropped", "queries", "refusals")

    def __init__(self, limit: Limit, now: float) -> None:
        self.queries = Bucket(limit.burst, now)
        self.refusals = Bucket(limit.burst, now)
        self.dropped = 0


class QueryLimiter:
    def __init__(self, limit: Limit = QUERIES) -> None:
        self.limit = limit
        self._sessions: dict[str, _Session] = {}
        self.dropped = 0
        """Queries dropped unanswered, in total."""

    def check(self, session: str, now: float) -> QueryVerdict:
        """Charge ``session`` for one query at ``now`` and say what becomes of it."""
        limit = self.limit
        if limit.unlimited:
            return ANSWER
        found = self._sessions.get(session)
        if found is None:
            if len(self._sessions) >= MAX_SESSIONS:
                self._forget_idle(now)
            found = self._sessions[session] = _Session(limit, now)
        found.queries.refill(limit, now)
        wait = found.queries.wait_for(limit, 1)
        if wait <= 0:
            found.queries.tokens -= 1
            return ANSWER
        found.refusals.refill(limit, now)
        if found.refusals.tokens < 1:
            found.dropped += 1
            self.dropped += 1
            return DROP
        found.refusals.tokens -= 1
        message = (
            f"session {session} asks faster than a session may ({limit.rate:g} queries/s, bursts of "
            f"{limit.burst:g}; GT_RATE_AGENT_QUERIES*): not answered; ask again in {wait:.2f} s"
        )
        if found.dropped:
            message += f" ({found.dropped} more of its queries were dropped unanswered: it asked far over its limit)"
            found.dropped = 0
        return QueryVerdict(answer=False, message=message)

    def _forget_idle(self, now: float) -> None:
        """Forget sessions whose buckets have refilled: a fresh bucket is full, so nothing changes for them."""
        idle_s = self.limit.burst / self.limit.rate
        for session, found in list(self._sessions.items()):
            if not found.dropped and now - max(found.queries.at, found.refusals.at) >= idle_s:
                del self._sessions[session]
