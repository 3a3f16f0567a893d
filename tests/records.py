"""The mayor's records and views for tests of what shows them, from only the fields a test names (the rest
filled in; ``msgspec.convert``, so each field may be given as its JSON would carry it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from shared.model.beads import BeadDetail
from shared.model.convoys import ConvoyView
from shared.model.escalations import Escalation
from shared.model.merge_requests import MergeRequest
from shared.model.prime import Prime
from shared.model.rigs import RigView
from shared.model.sessions import SessionDetail

WHEN = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


def escalation(**fields: Any) -> Escalation:
    severity = fields.get("severity", "high")
    defaults = {"id": "esc-1", "severity": severity, "original_severity": severity, "source": "operator"}
    return msgspec.convert({**defaults, "message": "", "raised_at": WHEN, "last_raised_at": WHEN, **fields}, Escalation)


def convoy(**fields: Any) -> ConvoyView:
    return msgspec.convert({"id": "cv-1", "title": "t", "created_at": WHEN, **fields}, ConvoyView)


def bead(**fields: Any) -> BeadDetail:
    return msgspec.convert({"id": "hq-1", "title": "t", "created_at": WHEN, "updated_at": WHEN, **fields}, BeadDetail)


def prime(**fields: Any) -> Prime:
    """A ``gt prime`` document: the fields given (the bead, its molecule and mail as their JSON would carry them,
    only the fields a test names), the rest as a fresh session of a bead without a molecule has them."""
    shown = dict(fields.pop("bead", {}))
    found = bead(**shown)
    molecule = fields.pop("molecule", None)
    if molecule is not None:
        molecule = {"bead_id": found.id, "formula": "f", "attached_at": WHEN, **molecule}
    mail = [{"title": "", "created_at": WHEN, "updated_at": WHEN, **m} for m in fields.pop("mail", [])]
    rig = fields.pop("rig", None)
    if rig is not None:
        rig = {"repo": "/repo", "prefix": "gt", "agent_command": "gt-agent", "added_at": WHEN, **rig}
    document = {
        "session": "s1",
        "status": "started",
        "attempt": 1,
        "polecat": "ace",
        "rig": rig,
        "worktree": "/w",
        "branch": "b",
        "molecule": molecule,
        "current_step": None,
        "done_intent": False,
        "merge_failure": None,
        "nudges": [],
        "before_you": [],
        "mail": mail,
        "instructions": "",
        **fields,
    }
    return msgspec.convert({**document, "bead": msgspec.to_builtins(found)}, Prime)


def rig(**fields: Any) -> RigView:
    defaults = {"name": "demo", "repo": "/repo", "prefix": "gt", "agent_command": "gt-agent", "added_at": WHEN}
    return msgspec.convert({**defaults, **fields}, RigView)


def session(**fields: Any) -> SessionDetail:
    defaults = {"id": "s1", "rig": "demo", "polecat": "ace", "bead": "hq-1", "worktree": "/w", "branch": "b"}
    return msgspec.convert({**defaults, "tmux_name": "t", "attempt": 1, "requested_at": WHEN, **fields}, SessionDetail)


def merge_request(**fields: Any) -> MergeRequest:
    defaults = {"id": "mr-1", "bead": "hq-1", "rig": "demo", "branch": "b", "target": "main", "head": "c0ffee"}
    return msgspec.convert({**defaults, "submitted_at": WHEN, "queued_at": WHEN, **fields}, MergeRequest)
