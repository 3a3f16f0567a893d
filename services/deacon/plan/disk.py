"""The disk-space alarm: an escalation while the log's storage runs low, closed once it is back. Pure.

What is measured (by the deacon's watch): the free space of each watched path (the JetStream store's volume),
and, when the town's NATS account has a JetStream storage limit, how much of it is left. Low means under
``low_percent`` free; the alarm is raised once (one open escalation, source ``deacon/disk``, found again in the
log after a restart) and closed once every measurement is back above ``low_percent + CLEAR_MARGIN_PERCENT``, so
a volume hovering around the threshold does not raise and close it over and over.
"""

from __future__ import annotations

import msgspec

from services.deacon.state import DISK_ALARM_SOURCE, DiskAlarmState

SOURCE = DISK_ALARM_SOURCE
CLEAR_MARGIN_PERCENT = 2.0


class Measurement(msgspec.Struct, frozen=True, kw_only=True):
    what: str
    """``disk <path>`` or ``JetStream account storage``."""
    free_percent: float
    free_bytes: int


class RaiseAlarm(msgspec.Struct, frozen=True, kw_only=True):
    command_id: str
    message: str


class CloseAlarm(msgspec.Struct, frozen=True, kw_only=True):
    command_id: str
    escalation: str
    reason: str


def plan(state: DiskAlarmState, seen: list[Measurement], low_percent: float) -> RaiseAlarm | CloseAlarm | None:
    """What the alarm owes for what was measured now (``low_percent`` 0: no alarm)."""
    if low_percent <= 0 or not seen:
        return None
    low = [m for m in seen if m.free_percent < low_percent]
    if low and state.open is None:
        worst = min(low, key=lambda m: m.free_percent)
        message = (
            f"{worst.what} has {worst.free_percent:.1f}% free ({worst.free_bytes / 2**30:.2f} GiB), under the "
            f"{low_percent:g}% alarm (GT_DISK_LOW_PERCENT): once full, the log refuses every event and the town "
            "stops. Free space or grow the volume; find who writes most with `gt feed` (rate limits: GT_RATE_*)"
        )
        return RaiseAlarm(command_id=f"disk-low-{state.raised + 1}", message=message)
    clear = low_percent + CLEAR_MARGIN_PERCENT
    if state.open is not None and all(m.free_percent >= clear for m in seen):
        reason = "space is back: " + ", ".join(f"{m.what} {m.free_percent:.1f}% free" for m in seen)
        return CloseAlarm(command_id=f"disk-ok-{state.open}", escalation=state.open, reason=reason)
    return None
