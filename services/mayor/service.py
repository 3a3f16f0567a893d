"""The mayor service: owns bead commands, answers bead queries from its projection."""

from __future__ import annotations

from typing import Any, ClassVar

from services.mayor import decide as mayor_decide
from services.mayor import queries
from services.mayor.projection import MayorState, new_projection
from shared.commands import Command
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext
from shared.service import Service, ServiceSettings


class MayorService(Service[MayorState]):
    name: ClassVar[str] = "mayor"

    def __init__(self, config: TownConfig, settings: ServiceSettings | None = None) -> None:
        super().__init__(config, new_projection(), settings)

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return mayor_decide.decide(self.projection.state, cmd, ctx)

    def aggregate_key(self, cmd: Command) -> str | None:
        return mayor_decide.aggregate_key(cmd)

    def query(self, what: str, body: dict[str, Any]) -> Any:
        return queries.answer(self.projection.state, what, body)
