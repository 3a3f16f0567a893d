"""The pure parts of `gt status`, `gt feed` and `gt bead history`: parsing, filtering, telling events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from gt.cli import town_view
from gt.cli.colour import Palette, wanted
from gt.cli.feed_view import Filters, Since, feed_line, parse_since, timeline
from gt.story import merge_by_seq
from shared import narration as narrate
from shared.events import REGISTRY

NOW = datetime(2026, 11, 23, 12, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class E:
    seq: int
    type: str
    data: dict[str, Any] = field(default_factory=dict)
    actor: str = "tester"
    ts: str = "2026-11-23T12:00:00+00:00"


@pytest.mark.parametrize(
    ("text", "since"),
    [
        ("all", Since(everything=True)),
        ("#42", Since(seq=42)),
        ("seq:7", Since(seq=7)),
        ("10m", Since(time=NOW - timedelta(minutes=10))),
        ("1.5h", Since(time=NOW - timedelta(hours=1.5))),
        ("2d", Since(time=NOW - timedelta(days=2))),
        ("2026-11-23T10:00:00+00:00", Since(time=datetime(2026, 11, 23, 10, tzinfo=UTC))),
        ("2026-11-23T10:00:00Z", Since(time=datetime(2026, 11, 23, 10, tzinfo=UTC))),
    ],
)
def test_since_takes_sequences_durations_and_times(text: str, since: Since) -> None:
    assert parse_since(text, NOW) == since


@pytest.mark.parametrize("text", ["yesterday", "10x", "#", "2026-11-23T10:00:00", "-5m"])
def test_a_since_it_cannot_read_is_refused_naming_what_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match="--since"):
        parse_since(text, NOW)


def test_filters_follow_a_session_and_a_merge_request_to_their_bead_and_rig() -> None:
    f = Filters(beads={"b1"})
    story = [
        E(1, "bead.created", {"bead_id": "b1"}),
        E(2, "bead.created", {"bead_id": "b2"}),
        E(3, "session.requested", {"session_id": "s1", "bead": "b1", "rig": "r"}),
        E(4, "session.requested", {"session_id": "s2", "bead": "b2", "rig": "r"}),
        E(5, "session.started", {"session_id": "s1"}),
        E(6, "session.started", {"session_id": "s2"}),
        E(7, "mr.submitted", {"mr_id": "m1", "bead": "b1", "rig": "r"}),
        E(8, "mr.merged", {"mr_id": "m1"}),
        E(9, "cmd.accepted", {"command": "gt.cmd.bead.create"}),
    ]
    assert [e.seq for e in story if f.matches(e)] == [1, 3, 5, 7, 8]
    by_rig = Filters(rigs={"r"})
    assert [e.seq for e in story if by_rig.matches(e)] == [3, 4, 5, 6, 7, 8]


def test_filters_by_type_family_and_actor() -> None:
    f = Filters(types=["session", "mr.merged"], actors={"witness"})
    assert f.matches(E(1, "session.warranted", actor="witness"))
    assert f.matches(E(2, "mr.merged", actor="witness"))
    assert not f.matches(E(3, "sessions.odd", actor="witness"))
    assert not f.matches(E(4, "session.started", actor="mayor"))
    assert not f.matches(E(5, "mr.failed", actor="witness"))


def test_every_event_type_of_the_log_is_told_as_a_sentence() -> None:
    """A new event type must get a sentence here, or it shows as raw fields (still shown, never dropped)."""
    untold = sorted(t for t in REGISTRY.classes() if t not in narrate.DESCRIBERS)
    assert not untold, f"no sentence for {untold}"


@pytest.mark.parametrize("event_type", sorted(narrate.DESCRIBERS))
def test_a_sentence_never_fails_on_an_event_with_only_its_id(event_type: str) -> None:
    ids = {"bead_id": "b", "session_id": "s", "mr_id": "m", "convoy_id": "c", "escalation_id": "e", "rig": "r"}
    sentence, kind = narrate.describe(event_type, ids)
    assert sentence
    assert kind in narrate.KIND_STYLES


def test_an_unknown_event_is_told_by_its_fields() -> None:
    assert narrate.describe("comet.sighted", {"where": "north", "empty": ""}) == ("comet.sighted where=north", "info")


def test_a_timeline_shows_the_full_time_at_the_start_and_after_a_gap() -> None:
    at = "2026-11-23T12:00:{:02d}+00:00"
    entries = [
        E(1, "bead.created", {"bead_id": "b", "title": "t"}, ts=at.format(0)),
        E(2, "bead.slung", {"bead_id": "b", "rig": "r"}, ts=at.format(5)),
        E(3, "bead.closed", {"bead_id": "b"}, ts="2026-11-23T12:05:00+00:00"),
    ]
    lines = timeline(entries).splitlines()
    assert lines[0].startswith("2026-11-23 12:00:00")
    assert lines[1].startswith("           12:00:05")
    assert lines[2].startswith("2026-11-23 12:05:00")
    assert timeline([]) == "(no events)"


def test_a_long_actor_is_shown_in_full_and_widens_its_column() -> None:
    long = "polecat:a-rig-with-a-long-name/ace"
    entries = [E(1, "bead.created", {"bead_id": "b", "title": "t"}, actor="operator"), E(2, "step.done", actor=long)]
    lines = timeline(entries).splitlines()
    assert f"  {long}  " in lines[1]
    assert lines[0].index("bead b created") == lines[1].index(long) + len(long) + 2, "the sentences line up"
    line = feed_line(entries[1], width=len(long))
    assert f"  {long}  " in line
    assert f"  {long}  " in feed_line(entries[1]), "narrower than the actor: the column grows, the actor stays whole"


def test_entries_of_several_subjects_merge_in_log_order_once_each() -> None:
    merged = merge_by_seq([[E(3, "a"), E(1, "b")], [E(2, "c"), E(3, "a")]])
    assert [e.seq for e in merged] == [1, 2, 3]


def test_ages_read_like_a_clock() -> None:
    assert [town_view.human_age(s) for s in (None, 4, 192, 7500, 280000)] == ["-", "4s", "3m12s", "2h05m", "3d05h"]


def test_a_snapshot_keeps_every_part_a_service_answered_and_marks_the_rest_unknown() -> None:
    snap = town_view.snapshot(
        now=NOW,
        stream_last_seq=100,
        statuses={"mayor": {"connected": True, "caught_up": True, "last_seq": 97, "role": "active"}},
        rigs=None,
        sessions=None,
        heartbeats={},
        steps={},
        mrs=[
            {"id": "m1", "rig": "r", "bead": "b1", "status": "queued"},
            {"id": "m2", "rig": "r", "bead": "b2", "status": "merged"},
        ],
        convoys=[{"id": "c", "title": "T", "closed": 1, "total": 4}],
        escalations=[],
    )
    assert snap["services"]["mayor"] == {
        "state": "healthy",
        "role": "active",
        "last_seq": 97,
        "lag": 3,
        "applied": None,
        "uptime_s": None,
    }
    assert snap["services"]["witness"]["state"] == "not answering"
    assert snap["merge_queue"]["r"]["counts"] == {"merged": 1, "queued": 1}
    assert [m["id"] for m in snap["merge_queue"]["r"]["open"]] == ["m1"]
    text = town_view.render(snap)
    assert "(witness not answering: unknown)" in text
    assert "[#####...............] 1/4" in text
    assert "(none open)" in text
    msgspec.json.encode(snap)  # --json prints it as it is


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    assert wanted("auto", Tty(), {}) is True  # type: ignore[arg-type]
    assert wanted("auto", Tty(), {"NO_COLOR": "1"}) is False  # type: ignore[arg-type]
    assert Palette(False)("x", "red") == "x"
    assert Palette(True)("x", "red") == "\x1b[31mx\x1b[0m"
    assert town_view.progress_bar(3, 3, Palette(True)).startswith("[\x1b[32m####")
