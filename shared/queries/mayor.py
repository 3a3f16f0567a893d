"""Queries the mayor answers (``gt.q.mayor.<name>``): beads, molecules, convoys, mail, escalations, costs and
formulas. Their answers are the JSON views the CLI prints and renders (``Any``), except where a caller reads
fields (``ConvoyDetail``, ``EscalationSummary``)."""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from shared.events.beads import BeadStatus
from shared.queries.base import Query


class _MayorQuery(Query[Any], frozen=True, kw_only=True, forbid_unknown_fields=True):
    SERVICE: ClassVar[str] = "mayor"


class Get(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One bead (a message is a bead), with its hold while held."""

    NAME: ClassVar[str] = "get"
    id: str


class Beads(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Beads in creation order, filtered by every field given (closed ones only with ``include_closed`` or
    ``status="closed"``); ``limit`` 0 is all."""

    NAME: ClassVar[str] = "list"
    status: str | None = None
    type: str | None = None
    label: str | None = None
    assignee: str | None = None
    parent: str | None = None
    rig: str | None = None
    metadata: dict[str, str] = {}
    include_closed: bool = False
    limit: int | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""


class Ready(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Open beads with no open blocker."""

    NAME: ClassVar[str] = "ready"
    limit: int | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""


class Children(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "children"
    id: str
    include_closed: bool = False


class Deps(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the bead needs (``down``) or what needs it (``up``)."""

    NAME: ClassVar[str] = "deps"
    id: str
    direction: str | None = None


class Molecule(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A bead's molecule: its steps, the current one, how many are done."""

    NAME: ClassVar[str] = "molecule"
    bead: str


class ConvoyBead(msgspec.Struct, kw_only=True):
    """A bead a convoy tracks: where it is (its wave, what it waits for: ``ask_json``)."""

    id: str
    status: BeadStatus


class ConvoyDetail(msgspec.Struct, kw_only=True):
    """The fields of a convoy callers read (``ask_json`` has all of them)."""

    id: str
    status: str = ""
    bead_details: list[ConvoyBead] = []


class Convoy(Query[ConvoyDetail], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One convoy with its beads' details."""

    SERVICE: ClassVar[str] = "mayor"
    NAME: ClassVar[str] = "convoy"
    id: str


class Convoys(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "convoys"
    include_closed: bool = False
    limit: int | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""


class Inbox(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Open messages to ``to`` (unread ones only unless ``include_read``)."""

    NAME: ClassVar[str] = "inbox"
    to: str
    include_read: bool = False
    limit: int | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""


class Thread(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    NAME: ClassVar[str] = "thread"
    thread: str


class EscalationSummary(msgspec.Struct, kw_only=True):
    """The fields of an escalation callers read (the whole view is in ``ask_json``)."""

    id: str
    status: str = ""
    severity: str = ""
    bead: str | None = None


class Escalations(Query[list[EscalationSummary]], frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Open and acknowledged escalations, most severe first (closed ones too with ``include_closed``)."""

    SERVICE: ClassVar[str] = "mayor"
    NAME: ClassVar[str] = "escalations"
    include_closed: bool = False
    limit: int | None = None
    after: str | None = None
    """A page cursor: list from the item after this id (an answer's ``next``)."""


class Costs(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Token usage grouped ``by`` bead (the default), rig, convoy, day or session."""

    NAME: ClassVar[str] = "costs"
    by: str | None = None


class Formulas(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every formula the town (and ``rig``) sees, broken ones with their error."""

    NAME: ClassVar[str] = "formulas"
    rig: str | None = None


class Formula(_MayorQuery, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One formula as written, or cooked with ``vars``."""

    NAME: ClassVar[str] = "formula"
    name: str
    vars: dict[str, str] = {}
    rig: str | None = None
