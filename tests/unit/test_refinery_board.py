"""The merge queue's board (``gt.q.refinery.board``, ``services.refinery.queries.board``): what the refinery's fold
keeps for it (merges by rig and minute, a batch's gate time once, the runners' finished jobs) and the figures
computed from it at fixed times: merges per hour, gate minutes per merge, each runner's life and job, the jobs
running and waiting with their stacks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from gt.cli import render
from gt.dashboard import view
from services.refinery import plan
from services.refinery import queries as refinery_queries
from services.refinery.projection import KEEP_RUNNERS, MERGE_HISTORY, new_projection
from services.refinery.queries import Live, merge_figures, runner_views
from services.refinery.state import MergeMinute, RefineryState, RunnerTally
from shared.core.errors import QueryError
from shared.model import events as ev
from shared.model.events.gate_jobs import GateCommand, GateResult
from shared.model.heartbeats import ServiceHeartbeat
from shared.model.queries import refinery
from tests.memory_log import Fed
from tests.unit.test_typed_answers import assert_reads_back

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(minutes: float = 0, seconds: float = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


class Town(Fed[RefineryState]):
    """The refinery's projection fed a rig, merge requests, their merges and gate jobs, at times the test gives."""

    def __init__(self) -> None:
        super().__init__(new_projection(), clock=T0)
        for rig in ("demo", "other"):
            self.add(ev.RigAdded(rig=rig, repo=f"/repos/{rig}.git", prefix=rig[:2], agent_command="gt-agent"))

    def submit(self, bead: str, rig: str = "demo") -> str:
        self.add(ev.BeadCreated(bead_id=bead, title=bead), ev.BeadSlung(bead_id=bead, rig=rig))
        mr = f"mr-{bead}"
        self.add(ev.MergeRequestSubmitted(mr_id=mr, bead=bead, rig=rig, branch=f"b/{bead}", target="main", head="1"))
        return mr

    def land(self, mrs: list[str], when: datetime, *, base: str, gate_seconds: float, gates_run: int = 3) -> None:
        """``mrs`` claimed as one batch and merged with one push, their ``mr.merged`` stored at ``when``."""
        for mr in mrs:
            self.add(ev.MergeRequestClaimed(mr_id=mr, attempt=1, holder="r", lease_until=when, batch=mrs), at=when)
        for mr in mrs:
            merged = ev.MergeRequestMerged(
                mr_id=mr, merged_commit=f"tip-{base}", target_before=base, gates_run=gates_run,
                gate_seconds=gate_seconds, batch=mrs if len(mrs) > 1 else [],
            )  # fmt: skip
            self.add(merged, at=when)

    def request(self, job: str, stack: list[str], when: datetime, rig: str = "demo") -> None:
        self.add(
            ev.GateJobRequested(
                job_id=job, rig=rig, repo=f"/repos/{rig}.git", target="main", base="t0", commit=f"c-{job}",
                ref=f"refs/gt/gate/{job}", stack=stack, key=f"k-{job}", gates=[GateCommand(gate="test", command="t")],
                timeout_s=60, requester="refinery-1",
            ),
            at=when,
        )  # fmt: skip

    def start(self, job: str, runner: str, when: datetime, attempt: int = 1) -> None:
        self.add(ev.GateJobStarted(job_id=job, runner=runner, attempt=attempt), at=when)

    def finish(self, job: str, runner: str, when: datetime, *, passed: bool = True, seconds: float = 30.0) -> None:
        result = GateResult(gate="test", exit_code=0 if passed else 1, seconds=seconds, tail="", log_path="/l")
        self.add(ev.GateJobFinished(job_id=job, runner=runner, attempt=1, passed=passed, results=[result]), at=when)


def beat(
    scope: str, ts: datetime, *, stopping: bool = False, standby: bool = False, instance: str = "1-a"
) -> ServiceHeartbeat:
    return ServiceHeartbeat(
        service=scope, instance=instance, pid=1, host="h1", started_at=T0, ts=ts, stopping=stopping, standby=standby
    )


