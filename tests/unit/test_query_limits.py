"""A session's queries within its limit are answered; past it refused, far past it dropped; each session on its own;
the settings read from the environment. Pure: times are arguments."""

from __future__ import annotations

import pytest

from shared.service.intake.rate_limit import Limit
from shared.service.query_limits import ANSWER, DROP, QUERIES, QueryLimiter, load


def test_a_burst_is_answered_then_refused_then_dropped_and_time_refills_it() -> None:
    limiter = QueryLimiter(Limit(rate=10, burst=5))
    assert [limiter.check("s-1", 0.0) for _ in range(5)] == [ANSWER] * 5
    refused = [limiter.check("s-1", 0.0) for _ in range(5)]
    assert all(not v.answer and not v.drop for v in refused)
    assert "GT_RATE_AGENT_QUERIES" in refused[0].message
    assert "ask again in 0.10 s" in refused[0].message
    assert [limiter.check("s-1", 0.0) for _ in range(3)] == [DROP] * 3
    assert limiter.dropped == 3
    assert limiter.check("s-2", 0.0) == ANSWER, "another session has its own"
    assert limiter.check("s-1", 0.1) == ANSWER, "a tenth of a second later: one more"
    refusal = limiter.check("s-1", 0.1)  # none left to answer; the refusals refilled by one meanwhile
    assert not refusal.answer
    assert not refusal.drop
    assert "3 more of its queries were dropped" in refusal.message


def test_a_flood_costs_at_most_its_bursts_and_rate_in_answers() -> None:
    limiter = QueryLimiter(Limit(rate=50, burst=500))
    verdicts = [limiter.check("s-1", n / 100_000) for n in range(200_000)]  # 200,000 in two seconds
    answered = sum(v.answer for v in verdicts)
    refused = sum(not v.answer and not v.drop for v in verdicts)
    assert answered <= 500 + 50 * 2 + 1
    assert refused <= 500 + 50 * 2 + 1
    assert limiter.dropped == 200_000 - answered - refused


def test_no_limit_answers_everything() -> None:
    limiter = QueryLimiter(Limit(rate=0, burst=0))
    assert {limiter.check("s-1", 0.0) for _ in range(10_000)} == {ANSWER}


def test_settings_from_the_environment() -> None:
    assert load({}) == QUERIES
    assert load({"GT_RATE_AGENT_QUERIES": "5", "GT_RATE_AGENT_QUERIES_BURST": "20"}) == Limit(rate=5, burst=20)
    assert load({"GT_RATE_AGENT_QUERIES": "0"}).unlimited
    with pytest.raises(ValueError, match="GT_RATE_AGENT_QUERIES"):
        load({"GT_RATE_AGENT_QUERIES": "many"})
