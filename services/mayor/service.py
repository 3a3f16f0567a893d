"""The mayor service: owns beads, molecules, convoys, mail and escalations; answers their queries."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import msgspec
import structlog

from services.mayor import decide as mayor_decide
from services.mayor import plan, queries
from services.mayor.projection import new_projection
from services.mayor.state import MayorState
from shared.commands import BeadSling, Command
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.errors import QueryError
from shared.formulas import FormulaError, cook
from shared.formulas.catalog import FormulaCatalog
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
        return mayor_decide.decide(self.projection.state, cmd, ctx, self.formulas)

    def aggregate_key(self, cmd: Command) -> str | None:
        return mayor_decide.aggregate_key(cmd)

    async def prepare(self, cmd: Command) -> object:
        if isinstance(cmd, BeadSling) and cmd.rig not in self.projection.state.rigs:
            await self._catch_up_for(cmd.rig)
        return None

    async def _catch_up_for(self, rig: str) -> None:
        """The witness may have added the rig a moment ago: judge a sling to it on the log as it is now, not
        on a projection a few events behind (a miss here refuses the sling)."""
        if self.nc is None or self.reader is None:
            return
        try:
            info = await self._log_info(self.nc.jetstream())
            await self.reader.wait_for_seq(int(info.state.last_seq), timeout=RIG_CATCH_UP_S)
        except TimeoutError:
            log.warning("rig_catch_up_timed_out", rig=rig)

    async def reconcile(self) -> None:
        owed = plan.owed(self.projection.state, self.clock(), self._stale_after)
        if owed:
            await self.append_owed(owed)

    def query(self, what: str, body: dict[str, Any]) -> Any:
        if what == "formulas":
            return self._formulas(body)
        if what == "formula":
            return self._formula(body)
        return queries.answer(self.projection.state, what, body)

    def check_session_query(self, what: str, body: dict[str, Any], session: str) -> None:
        queries.check_session_query(self.projection.state, what, body, session)

    def _formulas(self, body: dict[str, Any]) -> Any:
        rig = body.get("rig")
        if rig is not None and not isinstance(rig, str):
            raise QueryError("invalid", "`rig` must be a string")
        out = []
        for name, entry in sorted(self.formulas.entries(rig).items()):
            item: dict[str, Any] = {"name": name, "layer": entry.layer, "path": str(entry.path)}
            if entry.formula is not None:
                item.update(
                    description=entry.formula.description,
                    version=entry.formula.version,
                    steps=len(entry.formula.steps),
                )
            if entry.error is not None:
                item["error"] = str(entry.error)
            out.append(item)
        return out

    def _formula(self, body: dict[str, Any]) -> Any:
        name, rig, given = body.get("name"), body.get("rig"), body.get("vars") or {}
        if not isinstance(name, str) or not name:
            raise QueryError("invalid", "`name` is required")
        if rig is not None and not isinstance(rig, str):
            raise QueryError("invalid", "`rig` must be a string")
        if not isinstance(given, dict) or not all(isinstance(v, str) for v in given.values()):
            raise QueryError("invalid", "`vars` must be an object of strings")
        try:
            formula = self.formulas.get(name, rig)
            builtins = {"bead": "<bead>", "bead_title": "<bead title>", "rig": rig or "<rig>"}
            # Without vars the steps are shown as written, placeholders and all; with them, cooked.
            steps, used = cook(formula, given, builtins) if given else (formula.steps, {})
        except FormulaError as exc:
            raise QueryError("invalid", str(exc)) from None
        view: dict[str, Any] = msgspec.to_builtins(formula)
        view["steps"] = msgspec.to_builtins(steps)
        view["vars_used"] = used
        return view
