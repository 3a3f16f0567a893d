"""``GT_TOWN_PATIENCE``: how long a `gt` call waits for a town that does not answer (gt/cli/patience.py)."""

from __future__ import annotations

import pytest

from gt.cli.patience import DEFAULT_SESSION_PATIENCE_S, TownWait, town_patience
from shared.model.runtimes import HOOK_MARGIN_S, ClaudeRuntime


@pytest.mark.parametrize(
    ("env", "seconds"),
    [
        ({}, 0.0),  # an operator is told at once
        ({"GT_SESSION": "hq-1-1"}, DEFAULT_SESSION_PATIENCE_S),  # an agent waits out a restart
        ({"GT_SESSION": "hq-1-1", "GT_TOWN_PATIENCE": "3600"}, 3600.0),
        ({"GT_TOWN_PATIENCE": " 2.5 "}, 2.5),
        ({"GT_SESSION": "hq-1-1", "GT_TOWN_PATIENCE": "0"}, 0.0),
    ],
)
def test_the_patience_of_a_call(env: dict[str, str], seconds: float) -> None:
    assert town_patience(env) == seconds


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_patience_that_is_no_number_of_seconds_is_said(text: str) -> None:
    with pytest.raises(ValueError, match="GT_TOWN_PATIENCE must be a number of seconds"):
        town_patience({"GT_TOWN_PATIENCE": text})


def test_a_session_waits_less_than_claude_codes_bash_tool_and_its_stop_hook_outwaits_it() -> None:
    bash_tool_timeout_s = 120  # Claude Code's default BASH_DEFAULT_TIMEOUT_MS
    assert bash_tool_timeout_s > DEFAULT_SESSION_PATIENCE_S + 10
    stop = ClaudeRuntime().settings_local("/usr/bin/gt")["hooks"]["Stop"][0]["hooks"][0]
    assert stop["timeout"] == DEFAULT_SESSION_PATIENCE_S + HOOK_MARGIN_S


def test_a_wait_is_said_once_and_so_is_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    wait = TownWait(90)
    wait.answered()  # no wait: nothing said
    assert wait.gave_up() is None
    wait.waiting("NATS is unreachable at nats://127.0.0.1:4222: no server answered")
    wait.waiting("NATS is unreachable at nats://127.0.0.1:4222: no server answered")
    gave_up = wait.gave_up()
    assert gave_up is not None
    assert "the same command is safe to run again" in gave_up
    wait.answered()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "gt: the town does not answer (NATS is unreachable at nats://127.0.0.1:4222: no server answered); "
        "waiting up to 90 s for it (GT_TOWN_PATIENCE)"
    )
    assert lines[1].startswith("gt: the town answers again after ")
    assert len(lines) == 2
