"""Which prefixes of a stack are gated next (``plan.speculation``): bisection with one gate at a time, speculation
with several, and that every search ends at the culprit, checked against every stack up to 12 and every width."""

from __future__ import annotations

import pytest

from services.refinery.plan import speculation


def search(n: int, width: int, culprit: int | None) -> tuple[int, int | None, list[list[int]]]:
    """Run the search on a stack of ``n`` whose prefixes are red from ``culprit`` on; (lo, hi, rounds)."""
    lo, hi, rounds = 0, None, []
    while gated := speculation.next_prefixes(lo, hi, n, width):
        rounds.append(gated)
        reds = [i for i, p in enumerate(gated) if culprit is not None and p >= culprit]
        lo, hi = speculation.narrowed(lo, hi, gated, reds[0] if reds else None)
    return lo, hi, rounds


def test_one_gate_at_a_time_gates_the_tip_then_bisects() -> None:
    assert speculation.next_prefixes(0, None, 8, 1) == [8]
    assert speculation.next_prefixes(0, 8, 8, 1) == [4]
    assert speculation.next_prefixes(4, 8, 8, 1) == [6]
    assert speculation.next_prefixes(6, 7, 8, 1) == []


def test_as_many_gates_as_merge_requests_gate_every_prefix_at_once() -> None:
    assert speculation.next_prefixes(0, None, 4, 4) == [1, 2, 3, 4]
    assert speculation.next_prefixes(0, None, 3, 8) == [1, 2, 3]
    assert search(4, 4, culprit=2) == (1, 2, [[1, 2, 3, 4]])
    assert search(4, 4, culprit=None) == (4, None, [[1, 2, 3, 4]])


def test_four_gates_on_sixteen_cut_the_stack_then_the_red_part() -> None:
    assert speculation.next_prefixes(0, None, 16, 4) == [4, 8, 12, 16]
    assert speculation.next_prefixes(4, 8, 16, 4) == [5, 6, 7]
    assert search(16, 4, culprit=7) == (6, 7, [[4, 8, 12, 16], [5, 6, 7]])


@pytest.mark.parametrize("width", [1, 2, 3, 4, 7, 16])
def test_every_search_ends_next_to_the_culprit_and_gates_nothing_twice(width: int) -> None:
    for n in range(1, 13):
        for culprit in [None, *range(1, n + 1)]:
            lo, hi, rounds = search(n, width, culprit)
            if culprit is None:
                assert (lo, hi) == (n, None)
            else:
                assert (lo, hi) == (culprit - 1, culprit)
            gated = [p for r in rounds for p in r]
            assert len(gated) == len(set(gated)), (n, width, culprit, rounds)
            assert all(1 <= len(r) <= width for r in rounds)
