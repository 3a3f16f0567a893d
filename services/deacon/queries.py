"""Answers to ``gt.q.deacon.<what>`` read from the projection: services, leases, lease. Pure: a lease's newest
renewal (held in memory by the deacon's KV watch) comes in as a lookup. The automations' answers are in
``automations.queries``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.deacon.state import DeaconState, lease_view
from shared.errors import QueryError
from shared.lease_state import Renewal, last_renewed

ANSWERS = "services, leases, lease, automations, automation, status"


def answer(state: DeaconState, what: str, body: dict[str, Any], renewal_of: Callable[[str], Renewal | None]) -> Any:
    if what == "services":
        return [
            {
                "service": life.name,
                "status": life.status,
                "instance": life.instance,
                "since": life.since.isoformat(),
                "reason": life.reason,
            }
            for life in sorted(state.liveness.services.values(), key=lambda x: x.name)
        ]
    if what == "leases":
        held_only = bool(body.get("held", False))
        return [
            lease_view(lease)
            for lease in sorted(state.leases.leases.values(), key=lambda x: x.name)
            if not held_only or lease.status == "held"
        ]
    if what == "lease":
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise QueryError("invalid", "`name` is required")
        lease = state.leases.leases.get(name)
        if lease is None:
            raise QueryError("not_found", f"no lease {name!r}")
        return {**lease_view(lease), "last_renewed": last_renewed(lease, renewal_of(name)).isoformat()}
    raise QueryError("unknown_query", f"the deacon has no query {what!r}; it answers {ANSWERS}")
