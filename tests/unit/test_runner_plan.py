"""The gate runner's decisions (``services.runner.plan``) and the gate job fold both services share
(``shared.model.gate_jobs``): pure, fixed times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec

from services.runner import plan
from services.runner.state import RunnerState
from shared.model.events import (
    Envelope,
    GateJobCancelled,
    GateJobFinished,
    GateJobHeartbeat,
    GateJobRequested,
    GateJobStarted,
)
from shared.model.events.gate_jobs import GateCommand, GateJobEvent, GateResult
from shared.model.gate_jobs import KEEP_FINISHED, fold_gate_job

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Log:
    """A gate job log folded as the services fold it, one sequence per event."""

    def __init__(self) -> None:
        self.state = RunnerState()
        self.seq = 0

    def add(self, payload: GateJobEvent, at: datetime = T0) -> None:
        self.seq += 1
        env = Envelope(id=f"e{self.seq}", type=payload.TYPE, ts=at, actor="t", data=msgspec.Raw(b"{}"))
        fold_gate_job(payload, self.state.jobs, env, self.seq)

    def request(self, job_id: str, at: datetime = T0) -> None:
        self.add(
            GateJobRequested(
                job_id=job_id,
                rig="demo",
                repo="/r",
                target="main",
                base="b",
                commit="c",
                ref=f"refs/gt/gate/{job_id}",
                stack=["mr-1"],
                key=f"k-{job_id}",
                gates=[GateCommand(gate="test", command="true")],
                timeout_s=60,
                requester="refinery-1",
            ),
            at,
        )


def test_the_oldest_job_nobody_runs_goes_first() -> None:
    log = Log()
    log.request("g1")
    log.request("g2")
    job = plan.next_job(log.state, T0, "runner-a", 30, frozenset())
    assert job is not None
    assert job.id == "g1"
    taken = plan.take(job, "runner-a")
    assert taken.expected_seq == job.version, "taken against its last event: of two runners one gets it"
    assert isinstance(taken.payload, GateJobStarted)
    log.add(taken.payload)
    job = plan.next_job(log.state, T0, "runner-b", 30, frozenset())
    assert job is not None
    assert job.id == "g2"


def test_a_job_whose_runner_went_quiet_is_taken_again_once_stale() -> None:
    log = Log()
    log.request("g1")
    log.add(GateJobStarted(job_id="g1", runner="runner-a", attempt=1))
    log.add(GateJobHeartbeat(job_id="g1", runner="runner-a", attempt=1, gate="test"), T0 + timedelta(seconds=10))
    assert log.state.jobs["g1"].gate == "test"
    assert plan.next_job(log.state, T0 + timedelta(seconds=39), "runner-b", 30, frozenset()) is None
    assert plan.stale_at(log.state, 30, frozenset()) == T0 + timedelta(seconds=40)
    job = plan.next_job(log.state, T0 + timedelta(seconds=40), "runner-b", 30, frozenset())
    assert job is not None
    assert plan.take(job, "runner-b").payload == GateJobStarted(job_id="g1", runner="runner-b", attempt=2)


def test_a_runner_restarted_under_its_name_takes_its_own_job_again_at_once() -> None:
    log = Log()
    log.request("g1")
    log.add(GateJobStarted(job_id="g1", runner="runner-a", attempt=1))
    assert plan.next_job(log.state, T0, "runner-a", 30, frozenset({"g1"})) is None, "it runs it"
    job = plan.next_job(log.state, T0, "runner-a", 30, frozenset())
    assert job is not None, "recorded as its own, not run by it: it was restarted"


def test_a_runner_that_lost_its_job_owns_it_no_more_and_a_late_heartbeat_changes_nothing() -> None:
    log = Log()
    log.request("g1")
    log.add(GateJobStarted(job_id="g1", runner="runner-a", attempt=1))
    log.add(GateJobStarted(job_id="g1", runner="runner-b", attempt=2), T0 + timedelta(seconds=40))
    job = log.state.jobs["g1"]
    assert not plan.owns(job, "runner-a", 1)
    assert plan.owns(job, "runner-b", 2)
    log.add(GateJobHeartbeat(job_id="g1", runner="runner-a", attempt=1, gate="lint"), T0 + timedelta(seconds=50))
    assert job.heartbeat_at == T0 + timedelta(seconds=40)
    assert job.gate == ""


def test_a_finished_or_cancelled_job_stays_so() -> None:
    log = Log()
    log.request("g1")
    log.request("g2")
    log.add(GateJobStarted(job_id="g1", runner="runner-a", attempt=1))
    failed = GateResult(gate="test", exit_code=1, seconds=1.0, tail="no", log_path="/l")
    finished = plan.finished(log.state.jobs["g1"], "runner-a", [failed], "")
    assert isinstance(finished.payload, GateJobFinished)
    assert not finished.payload.passed
    log.add(finished.payload)
    log.add(GateJobStarted(job_id="g1", runner="runner-b", attempt=2))
    assert log.state.jobs["g1"].status == "finished"
    assert log.state.jobs["g1"].failure == failed
    log.add(GateJobCancelled(job_id="g2", reason="its batch is done"))
    assert plan.next_job(log.state, T0 + timedelta(hours=1), "runner-a", 30, frozenset()) is None


def test_an_error_is_no_pass() -> None:
    log = Log()
    log.request("g1")
    log.add(GateJobStarted(job_id="g1", runner="runner-a", attempt=1))
    finished = plan.finished(log.state.jobs["g1"], "runner-a", [], "could not fetch")
    assert isinstance(finished.payload, GateJobFinished)
    assert (finished.payload.passed, finished.payload.error) == (False, "could not fetch")


def test_the_fold_keeps_the_newest_ended_jobs_only() -> None:
    log = Log()
    for n in range(KEEP_FINISHED + 5):
        log.request(f"g{n}")
        log.add(GateJobCancelled(job_id=f"g{n}", reason="done"))
    log.request("open")
    assert len(log.state.jobs) == KEEP_FINISHED + 1
    assert "g0" not in log.state.jobs
    assert f"g{KEEP_FINISHED + 4}" in log.state.jobs
    assert log.state.jobs["open"].status == "requested"
