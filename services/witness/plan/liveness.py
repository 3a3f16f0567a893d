"""Keeping the hook lease of a session whose agent is busy with its own tools (docs/agents.md, "Liveness").

An agent renews its bead's hook lease with every `gt` call; a real coding agent may call only its own tools for
longer than the lease's TTL. The witness (which acquired the lease for the session) renews it on the session's
behalf when it sees the agent's activity (a tool-call hook's mark, the transcript growing), at most every quarter
TTL and once per new activity. Fencing is unchanged: only a lease still held with the session's own token is
renewed, and the renewal itself refuses a lease the deacon expired or a newer session took. A runtime still
starting (it confirms its start with a hook, and has not yet) shows no activity at all until that hook: its start
counts as activity until the start deadline (``GT_AGENT_START_TIMEOUT``), which judges a start that never comes
(OpenCode took 13-21 s to its first hook on a loaded machine; the lease's TTL may be shorter). Pure: the service
does the renewing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import msgspec

from services.witness.state import Session, WitnessState
from shared.core.ids import hook_lease_name


class Renewal(msgspec.Struct, frozen=True, kw_only=True):
    session: str
    lease: str
    token: int


def renewals_owed(
    state: WitnessState,
    activity: Mapping[str, datetime],
    renewed: Mapping[str, datetime],
    now: datetime,
) -> list[Renewal]:
    """The hook leases to renew for sessions whose agent showed activity (``activity``: session -> when) since
    the witness last renewed for them (``renewed``: session -> when)."""
    owed = []
    for session_id, active_at in activity.items():
        session = state.sessions.get(session_id)
        if session is None or session.status != "started" or session.lease_token is None:
            continue
        hook = state.hooks.get(hook_lease_name(session.bead))
        if hook is None or not hook.held_by(session_id, session.lease_token):
            continue
        if (now - active_at).total_seconds() >= hook.ttl_s:
            continue  # activity that old cannot vouch for the agent now
        last = renewed.get(session_id)
        if last is not None and (active_at <= last or (now - last).total_seconds() < hook.ttl_s / 4):
            continue
        owed.append(Renewal(session=session_id, lease=hook.name, token=hook.token))
    return owed


def still_starting(
    session: Session, *, confirms_start: bool, confirmed: bool, now: datetime, deadline_s: float
) -> bool:
    """Whether ``session``'s runtime is still within its start: it confirms its start, has not yet, and its pane
    started less than ``deadline_s`` ago (after that, the start deadline fails it)."""
    if session.status != "started" or not confirms_start or confirmed or session.started_at is None:
        return False
    return (now - session.started_at).total_seconds() < deadline_s
