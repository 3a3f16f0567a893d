"""A witness's scope: the rigs it serves (``GT_WITNESS_RIGS``; all of them when unset). Pure.

Witnesses with disjoint scopes run side by side against the same streams. Each one folds the whole log (so any
of them answers every query alike) but plans and acts only for sessions, beads, nudges and tmux sessions of its
own rigs, and settles only the commands about its own rigs. All witnesses read their commands through the one
shared consumer ``witness-cmd``: a command about another scope's rig goes back to it (``elsewhere``) for that
scope's witness; one that names nothing known (an unknown session, bead or rig) is rejected by whichever
witness settles it first, and the log keeps that one outcome.

Each scope is its own service scope for activity (one active witness per scope, any number of standbys) and for
liveness: ``witness`` for all rigs, ``witness-<rig>_<rig>...`` for a set of rigs (sorted), or, when that would
be ambiguous or too long, ``witness-_<digest>``.
"""

from __future__ import annotations

import hashlib

from services.witness.plan.actions import (
    Action,
    CrewAction,
    DeliverNudge,
    ExpireNudge,
    KillOrphan,
    MassDeath,
    NudgeMail,
    Resling,
    SessionAction,
    Spawn,
)
from services.witness.state import WitnessState
from shared.core.ids import is_valid_id
from shared.model.commands import POLECAT_TARGET, Command
from shared.model.commands.base import ScopeRef
from shared.model.commands.town_agents import TOWN_AGENT_COMMANDS
from shared.model.decision import Route

SERVICE = "witness"
MAX_IDENTITY = 64
TMUX_PREFIX = "gt-"
"""Every polecat's tmux session is ``gt-<rig>-<polecat>``."""

Rigs = frozenset[str] | None
"""The rigs a witness serves; None: all of them."""


def parse_rigs(text: str | None) -> Rigs:
    """``GT_WITNESS_RIGS``: comma-separated rig names; unset or blank: all rigs.

    Raises:
        ValueError: naming the variable, for a name that cannot be a rig's.
    """
    if text is None or not text.strip():
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in names if not is_valid_id(name)]
    if bad:
        listed = ", ".join(map(repr, bad))
        raise ValueError(f"GT_WITNESS_RIGS must list rig names (lower-case letters, digits, - and _), got {listed}")
    return frozenset(names)


def identity(rigs: Rigs) -> str:
    """The scope's name for activity and liveness; distinct scopes never share one."""
    if rigs is None:
        return SERVICE
    ordered = sorted(rigs)
    readable = f"{SERVICE}-{'_'.join(ordered)}"
    if len(readable) <= MAX_IDENTITY and not any("_" in name for name in ordered):
        return readable
    # A rig name never starts with "_", so this form cannot be mistaken for a readable one.
    digest = hashlib.sha256(",".join(ordered).encode()).hexdigest()[:16]
    return f"{SERVICE}-_{digest}"


def serves(rigs: Rigs, rig: str | None) -> bool:
    """Whether a witness of ``rigs`` serves ``rig`` (None: a thing of no known rig, served only by a witness
    of all rigs)."""
    if rigs is None:
        return True
    return rig is not None and rig in rigs


# ---- commands ----------------------------------------------------------------------------------


def rig_of(state: WitnessState, ref: ScopeRef | None) -> str | None:
    """The rig a command's ``scope_ref`` resolves to, as far as the log knows it (None: it names nothing known)."""
    match ref:
        case ScopeRef(kind="rig", id=name):
            return name  # the rig it names, added or not yet
        case ScopeRef(kind="session", id=session_id):
            session = state.sessions.get(session_id)
            return session.rig if session is not None else None
        case ScopeRef(kind="target", id=target):
            named = state.sessions.get(target)
            if named is not None:
                return named.rig
            address = POLECAT_TARGET.fullmatch(target)
            return address["rig"] if address is not None and address["rig"] in state.rigs else None
        case ScopeRef(kind="bead", id=bead_id):
            bead = state.beads.get(bead_id)
            return bead.rig if bead is not None else None
    return None


def route(state: WitnessState, cmd: Command, rigs: Rigs) -> Route:
    """Whether a witness of ``rigs`` settles ``cmd``."""
    if rigs is None:
        return "mine"
    if isinstance(cmd, TOWN_AGENT_COMMANDS):
        return "elsewhere"  # the town agents are a witness of every rig's
    rig = rig_of(state, cmd.scope_ref())
    if rig is None:
        return "unknown"
    return "mine" if rig in rigs else "elsewhere"


# ---- actions -----------------------------------------------------------------------------------


def rig_of_tmux_name(name: str, rigs: list[str]) -> str | None:
    """The rig a tmux session named ``gt-<rig>-<polecat>`` belongs to (the longest rig name that fits, since
    rig names may hold dashes); None when no known rig fits."""
    fits = [rig for rig in rigs if name.startswith(f"{TMUX_PREFIX}{rig}-")]
    return max(fits, key=len) if fits else None


def rig_of_action(state: WitnessState, action: Action) -> str | None:
    """The rig an action touches (None: none the log knows)."""
    if isinstance(action, Spawn | Resling | MassDeath | CrewAction):
        return action.rig
    if isinstance(action, SessionAction):
        session = state.sessions.get(action.session)
        return session.rig if session is not None else None
    if isinstance(action, DeliverNudge | ExpireNudge):
        nudge = state.nudges.get(action.nudge)
        return nudge.rig if nudge is not None else None
    if isinstance(action, NudgeMail):
        notice = state.mail.get(action.message)
        return notice.rig if notice is not None else None
    if isinstance(action, KillOrphan):
        return rig_of_tmux_name(action.tmux_name, list(state.rigs))
    return None


def in_scope(state: WitnessState, actions: list[Action], rigs: Rigs) -> list[Action]:
    """The actions a witness of ``rigs`` carries out (every one for a witness of all rigs)."""
    if rigs is None:
        return actions
    return [action for action in actions if serves(rigs, rig_of_action(state, action))]
