"""What the mayor owes without being asked: closing finished convoys, re-escalating ignored escalations.

Level-triggered and pure: from the state (and the time, passed in) to the events still owed. Each event
carries its aggregate's expected sequence, so a decision taken twice (two ticks, or before and after a
restart) is stored at most once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from services.mayor.reads import convoy_progress
from services.mayor.state import MayorState
from shared.commands import SEVERITIES
from shared.decision import NewEvent
from shared.events import ConvoyClosed, EscalationReescalated

MAX_REESCALATIONS = 2


def convoy_closures(state: MayorState) -> list[NewEvent]:
    """An open convoy that is not owned, tracks at least one bead, and whose beads are all closed."""
    owed = []
    for convoy_id in state.open_convoys:
        convoy = state.convoys[convoy_id]
        if convoy.owned or not convoy.beads:
            continue
        closed, total = convoy_progress(state, convoy)
        if closed == total:
            event = ConvoyClosed(convoy_id=convoy.id, closed_beads=closed, total_beads=total)
            owed.append(NewEvent(payload=event, expected_seq=convoy.version))
    return owed


def reescalations(state: MayorState, now: datetime, stale_after: timedelta) -> list[NewEvent]:
    """An open, unacknowledged escalation raised (or last re-escalated) ``stale_after`` ago goes one
    severity up, at most twice, never past critical."""
    owed = []
    for escalation in state.escalations.values():
        if escalation.status != "open" or escalation.reescalations >= MAX_REESCALATIONS:
            continue
        rank = SEVERITIES.index(escalation.severity)
        if rank == len(SEVERITIES) - 1 or now - escalation.last_raised_at < stale_after:
            continue
        event = EscalationReescalated(
            escalation_id=escalation.id,
            from_severity=escalation.severity,
            to_severity=SEVERITIES[rank + 1],
            level=escalation.reescalations + 1,
        )
        owed.append(NewEvent(payload=event, expected_seq=escalation.version))
    return owed


def owed(state: MayorState, now: datetime, stale_after: timedelta) -> list[NewEvent]:
    return convoy_closures(state) + reescalations(state, now, stale_after)
