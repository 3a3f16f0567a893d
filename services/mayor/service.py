"""The mayor service: owns beads, molecules, convoys, mail and escalations; answers their queries."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import structlog

from services.mayor import decide as mayor_decide
from services.mayor import effects, plan, queries
from services.mayor.projection import new_projection
from services.mayor.state import MayorState
from shared.core.config import TownConfig
from shared.model.commands import BeadSling, Command
from shared.model.decision import Accepted, DecideContext
from shared.model.formulas.catalog import FormulaCatalog
from shared.model.queries import Query, mayor
from shared.service import Service, ServiceSettings

log = structlog.get_logger(__name__)
RIG_CATCH_UP_S = 5.0


class MayorService(Service[MayorState]):
    name: ClassVar[str] = "mayor"

    def __init__(
        self,
        config: TownConfig,
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(config, new_projection(), settings, clock=clock)
        self.formulas = FormulaCatalog(config.gt_home / "formulas", config.gt_home / "rigs")
        self._stale_after = timedelta(seconds=config.escalation_stale_after_s)

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return mayor_decide.decide(self.projection.state, cmd, ctx)

    async def prepare(self, cmd: Command) -> object:
        """A sling's formula, read from its files here (in a thread, off the event loop) so deciding does no I/O."""
        if not isinstance(cmd, BeadSling):
            return None
        if cmd.rig not in self.projection.state.rigs:
            await self._catch_up_for(cmd.rig)
        return await asyncio.to_thread(effects.sling_formula, self.formulas, cmd)

    async def _catch_up_for(self, rig: str) -> None:
        """The witness may have added the rig a moment ago: judge a sling to it on the log as it is now, not
        on a projection a few events behind (a miss here refuses the sling)."""
        try:
            await self.catch_up(timeout=RIG_CATCH_UP_S)
        except TimeoutError:
            log.warning("rig_catch_up_timed_out", rig=rig)

    async def reconcile(self) -> None:
        owed = plan.owed(self.projection.state, self.clock(), self._stale_after)
        if owed:
            await self.append_owed(owed)

    def query(self, query: Query[Any]) -> Any:
        return self._answer(query, queries.everything)

    def query_for_session(self, query: Query[Any], session: str) -> Any:
        return self._answer(query, queries.mail_visible_to(self.projection.state, session))

    def _answer(self, query: Query[Any], sees: queries.Sees) -> Any:
        match query:
            case mayor.Formulas():
                return effects.formula_list(self.formulas, query)  # the formula files: the catalog reads them
            case mayor.Formula():
                return effects.formula_view(self.formulas, query)
        return queries.answer(self.projection.state, query, sees=sees)

    def check_session_query(self, query: Query[Any], session: str) -> None:
        queries.check_session_query(self.projection.state, query, session)