# ---- the fold -------------------------------------------------------------------------------------------------------


def test_a_batch_counts_each_merge_request_and_its_gate_time_once() -> None:
    t = Town()
    batch = [t.submit(f"de-{n}") for n in range(1, 4)]
    t.land(batch, at(0, 10), base="t0", gate_seconds=90.0)
    single = t.submit("de-4")
    t.land([single], at(0, 40), base="tip-t0", gate_seconds=30.0)
    assert [(m.rig, m.minute, m.merged, m.batches, m.gate_seconds) for m in t.state.merges] == [
        ("demo", T0, 4, 2, 120.0)
    ]


def test_a_merge_recorded_twice_is_counted_once() -> None:
    t = Town()
    mr = t.submit("de-1")
    t.land([mr], at(1), base="t0", gate_seconds=12.0)
    t.add(ev.MergeRequestMerged(mr_id=mr, merged_commit="tip-t0", target_before="t0", gate_seconds=12.0), at=at(2))
    assert [(m.merged, m.batches, m.gate_seconds) for m in t.state.merges] == [(1, 1, 12.0)]


def test_merges_are_kept_by_rig_and_minute_and_leave_after_a_day_of_the_logs_time() -> None:
    t = Town()
    t.land([t.submit("de-1")], at(0, 5), base="t0", gate_seconds=10.0)
    t.land([t.submit("ot-1", rig="other")], at(0, 20), base="o0", gate_seconds=20.0)
    t.land([t.submit("de-2")], at(3), base="tip-t0", gate_seconds=30.0)
    assert [(m.rig, m.minute) for m in t.state.merges] == [("demo", at(0)), ("other", at(0)), ("demo", at(3))]
    later = T0 + MERGE_HISTORY + timedelta(minutes=1)
    t.land([t.submit("de-3")], later, base="tip-tip-t0", gate_seconds=40.0)
    assert [(m.rig, m.minute) for m in t.state.merges] == [("demo", at(3)), ("demo", later)]


def test_the_runners_finished_jobs_are_counted_once_each() -> None:
    t = Town()
    mr = t.submit("de-1")
    t.request("g1", [mr], at(0))
    t.start("g1", "runner-a", at(0, 1))
    t.finish("g1", "runner-a", at(1), seconds=42.5)
    t.finish("g1", "runner-a", at(2), seconds=42.5)  # a late second answer: the job is finished already
    t.request("g2", [mr], at(3))
    t.start("g2", "runner-b", at(3, 1))
    t.finish("g2", "runner-b", at(4), passed=False, seconds=7.0)
    assert t.state.runners == {
        "runner-a": RunnerTally(jobs_run=1, jobs_passed=1, gate_seconds=42.5, last_finished_at=at(1)),
        "runner-b": RunnerTally(jobs_run=1, jobs_passed=0, gate_seconds=7.0, last_finished_at=at(4)),
    }


def test_the_runners_counted_are_the_ones_that_finished_a_job_last() -> None:
    t = Town()
    for n in range(KEEP_RUNNERS + 1):
        t.request(f"g{n}", [], at(n))
        t.start(f"g{n}", f"runner-{n}", at(n))
        t.finish(f"g{n}", f"runner-{n}", at(n, 30))
    assert len(t.state.runners) == KEEP_RUNNERS
    assert "runner-0" not in t.state.runners
    assert f"runner-{KEEP_RUNNERS}" in t.state.runners


# ---- merges per hour, gate minutes per merge ------------------------------------------------------------------------


def minute(rig: str, when: datetime, merged: int, batches: int, gate_seconds: float) -> MergeMinute:
    return MergeMinute(rig=rig, minute=when, merged=merged, batches=batches, gate_seconds=gate_seconds)


