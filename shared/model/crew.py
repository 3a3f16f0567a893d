"""Crew: named workspaces of a rig where a person (or an agent given work) works outside a polecat's pool
(docs/crew.md). The record the witness keeps and answers with, and the names and places every side derives from
a crew member's rig and name. Pure: no I/O."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

import msgspec

CREW_NAME = re.compile(r"[a-z][a-z0-9]{1,15}")
"""A crew member's name: a lowercase word (it names a branch, a directory, a tmux session and a polecat)."""

CREW_BRANCH_PREFIX = "crew/"
CREW_ENV = "GT_CREW"
"""Set in a crew member's shell (``gt crew attach``) to ``<rig>/<name>``: `gt prime` and `gt done` act for it."""
SHELL_TMUX_PREFIX = "gtcrew-"
"""A crew member's own shell's tmux name prefix: never ``gt-`` (a polecat's, which the witness reaps when no
session owns it)."""

CrewStatus = Literal["added", "removed"]


class Crew(msgspec.Struct, kw_only=True, gc=False):
    """A crew member of a rig: its workspace (a repository of its own on ``crew/<name>``) and the bead hooked to it."""

    rig: str
    name: str
    branch: str
    workspace: str
    status: CrewStatus = "added"
    added_at: datetime | None = None
    ready: bool = False
    """Its workspace was made (``crew.ready``)."""
    hooked: str | None = None
    """The bead hooked to it (``gt crew sling``): its sessions run in the workspace, as the crew member."""
    gone: bool = False
    """Removed, and its workspace with it: listed no more, and its name free (the record stays for its version)."""
    kept: str = ""
    """Removed, but its workspace was kept: why (work found in it when it was to go; added again, it is used)."""
    version: int = 0


def crew_key(rig: str, name: str) -> str:
    """The crew member's aggregate id (``gt.evt.crew.<rig>-<name>``): a name holds no dash, so it is unambiguous."""
    return f"{rig}-{name}"


def crew_branch(name: str) -> str:
    return f"{CREW_BRANCH_PREFIX}{name}"


def crew_of_branch(branch: str) -> str | None:
    """The crew member whose branch ``branch`` is (None: not a crew branch)."""
    name = branch.removeprefix(CREW_BRANCH_PREFIX)
    return name if name != branch and CREW_NAME.fullmatch(name) else None


def crew_publisher(name: str) -> str:
    """Where a crew member's `gt done` publishes (``done_flow.published_dir``) and what the refinery imports it
    under: a name no session id takes (a session id ends in ``-<attempt>``, digits; a crew name starts with a
    letter)."""
    return f"crew-{name}"


def shell_tmux_name(rig: str, name: str) -> str:
    return f"{SHELL_TMUX_PREFIX}{rig}-{name}"


def parse_crew_env(value: str) -> tuple[str, str] | None:
    """``GT_CREW``'s ``<rig>/<name>`` (None: not that shape)."""
    rig, sep, name = value.partition("/")
    return (rig, name) if sep and rig and CREW_NAME.fullmatch(name) else None
