"""The pure parts of `gt status`, `gt feed` and `gt bead history`: parsing, filtering, telling events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from gt import narration as narrate
from gt.cli import main as cli_main
from gt.cli import render, town_view
from gt.cli.colour import Palette, wanted
from gt.cli.feed_view import Filters, Since, feed_line, parse_since, timeline
from gt.cli.main import build_parser
from gt.cli.merge_queue import mq_order
from gt.cli.rigs import park_line, unsling_line
from gt.story import merge_by_seq
from shared.core.arguments import from_args
from shared.model.commands import RigAdd, RigUpdate
from shared.model.events import REGISTRY
from shared.model.results import RigResult, SlingResult
from tests import records

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


def test_status_lists_the_gate_runners_the_deacon_knows_after_the_services() -> None:
    snap = town_view.snapshot(
        now=NOW,
        stream_last_seq=10,
        statuses={"runner-2": {"connected": True, "caught_up": True, "last_seq": 10, "role": "active"}},
        runners=["runner-2", "runner-10"],
        rigs=None, sessions=None, heartbeats={}, steps={}, mrs=None, convoys=None, escalations=None,
    )  # fmt: skip
    assert list(snap["services"]) == ["mayor", "witness", "refinery", "deacon", "runner-2", "runner-10"]
    assert snap["services"]["runner-2"]["state"] == "healthy"
    assert snap["services"]["runner-10"]["state"] == "not answering", "known to the deacon, silent now"
    rows = [line.split() for line in town_view.render(snap).splitlines() if line.startswith("  runner-")]
    assert [row[:2] for row in rows] == [["runner-2", "healthy"], ["runner-10", "not"]]


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    assert wanted("auto", Tty(), {}) is True  # type: ignore[arg-type]
    assert wanted("auto", Tty(), {"NO_COLOR": "1"}) is False  # type: ignore[arg-type]
    assert Palette(False)("x", "red") == "x"
    assert Palette(True)("x", "red") == "\x1b[31mx\x1b[0m"
    assert town_view.progress_bar(3, 3, Palette(True)).startswith("[\x1b[32m####")


def test_the_rig_filter_follows_a_beads_sling_to_its_steps_and_close() -> None:
    story = [
        E(1, "bead.slung", {"bead_id": "b1", "rig": "six"}),
        E(2, "bead.slung", {"bead_id": "b2", "rig": "other"}),
        E(3, "step.done", {"bead_id": "b1", "step": "implement"}),
        E(4, "step.done", {"bead_id": "b2", "step": "implement"}),
        E(5, "molecule.completed", {"bead_id": "b1"}),
        E(6, "bead.closed", {"bead_id": "b1", "reason": "merged"}),
        E(7, "bead.closed", {"bead_id": "b2"}),
    ]
    six = Filters(rigs={"six"})
    assert [e.seq for e in story if six.matches(e)] == [1, 3, 5, 6]
    seeded = Filters(rigs={"six"})  # slung before --since: the services said which rig its session was on
    seeded.remember("b1-1", "six", "b1")
    assert [e.seq for e in story[2:] if seeded.matches(e)] == [3, 5, 6]
    assert not seeded.matches(E(0, "bead.created", {"bead_id": "b1"})), "a bead is a rig's once slung"


def test_a_timeline_shows_under_a_warrant_the_last_lines_its_pane_showed() -> None:
    tail = "\n".join(f"line {n}" for n in range(1, 9)) + "\n[gt-agent] giving up: tests fail (2): no rule\x1b[0m\n"
    entries = [
        E(
            1,
            "session.warranted",
            {"session_id": "s1", "reason": "zombie", "detail": "its agent is not", "pane_tail": tail},
        ),
        E(2, "session.ended", {"session_id": "s1", "reason": "zombie"}),
    ]
    lines = timeline(entries).splitlines()
    assert "session s1 WARRANTED: zombie (its agent is not)" in lines[0]
    shown = [line.strip() for line in lines[1:-1]]
    assert shown == [
        "| line 5",
        "| line 6",
        "| line 7",
        "| line 8",
        "| [gt-agent] giving up: tests fail (2): no rule\\x1b[0m",  # shown escaped, never emitted
    ]
    assert lines[1].index("|") == lines[0].index("session s1"), "under the sentence"
    assert "session s1 ended: zombie" in lines[-1]
    assert narrate.excerpt("session.warranted", {"session_id": "s1"}) == []


def test_a_rig_added_with_the_default_number_of_polecats_says_how_many() -> None:
    assert narrate.describe("rig.added", {"rig": "six", "repo": "/srv/six.git"})[0] == (
        "rig six added: /srv/six.git, at most 4 polecats"
    )
    assert "at most 2 polecats" in narrate.describe("rig.added", {"rig": "six", "repo": "/r", "max_polecats": 2})[0]


def test_session_show_says_how_it_ended_and_what_its_pane_showed() -> None:
    text = render.session_detail(
        records.session(
            id="b1-2",
            rig="six",
            polecat="ace",
            bead="b1",
            status="ended",
            end_reason="zombie",
            attempt=2,
            warrant_reason="zombie",
            warrant_detail="tmux session gt-six-ace is there but its agent (pid 7) is not",
            end_detail="killed after warrant",
            escalated="respawn_limit",
            pane_tail="[gt-agent] step 5 run-tests\n[gt-agent] giving up: tests fail (2): make: *** No rule",
            started_at=None,
        )
    )
    assert "end_reason: zombie" in text
    assert "warranted: zombie (tmux session gt-six-ace is there but its agent (pid 7) is not)" in text
    assert "end_detail: killed after warrant" in text
    assert "escalated: respawn_limit" in text
    assert text.endswith(
        "its pane's last lines when it was warranted:\n"
        "  | [gt-agent] step 5 run-tests\n"
        "  | [gt-agent] giving up: tests fail (2): make: *** No rule"
    )
    assert "pane" not in render.session_detail(records.session(id="b1-1", status="started"))


def test_an_escalation_of_several_lines_goes_on_under_its_message_column() -> None:
    text = render.escalation_table(
        [
            records.escalation(
                id="esc-1", severity="high", status="open", source="witness/six", message="died\nwhy:\n  oops"
            ),
            records.escalation(id="esc-22", severity="low", status="acked", source="operator", message="one line"),
        ]
    )
    lines = text.splitlines()
    column = lines[0].index("MESSAGE")
    assert [line[column:] for line in lines[1:4]] == ["died", "why:", "  oops"]
    assert lines[4].startswith("esc-22")
    assert lines[4][column:] == "one line"
    assert set(lines[2][:column]) == {" "}
    closed = render.escalation_table(
        [
            records.escalation(
                id="esc-3",
                status="closed",
                source="refinery/six",
                message="not merged",
                closed_by="mayor",
                close_reason="resolved: merge request mr-1 merged",
            )
        ]
    ).splitlines()
    column = closed[0].index("MESSAGE")
    assert [line[column:] for line in closed[1:]] == [
        "not merged",
        "closed by mayor: resolved: merge request mr-1 merged",
    ]


def test_rig_show_shows_the_default_git_identity_in_force() -> None:
    text = render.rig_detail(records.rig(name="six", git_name="", git_email="", test_command="make test"))
    assert "git_name: {rig}/{polecat} (default)" in text.splitlines()
    assert "git_email: {polecat}.{rig}@gastown.invalid (default)" in text.splitlines()
    assert "git_name: bot {polecat}" in render.rig_detail(records.rig(git_name="bot {polecat}"))


def test_rig_show_shows_gate_pristine() -> None:
    assert "gate_pristine: False" in render.rig_detail(records.rig()).splitlines()
    assert "gate_pristine: True" in render.rig_detail(records.rig(gate_pristine=True)).splitlines()


def test_rig_add_gate_pristine_is_a_flag() -> None:
    parser = build_parser()
    fresh = parser.parse_args(["rig", "add", "demo", "/r.git", "--gate-pristine"])
    assert from_args(RigAdd, fresh).gate_pristine is True
    kept = parser.parse_args(["rig", "add", "demo", "/r.git"])
    assert from_args(RigAdd, kept).gate_pristine is False


@pytest.mark.parametrize(("text", "value"), [("yes", True), ("no", False), ("true", True), ("False", False)])
def test_rig_update_gate_pristine_takes_yes_or_no(text: str, value: bool) -> None:
    args = build_parser().parse_args(["rig", "update", "demo", "--gate-pristine", text])
    assert from_args(RigUpdate, args) == RigUpdate(name="demo", gate_pristine=value)


def test_rig_update_leaves_gate_pristine_out_unless_given() -> None:
    args = build_parser().parse_args(["rig", "update", "demo", "--max-polecats", "2"])
    assert from_args(RigUpdate, args).gate_pristine is None


def test_rig_update_refuses_a_gate_pristine_that_is_not_yes_or_no(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["rig", "update", "demo", "--gate-pristine", "maybe"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "argument --gate-pristine: 'maybe' is not yes or no (yes, no, true or false)" in error
    assert "--gate-pristine yes|no" in error, "the usage names the values it takes"


def test_the_merge_queue_is_listed_in_the_order_it_was_submitted() -> None:
    mrs = [
        records.merge_request(id="mr-zz", submitted_at="2026-11-23T12:00:02Z"),
        records.merge_request(id="mr-aa", submitted_at="2026-11-23T12:00:03.5Z"),
        records.merge_request(id="mr-mm", submitted_at="2026-11-23T12:00:03Z"),
        records.merge_request(id="mr-bb", submitted_at="2026-11-23T12:00:01.250000Z"),
    ]
    assert [m.id for m in mq_order(mrs)] == ["mr-bb", "mr-zz", "mr-mm", "mr-aa"]


def test_park_and_unsling_lines_read_as_sentences() -> None:
    assert park_line(RigResult(id="six", rig="six", status="active", waiting=1)) == (
        "rig six: active; the waiting bead gets a session now"
    )
    assert park_line(RigResult(id="six", rig="six", status="active", waiting=3)) == (
        "rig six: active; the 3 waiting beads get sessions now"
    )
    assert park_line(RigResult(id="six", rig="six", status="active", waiting=0)) == (
        "rig six: active; no bead is waiting"
    )
    assert park_line(RigResult(id="six", rig="six", status="parked", waiting=1)) == (
        "rig six: parked; no new sessions, 1 bead waiting"
    )
    result = SlingResult(id="b1", rig="six")
    assert unsling_line(result, None, remove_worktree=True) == (
        "b1: open (unslung from six; its done steps are kept); the witness removes its worktree unless it holds "
        "unsaved work"
    )
    assert unsling_line(result, "b1-1", remove_worktree=True) == (
        "b1: open (unslung from six; its done steps are kept); the witness ends session b1-1 and removes its "
        "worktree unless it holds unsaved work"
    )
    assert unsling_line(result, None, remove_worktree=False) == "b1: open (unslung from six; its done steps are kept)"


def test_actor_is_taken_before_the_command_too() -> None:
    parser = build_parser()
    before = parser.parse_args(["--actor", "mayor", "bead", "close", "b1"])
    cli_main._actor_first(parser, before)
    assert before.actor == "mayor"
    after = parser.parse_args(["bead", "close", "b1", "--actor", "operator:ann"])
    cli_main._actor_first(parser, after)
    assert after.actor == "operator:ann"
    for refused in (["--actor", "mayor", "bead", "list"], ["--actor", "a", "bead", "close", "b1", "--actor", "b"]):
        with pytest.raises(SystemExit) as exit_info:
            cli_main._actor_first(parser, parser.parse_args(refused))
        assert exit_info.value.code == 2


def test_status_shows_the_first_line_of_an_escalation_that_quotes_a_pane() -> None:
    escalation = {
        "id": "esc-1",
        "severity": "high",
        "status": "open",
        "bead": "b1",
        "raised_at": "2026-11-23T11:59:00+00:00",
        "message": "bead b1 died 4 times on rig six\nIts last session b1-4 showed:\n[gt-agent] giving up",
    }
    snap = town_view.snapshot(
        now=NOW,
        stream_last_seq=1,
        statuses={},
        rigs=None,
        sessions=None,
        heartbeats={},
        steps={},
        mrs=None,
        convoys=None,
        escalations=[escalation],
    )
    lines = town_view.render(snap).splitlines()
    [row] = [line for line in lines if "esc-1" in line]
    assert row.endswith("bead b1 died 4 times on rig six [more: gt escalations]")
    assert not [line for line in lines if "giving up" in line], "the rest is for gt escalations"


def test_status_hides_superseded_requests_and_removed_rigs_as_its_rigs_section_does() -> None:
    """Issue 39: the merge queue listed a conflicted request whose bead merged under a newer one, and the queue of
    a removed rig, while the Rigs section hid the rig."""
    mrs = [
        {"id": "mr-old", "rig": "toolz", "bead": "hq-1", "status": "conflicted", "submitted_at": "2026-11-29T00:01"},
        {"id": "mr-new", "rig": "toolz", "bead": "hq-1", "status": "merged", "submitted_at": "2026-11-29T00:05"},
        {"id": "mr-q", "rig": "toolz", "bead": "hq-2", "status": "queued", "submitted_at": "2026-11-29T00:06"},
        {"id": "mr-gone", "rig": "escr", "bead": "hq-3", "status": "merged", "submitted_at": "2026-11-29T00:02"},
    ]
    toolz = {"name": "toolz", "max_polecats": 4}
    removed = {"name": "escr", "max_polecats": 4, "parked": True, "removed": True}

    def snap(rigs: list[dict[str, Any]], *, show_all: bool) -> dict[str, Any]:
        return town_view.snapshot(
            now=NOW, stream_last_seq=1, statuses={}, rigs=rigs, sessions=[], heartbeats={}, steps={}, mrs=mrs,
            convoys=[], escalations=[], show_all=show_all,
        )  # fmt: skip

    shown = snap([toolz], show_all=False)
    assert list(shown["merge_queue"]) == ["toolz"]
    assert shown["merge_queue"]["toolz"]["counts"] == {"merged": 1, "queued": 1}
    assert [m["id"] for m in shown["merge_queue"]["toolz"]["open"]] == ["mr-q"]
    text = town_view.render(shown)
    assert "mr-old" not in text, text
    assert "escr" not in text, text
    everything = snap([toolz, removed], show_all=True)
    assert list(everything["merge_queue"]) == ["escr", "toolz"]
    assert everything["merge_queue"]["toolz"]["counts"] == {"conflicted": 1, "merged": 1, "queued": 1}
    text = town_view.render(everything)
    assert "mr-old  conflicted  hq-1 (superseded by mr-new)" in text, text
    assert "escr (removed)" in text, text
    assert "escr: 1 merged" in text, text


def test_a_long_clean_up_detail_is_cut_in_the_middle_keeping_what_came_of_it() -> None:
    """Found by CI: a deep worktree path pushed "; it is kept" out of `gt bead history`."""
    path = "/tmp/pytest-of-root/pytest-447/popen-gw0/test_unsling_ends_the_live_ses0/home/rigs/demo/polecats/ace"
    detail = f"worktree {path} has uncommitted changes and 1 unpushed commits; it is kept"
    sentence, _ = narrate.describe("session.cleaned", {"session_id": "hq-1-2", "detail": detail})
    assert sentence.startswith("session hq-1-2 cleaned up: worktree /tmp/")
    assert sentence.endswith("has uncommitted changes and 1 unpushed commits; it is kept")
    assert "…" in sentence
    assert len(sentence) <= len("session hq-1-2 cleaned up: ") + 160
