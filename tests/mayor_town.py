"""The mayor's pure logic over the in-memory log: decisions, the fold and reconcile, as the service runs them."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

from services.mayor import reconcile
from services.mayor.decide import decide
from services.mayor.projection import new_projection
from services.mayor.state import MayorState
from shared.commands import Command
from shared.decision import Accepted, DecideContext, NewEvent
from shared.formulas.catalog import FormulaCatalog
from tests.memory_log import MemoryTown

BUILTIN_FORMULAS = FormulaCatalog(Path("/nonexistent/formulas"), Path("/nonexistent/rigs"))
STALE_AFTER = timedelta(hours=4)


def mayor_town(
    formulas: FormulaCatalog = BUILTIN_FORMULAS, stale_after: timedelta = STALE_AFTER
) -> MemoryTown[MayorState]:
    def decide_with_formulas(state: MayorState, cmd: Command, ctx: DecideContext) -> Accepted:
        return decide(state, cmd, ctx, formulas)

    def owed(state: MayorState, now: datetime) -> list[NewEvent]:
        return reconcile.owed(state, now, stale_after)

    return MemoryTown(new_projection(), decide_with_formulas, reconcile=owed)
