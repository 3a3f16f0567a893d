"""A rig as the log records it (``gt.evt.rig.<name>``, written by the witness): the one record and the one fold
of it, kept by the witness (which starts its sessions) and the refinery (which runs its gates). Pure: no I/O,
no clock."""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.model.commands.rigs import RIG_SETTINGS
from shared.model.events import Envelope, RigAdded, RigEvent, RigParked, RigRemoved, RigUnparked, RigUpdated
from shared.model.fold import touch


class Rig(msgspec.Struct, kw_only=True, gc=False):
    name: str
    repo: str
    base_branch: str = "main"
    prefix: str
    setup_command: str = ""
    lint_command: str = ""
    test_command: str = ""
    agent_command: str
    max_polecats: int = 4
    max_respawns: int = 3
    stall_after_s: float = 600.0
    git_name: str = ""
    """Template of the git name its polecats commit with (empty: the default, ``{rig}/{polecat}``)."""
    git_email: str = ""
    """Template of their git email (empty: the default, ``{polecat}.{rig}@gastown.invalid``)."""
    gate_env: list[str] = []
    """Names of the refinery's environment variables its gates see besides the allowlist
    (``merger.GATE_BASE_ENV``)."""
    gate_pristine: bool = False
    """Each merge's gates run in a workspace made fresh for them (``RigAdd.gate_pristine``); False: the rig's gate
    workspace, its ignored files and the gate's home persist between merges."""
    added_at: datetime
    parked: bool = False
    """No new sessions start (``gt rig park``, or removed): beads slung to it wait, running sessions finish."""
    parked_reason: str = ""
    removed: bool = False
    """Out of service (``gt rig remove``): parked, not listed, slings to it refused by the mayor, until its name is
    added again (a new incarnation)."""
    incarnation: int = 1
    """How many times the name was added: a rig added again after its removal is a new rig under the old name,
    with fresh state and its own directory (``home_name``)."""
    former_prefixes: list[str] = []
    """Bead prefixes its earlier incarnations had: no other rig takes them."""
    version: int = 0


class RigView(Rig, kw_only=True, gc=False):
    """A rig as ``gt.q.witness.rigs`` and ``rig`` answer it: its settings, and how busy it is."""

    active_sessions: int = 0
    waiting_beads: int = 0
    """Beads slung to it that wait for a polecat."""


def home_name(rig: Rig) -> str:
    """The rig's directory under ``GT_HOME/rigs``: its name, and for a later incarnation ``<name>.<incarnation>``
    (no rig name holds a dot), so nothing of the removed rig's (clones, worktrees, bundles) is reused."""
    return rig.name if rig.incarnation == 1 else f"{rig.name}.{rig.incarnation}"


def fold_rig(payload: RigEvent, rigs: dict[str, Rig], env: Envelope, seq: int) -> None:
    """Fold a rig event stored at ``seq`` into ``rigs``. The first ``rig.added`` makes the record (one after the
    rig's removal a new record: its next incarnation); a
    ``rig.updated`` changes the settings it carries (the next session or merge takes them, one under way keeps
    what it started with); every later event on the rig moves its version."""
    if isinstance(payload, RigAdded):
        earlier = rigs.get(payload.rig)
        if earlier is None or earlier.removed:
            rigs[payload.rig] = Rig(
                name=payload.rig,
                repo=payload.repo,
                base_branch=payload.base_branch,
                prefix=payload.prefix,
                setup_command=payload.setup_command,
                lint_command=payload.lint_command,
                test_command=payload.test_command,
                agent_command=payload.agent_command,
                max_polecats=payload.max_polecats,
                max_respawns=payload.max_respawns,
                stall_after_s=payload.stall_after_s,
                git_name=payload.git_name,
                git_email=payload.git_email,
                gate_env=payload.gate_env,
                gate_pristine=payload.gate_pristine,
                added_at=env.ts,
                incarnation=1 if earlier is None else earlier.incarnation + 1,
                former_prefixes=[] if earlier is None else _prefixes_before(earlier, payload.prefix),
                version=seq,
            )
    elif (rig := touch(rigs, payload.rig, seq)) is not None:
        _change(rig, payload)


def _prefixes_before(earlier: Rig, prefix: str) -> list[str]:
    return [p for p in dict.fromkeys([*earlier.former_prefixes, earlier.prefix]) if p != prefix]


def _change(rig: Rig, payload: RigEvent) -> None:
    """What a later event on the rig changes on its record (a mass death: nothing but its version)."""
    if isinstance(payload, RigUpdated):
        for field in RIG_SETTINGS:
            value = getattr(payload, field)
            if value is not msgspec.UNSET:
                setattr(rig, field, value)
    elif isinstance(payload, RigParked):
        rig.parked, rig.parked_reason = True, payload.reason
    elif isinstance(payload, RigUnparked) and not rig.removed:
        rig.parked, rig.parked_reason = False, ""
    elif isinstance(payload, RigRemoved):
        rig.parked = rig.removed = True