def test_merges_per_hour_and_gate_minutes_per_merge_over_the_last_hour_and_day() -> None:
    now = T0 + timedelta(hours=30, seconds=20)
    minutes = [
        minute("demo", T0, 9, 1, 900.0),  # 30 h ago: in no window
        minute("demo", now - timedelta(hours=20), 4, 1, 240.0),
        minute("other", now - timedelta(hours=2), 2, 2, 60.0),
        minute("demo", now.replace(second=0) - timedelta(minutes=59), 3, 1, 180.0),  # the window's first minute
        minute("demo", now.replace(second=0), 1, 1, 120.0),  # the answer's own minute
    ]
    everything = merge_figures(minutes, now)
    assert everything.rig == ""
    hour, day = everything.last_hour, everything.last_day
    assert (hour.hours, hour.merged, hour.batches, hour.gate_seconds) == (1, 4, 2, 300.0)
    assert hour.per_hour == 4.0
    assert hour.gate_minutes_per_merge == 1.25  # 300 s / 60 / 4
    assert (day.hours, day.merged, day.batches, day.gate_seconds) == (24, 10, 5, 600.0)
    assert day.per_hour == round(10 / 24, 2)
    assert day.gate_minutes_per_merge == 1.0
    other = merge_figures(minutes, now, "other")
    assert (other.rig, other.last_hour.merged, other.last_day.merged) == ("other", 0, 2)
    assert other.last_hour.gate_minutes_per_merge is None, "nothing merged: no figure, not zero"
    assert other.last_day.gate_minutes_per_merge == 0.5


def test_a_minute_just_outside_the_hour_counts_in_the_day_only() -> None:
    now = T0 + timedelta(hours=3)
    figures = merge_figures([minute("demo", now - timedelta(minutes=60), 2, 1, 60.0)], now)
    assert (figures.last_hour.merged, figures.last_day.merged) == (0, 2)


# ---- runners and jobs -----------------------------------------------------------------------------------------------


def test_each_runner_shows_its_life_its_job_and_the_jobs_it_finished() -> None:
    t = Town()
    stack = [t.submit("de-1"), t.submit("de-2")]
    t.request("g-old", stack[:1], at(0))
    t.start("g-old", "runner-a", at(0, 1))
    t.finish("g-old", "runner-a", at(0, 31), seconds=30.0)
    t.request("g1", stack, at(1))
    t.start("g1", "runner-a", at(1, 5))
    t.add(ev.GateJobHeartbeat(job_id="g1", runner="runner-a", attempt=1, gate="test"), at=at(1, 30))
    t.request("g-gone", stack[:1], at(1))
    t.start("g-gone", "runner-x", at(1, 2))  # its runner's beats left the bucket long ago
    now = at(2)
    beats = [
        beat("runner-a", now - timedelta(seconds=1)),
        beat("runner-a", now - timedelta(minutes=5), instance="0-old"),  # a process before a restart
        beat("runner-b", now - timedelta(seconds=30)),  # quiet: down
        beat("runner-c", now - timedelta(seconds=40), stopping=True),  # said goodbye
        beat("runner-d", now - timedelta(seconds=1), standby=True),
        beat("witness", now),  # not a runner
    ]
    views = {v.name: v for v in runner_views(t.state.gate_jobs.values(), t.state.runners, beats, now, 3.0)}
    assert {n: (v.state, v.alive) for n, v in views.items()} == {
        "runner-a": ("up", True),
        "runner-b": ("down", False),
        "runner-c": ("stopped", False),
        "runner-d": ("standby", False),
        "runner-x": ("gone", False),
    }
    a = views["runner-a"]
    assert (a.instance, a.host, a.last_beat, a.beat_age_s) == ("1-a", "h1", now - timedelta(seconds=1), 1.0)
    assert (a.job, a.rig, a.gate, a.job_running_s) == ("g1", "demo", "test", 55.0)
    assert (a.jobs_run, a.jobs_passed, a.gate_seconds, a.last_finished_at) == (1, 1, 30.0, at(0, 31))
    assert views["runner-b"].beat_age_s == 30.0
    assert (views["runner-b"].job, views["runner-b"].jobs_run) == ("", 0)
    gone = views["runner-x"]
    assert (gone.job, gone.last_beat, gone.instance) == ("g-gone", None, "")


