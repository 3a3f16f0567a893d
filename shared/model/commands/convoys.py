"""Convoy commands (``gt.cmd.convoy.<verb>``), owned by the mayor."""

from __future__ import annotations

from typing import ClassVar

from shared.core.ids import CONVOY_PREFIX
from shared.model.commands.base import MAX_TITLE, Command, Creates, check_ids, check_text
from shared.model.results import ConvoyResult


class ConvoyCreate(Creates[ConvoyResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Track beads together; the convoy closes when all of them are closed (an ``owned`` one when landed)."""

    SUBJECT: ClassVar[str] = "gt.cmd.convoy.create"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("convoy", "new_id")
    title: str
    beads: list[str] = []
    owned: bool = False

    def id_prefix(self) -> str:
        return CONVOY_PREFIX

    def validate(self) -> None:
        super().validate()
        check_text("title", self.title, MAX_TITLE, nonblank=True)
        check_ids("beads", self.beads)


class ConvoyAdd(Command[ConvoyResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Track more beads in an open convoy (beads it tracks already are skipped)."""

    SUBJECT: ClassVar[str] = "gt.cmd.convoy.add"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("convoy", "id")
    REQUIRED_IDS = ("id",)
    id: str
    beads: list[str]

    def validate(self) -> None:
        super().validate()
        check_ids("beads", self.beads, required=True)


class ConvoyLand(Command[ConvoyResult], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Close an owned convoy; refused while it tracks open beads unless ``force``."""

    SUBJECT: ClassVar[str] = "gt.cmd.convoy.land"
    OWNER: ClassVar[str] = "mayor"
    ORDERED_BY = ("convoy", "id")
    REQUIRED_IDS = ("id",)
    id: str
    force: bool = False


CONVOY_COMMANDS: tuple[type[Command], ...] = (ConvoyCreate, ConvoyAdd, ConvoyLand)
