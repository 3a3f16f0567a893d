"""The mayor's pure logic over the in-memory log: decisions, the fold and reconcile, as the service runs them."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path

from services.mayor import effects, plan
from services.mayor.decide import decide
from services.mayor.projection import new_projection
from services.mayor.state import MayorState
from shared.model.commands import BeadSling, Command
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import RigAdded
from shared.model.formulas.catalog import FormulaCatalog
from tests.memory_log import MemoryTown

BUILTIN_FORMULAS = FormulaCatalog(Path("/nonexistent/formulas"), Path("/nonexistent/rigs"))
STALE_AFTER = timedelta(hours=4)
RIGS = ("demo", "web")
"""Rigs the witness added before the test (``rig.added`` in the log): slings to them are accepted."""


def add_rigs(town: MemoryTown[MayorState], *names: str) -> None:
    """Store ``rig.added`` for each of ``names`` as the witness would, and fold it."""
    rigs = [RigAdded(rig=name, repo=f"/repos/{name}.git", prefix=name[:16], agent_command="gt-agent") for name in names]
    town.log.record(rigs, ts=town.clock, actor="witness")
    town.log.replay(town.projection, after=town.projection.last_seq)


def mayor_town(
    formulas: FormulaCatalog = BUILTIN_FORMULAS, stale_after: timedelta = STALE_AFTER, rigs: tuple[str, ...] = RIGS
) -> MemoryTown[MayorState]:
    def decide_with_formulas(state: MayorState, cmd: Command, ctx: DecideContext) -> Accepted:
        # As the service's prepare(): the sling's formula is looked up before deciding.
        facts = effects.sling_formula(formulas, cmd) if isinstance(cmd, BeadSling) else None
        return decide(state, cmd, dataclasses.replace(ctx, facts=facts))

    def owed(state: MayorState, now: datetime) -> list[NewEvent]:
        return plan.owed(state, now, stale_after)

    town = MemoryTown(new_projection(), decide_with_formulas, reconcile=owed)
    add_rigs(town, *rigs)
    return town
