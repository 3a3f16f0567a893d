"""The mayor service: owns bead commands, answers bead queries from its projection."""

from __future__ import annotations

from typing import Any

from services.mayor import decide as mayor_decide
from services.mayor.projection import STATUS_RANK, MayorState, is_ready, new_projection
from shared.commands import Command
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.errors import QueryError
from shared.service import Service, ServiceSettings

DEFAULT_LIST_LIMIT = 1000


class MayorService(Service[MayorState]):
    name = "mayor"
    owns_commands = True
    catch_all_commands = True

    def __init__(self, config: TownConfig, settings: ServiceSettings | None = None) -> None:
        super().__init__(config, new_projection(), settings)

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return mayor_decide.decide(self.projection.state, cmd, ctx)

    def aggregate_key(self, cmd: Command) -> str | None:
        return mayor_decide.aggregate_key(cmd)

    def query(self, what: str, body: dict[str, Any]) -> Any:
        return answer_query(self.projection.state, what, body)


def _opt_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise QueryError("invalid", f"`{key}` must be a string")
    return value


def _limit(body: dict[str, Any]) -> int:
    limit = body.get("limit", DEFAULT_LIST_LIMIT)
    if not isinstance(limit, int) or limit < 0:
        raise QueryError("invalid", "`limit` must be a non-negative integer (0 = no limit)")
    return limit


def answer_query(state: MayorState, what: str, body: dict[str, Any]) -> Any:
    """Pure reads of the mayor's state (queries are answered from the projection, never from the log)."""
    if what == "get":
        bead_id = _opt_str(body, "id")
        if not bead_id:
            raise QueryError("invalid", "`id` is required")
        bead = state.beads.get(bead_id)
        if bead is None:
            raise QueryError("not_found", f"no bead {bead_id!r}")
        return mayor_decide.bead_view(bead)
    if what == "list":
        status = _opt_str(body, "status")
        if status is not None and status not in STATUS_RANK:
            raise QueryError("invalid", f"`status` must be one of {', '.join(STATUS_RANK)}")
        type_ = _opt_str(body, "type")
        label = _opt_str(body, "label")
        assignee = _opt_str(body, "assignee")
        parent = _opt_str(body, "parent")
        include_closed = bool(body.get("include_closed")) or status == "closed"
        limit = _limit(body)
        out = []
        for bead in state.beads.values():
            if bead.status == "closed" and not include_closed:
                continue
            if status is not None and bead.status != status:
                continue
            if type_ is not None and bead.type != type_:
                continue
            if label is not None and label not in bead.labels:
                continue
            if assignee is not None and bead.assignee != assignee:
                continue
            if parent is not None and bead.parent != parent:
                continue
            out.append(mayor_decide.bead_view(bead))
            if limit and len(out) >= limit:
                break
        return out
    if what == "ready":
        limit = _limit(body)
        out = []
        for bead in state.beads.values():
            if is_ready(state, bead):
                out.append(mayor_decide.bead_view(bead))
                if limit and len(out) >= limit:
                    break
        return out
    if what == "children":
        parent = _opt_str(body, "id")
        if not parent:
            raise QueryError("invalid", "`id` is required")
        include_closed = bool(body.get("include_closed"))
        beads = (state.beads[c] for c in state.children.get(parent, []) if c in state.beads)
        return [mayor_decide.bead_view(b) for b in beads if include_closed or b.status != "closed"]
    raise QueryError("unknown_query", f"the mayor has no query {what!r}; try get, list, ready, children, status")
