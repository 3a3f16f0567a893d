"""Events of the crew aggregate (``gt.evt.crew.<rig>-<name>``): a rig's named workspaces, written by the witness
that keeps them (docs/crew.md)."""

from __future__ import annotations

from typing import ClassVar

from shared.model.crew import crew_key
from shared.model.events.base import Event


class CrewEvent(Event, frozen=True, kw_only=True):
    AGGREGATE: ClassVar[str] = "crew"
    rig: str
    name: str

    def aggregate_id(self) -> str:
        return crew_key(self.rig, self.name)


class CrewAdded(CrewEvent, frozen=True, kw_only=True):
    """A crew member was added (``gt crew add``): its workspace is made next."""

    TYPE: ClassVar[str] = "crew.added"
    branch: str
    workspace: str
    """Its workspace's absolute path (``<rigs>/<rig home>/crew/<name>``)."""


class CrewReady(CrewEvent, frozen=True, kw_only=True):
    """Its workspace is there, on its branch."""

    TYPE: ClassVar[str] = "crew.ready"


class CrewHooked(CrewEvent, frozen=True, kw_only=True):
    """A bead was hooked to it (``gt crew sling``): the bead's sessions run in its workspace."""

    TYPE: ClassVar[str] = "crew.hooked"
    bead: str


class CrewRemoved(CrewEvent, frozen=True, kw_only=True):
    """It was removed (``gt crew remove``), its workspace holding nothing unsaved: the workspace goes next."""

    TYPE: ClassVar[str] = "crew.removed"


class CrewWorkspaceRemoved(CrewEvent, frozen=True, kw_only=True):
    """What became of a removed crew member's workspace: gone, or kept (``removed`` False: work was found in it
    after all, named in ``detail``)."""

    TYPE: ClassVar[str] = "crew.workspace_removed"
    removed: bool
    detail: str = ""


CREW_EVENTS: tuple[type[CrewEvent], ...] = (CrewAdded, CrewReady, CrewHooked, CrewRemoved, CrewWorkspaceRemoved)
