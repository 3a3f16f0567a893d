"""The reference agent's long commands: how often it heartbeats while one runs, and how long one may run."""

from __future__ import annotations

import pytest

from gt.agent_command import MIN_BEAT_S, beat_every
from gt.agent_start import DEFAULT_COMMAND_TIMEOUT_S, command_timeout


@pytest.mark.parametrize(
    ("stall_after", "lease_ttl", "every"),
    [
        (600.0, "", 150.0),  # the stall limit alone: a quarter of it
        (600.0, "600", 150.0),
        (600.0, "8", 2.0),  # a hook lease shorter than the stall limit (GT_HOOK_LEASE_TTL): a quarter of it
        (8.0, "600", 2.0),
        (2.0, "", MIN_BEAT_S),  # never more than one `gt heartbeat` process a second
        (60.0, "soon", 15.0),  # a TTL that is no number: the stall limit alone
        (60.0, "0", 15.0),
    ],
)
def test_heartbeats_come_four_times_within_the_shorter_of_the_stall_limit_and_the_lease(
    stall_after: float, lease_ttl: str, every: float
) -> None:
    env = {"GT_LEASE_TTL": lease_ttl} if lease_ttl else {}
    assert beat_every(stall_after, env) == every


def test_a_rig_without_a_stall_limit_is_taken_at_the_default() -> None:
    assert beat_every(None, {}) == 150.0


@pytest.mark.parametrize(("text", "seconds"), [("", DEFAULT_COMMAND_TIMEOUT_S), ("90", 90.0), (" 2.5 ", 2.5)])
def test_the_command_limit_is_read_in_seconds(monkeypatch: pytest.MonkeyPatch, text: str, seconds: float) -> None:
    monkeypatch.setenv("GT_AGENT_COMMAND_TIMEOUT", text)
    assert command_timeout() == seconds


@pytest.mark.parametrize("text", ["soon", "0", "-1", "nan"])
def test_a_command_limit_that_is_no_positive_number_of_seconds_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv("GT_AGENT_COMMAND_TIMEOUT", text)
    with pytest.raises(ValueError, match="GT_AGENT_COMMAND_TIMEOUT must be a number of seconds \\(more than 0\\)"):
        command_timeout()