def test_jobs_running_and_waiting_show_their_stacks_their_runner_and_how_long() -> None:
    t = Town()
    first, second = t.submit("de-1"), t.submit("de-2")
    t.request("g1", [first], at(0))
    t.request("g2", [first, second, "mr-forgotten"], at(0, 1))
    t.request("g3", [], at(0, 2))  # the target's tip itself
    t.request("g9", [t.submit("ot-1", rig="other")], at(0, 3), rig="other")
    t.start("g1", "runner-a", at(0, 10))
    t.add(ev.GateJobHeartbeat(job_id="g1", runner="runner-a", attempt=1, gate="lint"), at=at(0, 40))
    t.request("g-done", [first], at(0))
    t.start("g-done", "runner-b", at(0, 1))
    t.add(ev.GateJobCancelled(job_id="g-done", reason="its batch is done"), at=at(0, 5))
    now = at(1)
    answer = refinery_queries.answer(t.state, refinery.Board(rig="demo"), now, plan.Policy(), Live(runners_used=2))
    typed = assert_reads_back(refinery.Board(rig="demo"), answer)
    assert isinstance(typed, refinery.MqBoard)
    assert typed.at == now
    assert typed.runners_used == 2
    (running,) = typed.running
    assert (running.id, running.status, running.runner, running.attempt, running.gate) == (
        "g1", "running", "runner-a", 1, "lint"
    )  # fmt: skip
    assert [(s.id, s.bead) for s in running.stack] == [("mr-de-1", "de-1")]
    assert (running.waited_s, running.running_s, running.quiet_s) == (10.0, 50.0, 20.0)
    assert [w.id for w in typed.waiting] == ["g2", "g3"], "oldest first, of the rig asked"
    g2, g3 = typed.waiting
    assert [(s.id, s.bead) for s in g2.stack] == [("mr-de-1", "de-1"), ("mr-de-2", "de-2"), ("mr-forgotten", "")]
    assert (g2.waited_s, g2.running_s, g2.runner) == (59.0, None, "")
    assert g3.stack == []
    every = refinery_queries.answer(t.state, refinery.Board(), now, plan.Policy())
    assert [w.id for w in every.waiting] == ["g2", "g3", "g9"]


def test_the_board_of_all_rigs_lists_each_rig_that_merged_today() -> None:
    t = Town()
    t.land([t.submit("de-1"), t.submit("de-2")], at(0), base="t0", gate_seconds=120.0)
    t.land([t.submit("ot-1", rig="other")], at(1), base="o0", gate_seconds=30.0)
    now = at(10)
    answer = refinery_queries.answer(t.state, refinery.Board(), now, plan.Policy())
    board = assert_reads_back(refinery.Board(), answer)
    assert (board.merges.rig, board.merges.last_hour.merged, board.merges.last_hour.gate_seconds) == ("", 3, 150.0)
    assert board.merges.last_hour.gate_minutes_per_merge == round(150 / 60 / 3, 3)
    assert [(f.rig, f.last_day.merged, f.last_day.gate_minutes_per_merge) for f in board.rigs] == [
        ("demo", 2, 1.0),
        ("other", 1, 0.5),
    ]
    one = refinery_queries.answer(t.state, refinery.Board(rig="other"), now, plan.Policy())
    assert (one.merges.rig, one.merges.last_hour.merged, one.rigs) == ("other", 1, [])


def test_a_board_of_a_rig_nobody_knows_is_refused_naming_it() -> None:
    t = Town()
    with pytest.raises(QueryError, match="no rig 'nosuch'") as refused:
        refinery_queries.answer(t.state, refinery.Board(rig="nosuch"), T0, plan.Policy())
    assert refused.value.code == "not_found"


