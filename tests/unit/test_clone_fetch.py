"""When a rig's clone serves a new branch as it is, and when it is fetched first (``effects/clone_fetch.py``): a
merge the rig's queue made after the last fetch began always sends it to origin; otherwise a fetch serves for
``FETCH_REUSE_S``. The merges come from the witness's fold of ``mr.merged``."""

from __future__ import annotations

import pytest

from services.witness.effects.clone_fetch import FETCH_REUSE_S, RELEASE_REFETCH_S, CloneFetches, Fetched, fresh
from shared.model.events import MergeRequestMerged, MergeRequestSubmitted
from tests.unit.test_witness_plan import World


def test_a_clone_never_fetched_is_not_fresh() -> None:
    assert not fresh(None, merged=0, wanted=100.0)


def test_a_fetch_serves_branches_asked_for_within_the_window_when_nothing_merged_since() -> None:
    last = Fetched(began=100.0, merged=7)
    assert fresh(last, merged=7, wanted=100.0 + FETCH_REUSE_S)
    assert not fresh(last, merged=7, wanted=100.0 + FETCH_REUSE_S + 0.01), "a push outside the queue: seen in time"


def test_a_release_fetches_unless_a_fetch_began_a_moment_before() -> None:
    last = Fetched(began=100.0, merged=7)
    assert fresh(last, merged=7, wanted=100.0 + RELEASE_REFETCH_S, reuse_s=RELEASE_REFETCH_S), "sessions ending at once"
    assert not fresh(last, merged=7, wanted=100.0 + RELEASE_REFETCH_S + 0.01, reuse_s=RELEASE_REFETCH_S)


def test_a_merge_after_the_fetch_began_always_needs_another() -> None:
    last = Fetched(began=100.0, merged=7)
    assert not fresh(last, merged=8, wanted=100.5), "the queue pushed work the clone lacks"


def test_an_older_fetch_never_replaces_a_newer_record() -> None:
    fetches = CloneFetches()
    fetches.record("demo", Fetched(began=200.0, merged=9))
    fetches.record("demo", Fetched(began=150.0, merged=3))  # a slower fetch that began first, ending later
    assert fetches.fresh("demo", merged=9, wanted=201.0)
    assert not fetches.fresh("other", merged=0, wanted=201.0)


@pytest.mark.parametrize("already", [False, True])
def test_a_merge_of_the_rigs_queue_is_folded_as_its_base_moving(already: bool) -> None:
    """``already``: the push happened in an attempt that crashed before it recorded it: the base moved all the same."""
    world = World()
    world.rig()
    world.bead("gt-abc")
    world.add(
        MergeRequestSubmitted(
            mr_id="mr-1", bead="gt-abc", rig="demo", branch="polecat/ace/gt-abc", target="main", head="abc"
        )
    )
    assert "demo" not in world.state.base_merged
    world.add(MergeRequestMerged(mr_id="mr-1", merged_commit="def", target_before="abc", already=already))
    assert world.state.base_merged == {"demo": world.projection.last_seq}


def test_a_merge_of_an_unknown_merge_request_moves_nothing() -> None:
    world = World()
    world.rig()
    world.add(MergeRequestMerged(mr_id="mr-unknown", merged_commit="def", target_before="abc"))
    assert world.state.base_merged == {}
