"""Answers to ``gt.q.deacon.<name>`` read from the projection, a query decoded into its class
(``shared.model.queries.deacon``): services, leases, lease. Pure: a lease's newest renewal (held in memory by the
deacon's KV watch) comes in as a lookup. The automations' answers are in ``automations.queries``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from services.deacon.state import DeaconState
from shared.core.errors import QueryError
from shared.model.leases import LeaseView, Renewal, last_renewed
from shared.model.queries import deacon
from shared.model.queries.base import Query


def answer(state: DeaconState, query: Query[Any], renewal_of: Callable[[str], Renewal | None]) -> Any:
    match query:
        case deacon.Services():
            return [
                deacon.ServiceLiveness(
                    service=life.name,
                    status=life.status,
                    instance=life.instance,
                    since=life.since.isoformat(),
                    reason=life.reason,
                )
                for life in sorted(state.liveness.services.values(), key=lambda x: x.name)
            ]
        case deacon.Leases(held=held_only):
            return [
                lease
                for lease in sorted(state.leases.leases.values(), key=lambda x: x.name)
                if not held_only or lease.status == "held"
            ]
        case deacon.Lease(name=name):
            lease = state.leases.leases.get(name)
            if lease is None:
                raise QueryError("not_found", f"no lease {name!r}")
            renewed = last_renewed(lease, renewal_of(name)).isoformat()
            return LeaseView(**msgspec.structs.asdict(lease), last_renewed=renewed)
    raise QueryError("unknown_query", f"the deacon answers no {query.NAME!r}")
