"""The refinery service: the merge queue. Today it takes merge requests in and lists them; processing them
(rebase, gates, merge) comes with the refinery's own issue."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from services.refinery import decide as refinery_decide
from services.refinery.decide import mr_view
from services.refinery.projection import new_projection
from services.refinery.state import RefineryState
from shared.commands import Command
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.errors import QueryError
from shared.service import Service, ServiceSettings


class RefineryService(Service[RefineryState]):
    name: ClassVar[str] = "refinery"

    def __init__(
        self,
        config: TownConfig,
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(config, new_projection(), settings, clock=clock)

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return refinery_decide.decide(self.projection.state, cmd, ctx)

    def aggregate_key(self, cmd: Command) -> str | None:
        return refinery_decide.aggregate_key(cmd)

    def query(self, what: str, body: dict[str, Any]) -> Any:
        state = self.projection.state
        if what == "mrs":
            rig = body.get("rig")
            if rig is not None and not isinstance(rig, str):
                raise QueryError("invalid", "`rig` must be a string")
            found = [m for m in state.mrs.values() if rig is None or m.rig == rig]
            found.sort(key=lambda m: (m.priority, m.submitted_at))
            return [mr_view(m) for m in found]
        if what == "mr":
            mr_id = body.get("id")
            if not isinstance(mr_id, str) or not mr_id:
                raise QueryError("invalid", "`id` is required")
            mr = state.mrs.get(mr_id)
            if mr is None:
                raise QueryError("not_found", f"no merge request {mr_id!r}")
            return mr_view(mr)
        raise QueryError("unknown_query", f"the refinery has no query {what!r}; it answers mrs, mr, status, digest")
