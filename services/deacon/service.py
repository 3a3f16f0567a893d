"""The deacon service."""

from __future__ import annotations

from typing import ClassVar

from services.follower import LogTally, new_projection
from shared.config import TownConfig
from shared.service import Service, ServiceSettings


class DeaconService(Service[LogTally]):
    name: ClassVar[str] = "deacon"

    def __init__(self, config: TownConfig, settings: ServiceSettings | None = None) -> None:
        super().__init__(config, new_projection(self.name), settings)
