"""When the witness cuts an ended session's NATS connections (services/witness/effects/auth.py): not while it runs,
and only a grace after it ended, so that the session's own last `gt` call (`gt done` reading the outcome of the command
that ended it) is not cut half-way (seen in the compose stack: Codex CLI's `gt done` lost its connection and waited)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from services.witness.effects.auth import KICK_GRACE_S, kick_due
from services.witness.state import WitnessState
from shared.model.sessions import Session

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=UTC)


def session(status: str, ended_s_ago: float | None = None) -> Session:
    ended = NOW - timedelta(seconds=ended_s_ago) if ended_s_ago is not None else None
    return Session(
        id="hq-1-1",
        rig="demo",
        polecat="ace",
        bead="hq-1",
        worktree="/w",
        branch="polecat/ace/hq-1",
        tmux_name="gt-demo-ace",
        attempt=1,
        status=status,  # type: ignore[arg-type]
        requested_at=NOW - timedelta(minutes=5),
        ended_at=ended,
    )


def test_a_running_session_is_never_cut() -> None:
    state = WitnessState(sessions={"hq-1-1": session("started")})
    assert not kick_due(state, "hq-1-1", NOW)


def test_an_ended_session_is_cut_only_after_the_grace() -> None:
    just = WitnessState(sessions={"hq-1-1": session("ended", ended_s_ago=1.0)})
    assert not kick_due(just, "hq-1-1", NOW), "its own `gt done` is still reading its outcome"
    later = WitnessState(sessions={"hq-1-1": session("ended", ended_s_ago=KICK_GRACE_S)})
    assert kick_due(later, "hq-1-1", NOW)


def test_an_unknown_session_or_one_ended_at_no_known_time_is_cut_at_once() -> None:
    assert kick_due(WitnessState(), "hq-9-1", NOW)
    assert kick_due(WitnessState(sessions={"hq-1-1": session("ended")}), "hq-1-1", NOW)
