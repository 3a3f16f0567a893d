"""Queries the mayor answers (``gt.q.mayor.<name>``): beads, molecules, convoys, mail, escalations, costs and
formulas. Beads, messages, molecules, convoys and escalations come back as the mayor's records, or views that extend
them (``shared.model.beads``, ``molecules``, ``convoys``, ``escalations``); costs and formulas as the JSON the CLI
prints (``Any``)."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from shared.model import formulas
from shared.model.beads import Bead, BeadDetail
from shared.model.convoys import ConvoyView
from shared.model.escalations import Escalation
from shared.model.gates import GateView
from shared.model.molecules import MoleculeView
from shared.model.queries.base import Limit, PageBytes, Query, R, Required
from shared.model.usage import CostRow


class MayorQuery(Query[R], frozen=True, kw_only=True):
    """A query the mayor answers (``gt.q.mayor.<name>``)."""

    SERVICE: ClassVar[str] = "mayor"


class _BeadsQuery(MayorQuery[list[Bead]], frozen=True, kw_only=True):
    """A query answered with beads (a message is a bead), each its record as the mayor keeps it."""


class Get(MayorQuery[BeadDetail], frozen=True, kw_only=True):
    """One bead (a message is a bead), with its hold while held."""

    NAME: ClassVar[str] = "get"
    id: Required


class Beads(_BeadsQuery, frozen=True, kw_only=True):
    """Beads in creation order, filtered by every field given (closed ones only with ``include_closed`` or
    ``status="closed"``); ``limit`` 0 is all."""

    NAME: ClassVar[str] = "list"
    PAGED: ClassVar[bool] = True
    status: str | None = None
    type: str | None = None
    label: str | None = None
    assignee: str | None = None
    parent: str | None = None
    rig: str | None = None
    metadata: dict[str, str] = {}
    include_closed: bool = False
    limit: Limit | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""
    page_bytes: PageBytes | None = None
    """At most this many bytes of items in a page (the query server sets what one reply carries)."""


class Ready(_BeadsQuery, frozen=True, kw_only=True):
    """Open beads with no open blocker."""

    NAME: ClassVar[str] = "ready"
    PAGED: ClassVar[bool] = True
    limit: Limit | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""
    page_bytes: PageBytes | None = None
    """At most this many bytes of items in a page (the query server sets what one reply carries)."""


class Children(_BeadsQuery, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "children"
    id: Required
    include_closed: bool = False


class DepView(msgspec.Struct, kw_only=True):
    """A bead another needs (or that needs it): its status, None when it does not exist (any more)."""

    id: str
    status: str | None
    exists: bool


class Deps(MayorQuery[list[DepView]], frozen=True, kw_only=True):
    """What the bead needs (``down``) or what needs it (``up``)."""

    NAME: ClassVar[str] = "deps"
    id: Required
    direction: str | None = None


class Molecule(MayorQuery[MoleculeView], frozen=True, kw_only=True):
    """A bead's molecule: its steps, the current one, how many are done."""

    NAME: ClassVar[str] = "molecule"
    bead: Required


class Gates(MayorQuery[list[GateView]], frozen=True, kw_only=True):
    """The gates not opened yet of molecules whose bead is not closed, waiting ones first (``gt gate list``)."""

    NAME: ClassVar[str] = "gates"
    rig: str | None = None
    bead: str | None = None


class Convoy(MayorQuery[ConvoyView], frozen=True, kw_only=True):
    """One convoy with its beads' details."""

    NAME: ClassVar[str] = "convoy"
    id: Required


class Convoys(MayorQuery[list[ConvoyView]], frozen=True, kw_only=True):
    NAME: ClassVar[str] = "convoys"
    PAGED: ClassVar[bool] = True
    include_closed: bool = False
    limit: Limit | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""
    page_bytes: PageBytes | None = None
    """At most this many bytes of items in a page (the query server sets what one reply carries)."""


class Inbox(_BeadsQuery, frozen=True, kw_only=True):
    """Open messages to ``to`` (unread ones only unless ``include_read``)."""

    NAME: ClassVar[str] = "inbox"
    PAGED: ClassVar[bool] = True
    to: Required
    include_read: bool = False
    limit: Limit | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""
    page_bytes: PageBytes | None = None
    """At most this many bytes of items in a page (the query server sets what one reply carries)."""


class Thread(_BeadsQuery, frozen=True, kw_only=True):
    NAME: ClassVar[str] = "thread"
    thread: Required


class Escalations(MayorQuery[list[Escalation]], frozen=True, kw_only=True):
    """Open and acknowledged escalations, most severe first (closed ones too with ``include_closed``)."""

    NAME: ClassVar[str] = "escalations"
    PAGED: ClassVar[bool] = True
    include_closed: bool = False
    limit: Limit | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""
    page_bytes: PageBytes | None = None
    """At most this many bytes of items in a page (the query server sets what one reply carries)."""


class Costs(MayorQuery[list[CostRow]], frozen=True, kw_only=True):
    """Token usage grouped ``by`` bead (the default), rig, convoy, day or session."""

    NAME: ClassVar[str] = "costs"
    by: str | None = None


class FormulaEntry(msgspec.Struct, kw_only=True):
    """A formula file the town (or a rig) sees: where it is and, read, what it holds, or why it is broken."""

    name: str
    layer: str
    """Which catalog it comes from: built-in, the town's, or the rig's."""
    path: str
    description: str | UnsetType = UNSET
    version: int | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    error: str | UnsetType = UNSET


class FormulaDetail(formulas.Formula, frozen=True, kw_only=True):
    """One formula as ``formula`` answers it: its steps as written, or cooked with the vars given (``vars_used``)."""

    vars_used: dict[str, str] = {}


class Formulas(MayorQuery[list[FormulaEntry]], frozen=True, kw_only=True):
    """Every formula the town (and ``rig``) sees, broken ones with their error."""

    NAME: ClassVar[str] = "formulas"
    rig: str | None = None


class Formula(MayorQuery[FormulaDetail], frozen=True, kw_only=True):
    """One formula as written, or cooked with ``vars``."""

    NAME: ClassVar[str] = "formula"
    name: Required
    vars: dict[str, str] = {}
    rig: str | None = None


QUERIES: tuple[type[Query[Any]], ...] = (
    Get,
    Beads,
    Ready,
    Children,
    Deps,
    Molecule,
    Gates,
    Convoy,
    Convoys,
    Inbox,
    Thread,
    Escalations,
    Costs,
    Formulas,
    Formula,
)
"""What the mayor answers (besides ``status`` and ``digest``), in the order its unknown-query error names them."""