# ---- what `gt mq runners`, `gt mq list` and the dashboard show of it ------------------------------------------------


def shown_board() -> refinery.MqBoard:
    """The board of a town with one runner at work on a stack of two, one down, one job waiting, and merges."""
    t = Town()
    stack = [t.submit("de-1"), t.submit("de-2")]
    t.request("g1", stack, at(0))
    t.start("g1", "runner-a", at(0, 5))
    t.add(ev.GateJobHeartbeat(job_id="g1", runner="runner-a", attempt=1, gate="test"), at=at(0, 30))
    t.request("g2", [], at(0, 10))
    t.land([t.submit("de-3"), t.submit("de-4")], at(1), base="t0", gate_seconds=150.0)
    now = at(3, 17)
    beats = [beat("runner-a", now - timedelta(seconds=1)), beat("runner-b", now - timedelta(minutes=2))]
    answer = refinery_queries.answer(t.state, refinery.Board(), now, plan.Policy(), Live(beats=beats, runners_used=2))
    board = assert_reads_back(refinery.Board(), answer)
    assert isinstance(board, refinery.MqBoard)
    return board


def test_gt_mq_runners_shows_each_runner_the_jobs_with_their_stacks_and_the_merge_figures() -> None:
    text = render.mq_board(shown_board())
    lines = text.splitlines()
    assert lines[0] == "gate runners (the refinery gates on 2 at once):"
    a = next(line for line in lines if line.startswith("runner-a"))
    assert a.split() == ["runner-a", "up", "h1", "1s", "ago", "g1", "(demo)", "test", "3m12s", "0", "(0", "passed)"]
    b = next(line for line in lines if line.startswith("runner-b"))
    assert b.split()[:5] == ["runner-b", "down", "h1", "2m00s", "ago"]
    running = lines[lines.index("gate jobs running:") + 2]
    assert running.split() == [
        "g1", "demo", "mr-de-1", "(de-1),", "mr-de-2", "(de-2)", "runner-a", "1", "test", "3m12s", "2m47s"
    ]  # fmt: skip
    waiting = lines[lines.index("gate jobs waiting for a runner:") + 2]
    assert waiting.split() == ["g2", "demo", "main", "itself", "3m07s"]
    merges = lines[lines.index("merges (gate minutes: the gates of the batches that merged, each batch's once):") + 2 :]
    assert [row.split() for row in merges] == [
        ["*", "last", "hour", "2", "2", "1", "2.50", "1.25"],
        ["*", "last", "24", "h", "2", "0.08", "1", "2.50", "1.25"],
        ["demo", "last", "hour", "2", "2", "1", "2.50", "1.25"],
        ["demo", "last", "24", "h", "2", "0.08", "1", "2.50", "1.25"],
    ]


def test_gt_mq_list_ends_with_the_boards_line() -> None:
    assert render.mq_summary(shown_board()) == (
        "runners: 1 of 2 up; gate jobs: 1 running, 1 waiting; merged: 2 in the last hour, 2 in 24 h (0.08/h over 24 h, "
        "1.25 gate min per merge) (`gt mq runners` for more)"
    )


def test_the_dashboard_carries_the_board_as_the_refinery_answered_or_why_not() -> None:
    board = shown_board()
    shown = view.render(view.DashboardState(), board)
    assert shown["gates"] == {"board": msgspec.to_builtins(board), "error": ""}
    gates = shown["gates"]["board"]
    assert [r["name"] for r in gates["runners"]] == ["runner-a", "runner-b"]
    assert [m["id"] for m in gates["running"][0]["stack"]] == ["mr-de-1", "mr-de-2"]
    missing = view.render(view.DashboardState(), None, "the refinery did not answer: unavailable")
    assert missing["gates"] == {"board": None, "error": "the refinery did not answer: unavailable"}
