"""The mayor's answer to a query, decoded into its class (``shared.model.queries.mayor``), from the projection. Pure:
no I/O (``formulas`` and ``formula`` read files: the service answers those from its catalog)."""

from __future__ import annotations

from typing import Any

from services.mayor.queries import beads, mail, work
from services.mayor.queries.costs import costs_of
from services.mayor.queries.views import Sees, everything
from services.mayor.state import MayorState
from shared.core.errors import QueryError
from shared.model.queries import mayor
from shared.model.queries.base import Query


def answer(state: MayorState, query: Query[Any], *, sees: Sees = everything) -> Any:
    """Answer one query, leaving out what the asker may not ``sees``; raises ``QueryError`` for a bad query or
    something missing."""
    match query:
        case mayor.Get():
            return beads.get(state, query, sees)
        case mayor.Beads():
            return beads.beads(state, query, sees)
        case mayor.Ready():
            return beads.ready(state, query, sees)
        case mayor.Children():
            return beads.children(state, query, sees)
        case mayor.Deps():
            return beads.deps(state, query, sees)
        case mayor.Molecule():
            return work.molecule(state, query, sees)
        case mayor.Gates():
            return work.gates(state, query, sees)
        case mayor.Convoy():
            return work.convoy(state, query, sees)
        case mayor.Convoys():
            return work.convoys(state, query)
        case mayor.Inbox():
            return mail.inbox(state, query, sees)
        case mayor.Thread():
            return mail.thread(state, query, sees)
        case mayor.Escalations():
            return mail.escalations(state, query)
        case mayor.Costs():
            return costs_of(state, query.by)
    raise QueryError("unknown_query", f"the mayor answers no {query.NAME!r} from its projection")
