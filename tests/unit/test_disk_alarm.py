"""The deacon's disk-space alarm: raise once while low, close once back above the threshold and its margin."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from services.deacon import settings as deacon_settings
from services.deacon.plan.disk import SOURCE, CloseAlarm, Measurement, RaiseAlarm, plan
from services.deacon.projection import fold_disk as fold
from services.deacon.state import DiskAlarmState
from shared.model.events import Envelope, EscalationClosed, EscalationRaised

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def seen(*free: float) -> list[Measurement]:
    return [
        Measurement(what=f"the volume of /v{i}", free_percent=f, free_bytes=int(f * 2**30)) for i, f in enumerate(free)
    ]


def apply(state: DiskAlarmState, payload: EscalationRaised | EscalationClosed) -> None:
    env = Envelope(id="e", type=payload.TYPE, ts=T0, actor="mayor", data=msgspec.Raw(b"{}"))
    fold(payload, state, env, 1)


def test_low_space_raises_once_then_closes_once_back_past_the_margin() -> None:
    state = DiskAlarmState()
    assert plan(state, seen(50.0, 30.0), 10.0) is None
    owed = plan(state, seen(50.0, 4.5), 10.0)
    assert isinstance(owed, RaiseAlarm)
    assert owed.command_id == "disk-low-1"
    assert "/v1 has 4.5% free" in owed.message
    assert plan(state, seen(50.0, 4.5), 10.0) == owed, "the same command until it is in the log: carried out once"
    apply(state, EscalationRaised(escalation_id="hq-esc1", severity="high", source=SOURCE, message="low"))
    assert plan(state, seen(50.0, 3.0), 10.0) is None, "raised once"
    assert plan(state, seen(50.0, 11.0), 10.0) is None, "within the margin: still open"
    closing = plan(state, seen(50.0, 12.5), 10.0)
    assert isinstance(closing, CloseAlarm)
    assert (closing.escalation, closing.command_id) == ("hq-esc1", "disk-ok-hq-esc1")
    apply(state, EscalationClosed(escalation_id="hq-esc1", by="deacon"))
    assert plan(state, seen(50.0, 12.5), 10.0) is None
    again = plan(state, seen(2.0), 10.0)
    assert isinstance(again, RaiseAlarm)
    assert again.command_id == "disk-low-2", "a new episode, a new escalation"


def test_other_escalations_and_no_threshold_change_nothing() -> None:
    state = DiskAlarmState()
    apply(state, EscalationRaised(escalation_id="hq-other", severity="low", source="polecat:demo/toast", message="x"))
    assert state == DiskAlarmState()
    assert plan(state, seen(1.0), 0.0) is None, "0: no alarm"
    assert plan(state, [], 10.0) is None, "nothing measured: nothing known"


def test_settings() -> None:
    default = deacon_settings.load({})
    assert (default.disk_low_percent, default.disk_paths, default.disk_check_s) == (10.0, None, 30.0)
    got = deacon_settings.load({"GT_DISK_LOW_PERCENT": "5", "GT_DISK_WATCH": "/a, /b", "GT_DISK_CHECK_INTERVAL": "1"})
    assert (got.disk_low_percent, got.disk_paths, got.disk_check_s) == (5.0, ("/a", "/b"), 1.0)
