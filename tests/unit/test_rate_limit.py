"""The intake's per-actor rate limits: token buckets over a clock the test moves."""

from __future__ import annotations

import pytest

from shared.model.commands.actors import actor_class
from shared.service.intake.rate_limit import ClassLimits, Limit, RateLimiter, RateSettings, load

AGENT = "polecat:demo/toast"
SMALL = RateSettings(
    agent=ClassLimits(commands=Limit(rate=2, burst=5), volume=Limit(rate=100, burst=1_000), max_command_bytes=500),
    operator=ClassLimits(commands=Limit(rate=10, burst=50)),
)


@pytest.mark.parametrize(
    ("actor", "cls"),
    [
        ("polecat:demo/toast", "agent"),
        ("plugin:archiver", "agent"),
        ("mayor", "service"),
        ("witness", "service"),
        ("witness/demo", "service"),
        ("witness-east", "service"),
        ("refinery", "service"),
        ("deacon", "service"),
        ("supervisor", "operator"),  # gt up's supervisor sends on the plain subjects: an operator's label
        ("automation:nightly", "service"),
        ("operator", "operator"),
        ("operator:alice", "operator"),
        ("chaos", "operator"),
    ],
)
def test_actor_classes(actor: str, cls: str) -> None:
    assert actor_class(actor) == cls


def test_an_agent_gets_its_burst_then_its_rate() -> None:
    limiter = RateLimiter(SMALL)
    assert all(limiter.check(AGENT, 10, 0.0).admit for _ in range(5))
    refused = limiter.check(AGENT, 10, 0.0)
    assert (refused.admit, refused.drop, refused.code) == (False, False, "rate_limited")
    assert "send it again in 0.50 s" in refused.message
    assert limiter.check(AGENT, 10, 0.5).admit  # one token back after 1 / rate
    assert not limiter.check(AGENT, 10, 0.5).admit


def test_each_actor_has_its_own_bucket_and_services_none() -> None:
    limiter = RateLimiter(SMALL)
    for _ in range(5):
        limiter.check(AGENT, 10, 0.0)
    assert not limiter.check(AGENT, 10, 0.0).admit
    assert limiter.check("polecat:demo/other", 10, 0.0).admit
    assert all(limiter.check("mayor", 10_000, 0.0).admit for _ in range(10_000))


def test_refusals_are_bounded_too_and_the_next_recorded_one_counts_the_dropped() -> None:
    limiter = RateLimiter(SMALL)
    verdicts = [limiter.check(AGENT, 10, 0.0) for _ in range(1_000)]
    assert sum(v.admit for v in verdicts) == 5
    assert sum(not v.admit and not v.drop for v in verdicts) == 5  # recorded refusals: the same burst
    assert sum(v.drop for v in verdicts) == 990
    assert limiter.dropped == 990
    later = limiter.check(AGENT, 10, 0.25)  # half a token of commands, half a refusal: nothing
    assert later.drop
    recorded = limiter.check(AGENT, 10, 0.5)
    assert (recorded.admit, recorded.drop) == (True, False)  # a command token first
    refused = limiter.check(AGENT, 10, 0.5)  # no command token, one refusal token
    assert refused.code == "rate_limited"
    assert "991 more commands from polecat:demo/toast were dropped without an outcome" in refused.message


def test_volume_quota_counts_bytes() -> None:
    limiter = RateLimiter(SMALL)
    assert limiter.check(AGENT, 450, 0.0).admit
    assert limiter.check(AGENT, 450, 0.0).admit
    refused = limiter.check(AGENT, 450, 0.0)  # 100 bytes left of the burst
    assert refused.code == "rate_limited"
    assert "bytes/s" in refused.message
    assert limiter.check(AGENT, 450, 3.5).admit  # 350 bytes more
    never = RateLimiter(RateSettings(agent=ClassLimits(volume=Limit(rate=10, burst=100)))).check(AGENT, 101, 0.0)
    assert "is larger than the burst: send less" in never.message


def test_an_agents_command_has_a_smaller_size_limit() -> None:
    limiter = RateLimiter(SMALL)
    refused = limiter.check(AGENT, 501, 0.0)
    assert refused.code == "too_large"
    assert "GT_RATE_AGENT_MAX_COMMAND" in refused.message
    assert limiter.check("operator", 501, 0.0).admit


def test_settings_from_the_environment() -> None:
    default = load({})
    assert default == RateSettings()
    assert (default.agent.commands.rate, default.agent.commands.burst) == (20, 100)
    got = load({"GT_RATE_AGENT": "5", "GT_RATE_OPERATOR": "0", "GT_RATE_AGENT_MAX_COMMAND": "1000"})
    assert (got.agent.commands.rate, got.agent.commands.burst) == (5, 100)
    assert got.operator.commands.unlimited
    assert got.agent.max_command_bytes == 1000
    limiter = RateLimiter(got)
    assert all(limiter.check("operator", 10, 0.0).admit for _ in range(100_000))
    with pytest.raises(ValueError, match="GT_RATE_AGENT_BURST"):
        load({"GT_RATE_AGENT": "50", "GT_RATE_AGENT_BURST": "10"})
    with pytest.raises(ValueError, match="GT_RATE_AGENT"):
        load({"GT_RATE_AGENT": "fast"})


def test_many_actor_names_do_not_grow_memory_without_bound() -> None:
    limiter = RateLimiter(SMALL)
    for i in range(25_000):
        limiter.check(f"polecat:demo/p{i}", 10, float(i))  # each one idle long enough to be forgotten
    assert len(limiter._buckets) <= 10_000
