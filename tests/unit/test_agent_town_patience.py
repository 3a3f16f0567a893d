"""``GT_AGENT_TOWN_PATIENCE``: how long gt-agent waits for a town that does not answer; a bad value is said."""

from __future__ import annotations

import pytest

from gt.agent_start import DEFAULT_TOWN_PATIENCE_S, town_patience


@pytest.mark.parametrize(("text", "seconds"), [("", DEFAULT_TOWN_PATIENCE_S), ("0", 0.0), ("90", 90.0), (" 2.5 ", 2.5)])
def test_the_patience_is_read_in_seconds(monkeypatch: pytest.MonkeyPatch, text: str, seconds: float) -> None:
    monkeypatch.setenv("GT_AGENT_TOWN_PATIENCE", text)
    assert town_patience() == seconds


@pytest.mark.parametrize("text", ["soon", "-1", "nan"])
def test_a_patience_that_is_no_number_of_seconds_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("GT_AGENT_TOWN_PATIENCE", text)
    with pytest.raises(ValueError, match="GT_AGENT_TOWN_PATIENCE"):
        town_patience()
