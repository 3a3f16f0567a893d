"""Statuses are Literal types defined once per aggregate (shared/model/events), with their named sets: each set holds
only its aggregate's statuses, and the folds that read them keep what each caller meant."""

from __future__ import annotations

import typing
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest

from services.refinery.state import MergeRequest
from services.witness.state import Session
from shared.model.events.beads import BEAD_RANK, BEAD_STATUSES, WORKING, BeadStatus, forward
from shared.model.events.merge_requests import MR_FINISHED, MR_IN_QUEUE, MR_OPEN, MR_SENT_BACK, MR_STATUSES, MrStatus
from shared.model.events.molecules import STEP_STATUSES, StepStatus
from shared.model.events.sessions import ACTIVE_SESSION, SESSION_STATUSES, SessionStatus

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("literal", "everything", "subsets"),
    [
        (BeadStatus, BEAD_STATUSES, [WORKING]),
        (SessionStatus, SESSION_STATUSES, [ACTIVE_SESSION]),
        (MrStatus, MR_STATUSES, [MR_IN_QUEUE, MR_OPEN, MR_FINISHED, MR_SENT_BACK]),
        (StepStatus, STEP_STATUSES, []),
    ],
)
def test_each_set_names_only_statuses_of_its_aggregate(
    literal: Any, everything: tuple[str, ...], subsets: list[tuple[str, ...]]
) -> None:
    assert set(everything) == set(typing.get_args(literal))
    assert len(everything) == len(set(everything))
    for subset in subsets:
        assert set(subset) <= set(everything), subset


def test_the_merge_request_sets_keep_their_callers_meanings() -> None:
    """The refinery's queue (what it takes and orders) and a town's open merge requests (not merged or rejected:
    also those waiting for a polecat or an operator) are two sets, both named."""
    assert MR_IN_QUEUE == ("queued", "claimed")
    assert set(MR_OPEN) == set(MR_STATUSES) - {"merged", "rejected"}
    assert set(MR_SENT_BACK) <= set(MR_FINISHED)
    assert not set(MR_IN_QUEUE) & set(MR_FINISHED)
    # The metrics list merge requests by status in this order.
    assert MR_STATUSES == ("queued", "claimed", "blocked", "conflicted", "failed", "escalated", "rejected", "merged")


def test_an_active_session_has_not_ended() -> None:
    assert set(ACTIVE_SESSION) == set(SESSION_STATUSES) - {"ended"}


def test_a_bead_moves_only_forward_in_its_order() -> None:
    assert [BEAD_RANK[s] for s in BEAD_STATUSES] == [0, 1, 2, 3]
    assert forward("open", "hooked") == "hooked"
    assert forward("closed", "in_progress") == "closed"
    assert set(WORKING) == {"hooked", "in_progress"}


def test_a_state_holding_a_status_outside_its_vocabulary_does_not_decode() -> None:
    """A snapshot is decoded into the typed state: a status no fold writes would be a corrupt snapshot (passed
    over, the log replayed), not a value carried on."""
    record = Session(
        id="s", rig="r", polecat="p", bead="b", worktree="w", branch="br", tmux_name="t", attempt=1, requested_at=T0
    )
    as_stored = msgspec.to_builtins(record)
    assert msgspec.convert(as_stored, Session) == record
    with pytest.raises(msgspec.ValidationError, match="status"):
        msgspec.convert({**as_stored, "status": "warranted"}, Session)
    fields = {f.name: f.type for f in msgspec.structs.fields(MergeRequest)}
    assert fields["status"] == MrStatus
