"""The town chaos run's invariants (pure, over synthetic logs) and its agents' fault draw."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.chaos import chaos_agent
from tests.chaos.invariants import Logged, check_all, gate_jobs_answered_once

STEPS = ["a", "b"]


class LogBuilder:
    def __init__(self) -> None:
        self.events: list[Logged] = []

    def add(self, kind: str, **data: Any) -> LogBuilder:
        seq = len(self.events) + 1
        self.events.append(Logged(seq=seq, type=kind, subject=f"gt.evt.x.{seq}", data=data))
        return self

    def bead_done(self, bead: str, session: str = "", mr: str = "") -> LogBuilder:
        """A bead's whole healthy life: created, slung, one session, its steps, merged, closed."""
        session = session or f"{bead}-1"
        mr = mr or f"mr-{bead}"
        self.add("bead.created", bead_id=bead, title=bead)
        self.add("bead.slung", bead_id=bead, rig="r")
        self.add("molecule.attached", bead_id=bead, steps=[{"id": s} for s in STEPS])
        self.add("session.requested", session_id=session, bead=bead, attempt=1)
        self.add("session.started", session_id=session)
        self.add("bead.claimed", bead_id=bead, assignee="r/p")
        for step in STEPS:
            self.add("step.started", bead_id=bead, step=step)
            self.add("step.done", bead_id=bead, step=step)
        self.add("molecule.completed", bead_id=bead)
        self.add("session.done_intent", session_id=session)
        self.add("mr.submitted", mr_id=mr, bead=bead)
        self.add("mr.claimed", mr_id=mr)
        self.add("mr.merged", mr_id=mr, already=False)
        self.add("bead.closed", bead_id=bead)
        self.add("session.ended", session_id=session)
        self.add("session.cleaned", session_id=session)
        return self

    def outcome(self, cmd: str, kind: str = "cmd.accepted") -> LogBuilder:
        return self.add(kind, command_id=cmd)


def violations(log: LogBuilder, beads: list[str], convoys: list[str] = [], commands: list[str] = []) -> list[str]:  # noqa: B006
    return [str(v) for v in check_all(log.events, beads, convoys, commands)]


def test_a_healthy_log_has_no_violation() -> None:
    log = LogBuilder().add("convoy.created", convoy_id="c1", beads=["b1", "b2"])
    log.bead_done("b1").bead_done("b2").add("convoy.closed", convoy_id="c1")
    log.outcome("k1").outcome("k2", "cmd.rejected")
    log.add("lease.acquired", lease="merge-r", token=1).add("lease.acquired", lease="merge-r", token=2)
    assert violations(log, ["b1", "b2"], ["c1"], ["k1", "k2"]) == []


def test_a_bead_never_closed_is_named_with_its_last_events() -> None:
    log = LogBuilder().bead_done("b1").add("bead.created", bead_id="b2", title="b2").add("bead.slung", bead_id="b2")
    found = violations(log, ["b1", "b2"])
    lost = [v for v in found if v.startswith("bead lost")]
    assert len(lost) == 1
    assert "b2: never closed" in lost[0]
    assert "bead.slung" in lost[0]


def test_a_bead_closed_twice_is_caught_as_a_double_close_and_a_backward_step() -> None:
    log = LogBuilder().bead_done("b1").add("bead.closed", bead_id="b1")
    found = violations(log, ["b1"])
    assert any(v.startswith("bead closed twice: b1") for v in found)
    assert any(v.startswith("backward transition: b1: changed after it was closed") for v in found)


def test_a_claim_after_a_close_is_backward_and_a_resling_is_not() -> None:
    log = LogBuilder().bead_done("b1")
    ok = LogBuilder().add("bead.created", bead_id="b2", title="b2").add("bead.slung", bead_id="b2")
    ok.add("bead.claimed", bead_id="b2", assignee="x").add("bead.slung", bead_id="b2", forced=True)
    assert not [v for v in violations(ok, []) if "backward" in v]
    log.add("bead.claimed", bead_id="b1", assignee="x")
    assert any("backward transition: b1" in v for v in violations(log, ["b1"]))


def test_a_done_step_started_or_done_again_is_named() -> None:
    log = LogBuilder().bead_done("b1").add("step.started", bead_id="b1", step="a")
    log.add("step.done", bead_id="b1", step="a")
    found = [v for v in violations(log, ["b1"]) if v.startswith("done step redone")]
    assert any("step a started again" in v for v in found)
    assert any("step a done 2 times" in v for v in found)


def test_a_step_never_done_is_named() -> None:
    log = LogBuilder().bead_done("b1")
    log.events = [e for e in log.events if not (e.type == "step.done" and e.data["step"] == "b")]
    assert any("steps never done: ['b']" in v for v in violations(log, ["b1"]))


def test_a_step_command_refused_as_out_of_order_is_named() -> None:
    """What the 1,000-bead run saw when a killed mayor's held `run-tests` was overtaken by `submit`."""
    log = LogBuilder().bead_done("b1")
    log.add("cmd.rejected", command_id="k9", command="step.done", code="invalid", message="step 'b' needs a done first")
    log.add("cmd.rejected", command_id="k10", command="step.done", code="not_found", message="no step 'z'")
    found = [v for v in violations(log, ["b1"]) if v.startswith("step command overtaken")]
    assert found == ["step command overtaken: k9: step.done refused: step 'b' needs a done first [#19 cmd.rejected]"]


def test_two_live_sessions_of_one_bead_are_named_with_both_events() -> None:
    log = LogBuilder().bead_done("b1")
    log.events.insert(
        5, Logged(seq=99, type="session.requested", subject="x", data={"session_id": "b1-2", "bead": "b1"})
    )
    found = [v for v in violations(log, ["b1"]) if v.startswith("two live sessions")]
    assert len(found) == 1
    assert "b1-2 requested while ['b1-1'] alive" in found[0]
    assert "#4 session.requested" in found[0]
    assert "#99 session.requested" in found[0]


def test_a_session_started_after_it_ended_is_backward() -> None:
    log = LogBuilder().bead_done("b1").add("session.started", session_id="b1-1")
    assert any("session b1-1: session.started after session.cleaned" in v for v in violations(log, ["b1"]))


def test_an_escalation_about_an_ended_session_is_not_backward() -> None:
    log = LogBuilder().bead_done("b1").add("session.hook_recovered", session_id="b1-1", bead="b1")
    log.add("session.escalated", session_id="b1-1", reason="stale_hook")
    assert not [v for v in violations(log, ["b1"]) if "backward" in v]


def test_a_change_merged_twice_or_never_is_named() -> None:
    twice = LogBuilder().bead_done("b1").add("mr.submitted", mr_id="mr-2", bead="b1")
    twice.add("mr.merged", mr_id="mr-2", already=False)
    assert any(v.startswith("merged once: b1: merged 2 times, pushed 2 times") for v in violations(twice, ["b1"]))
    never = LogBuilder().bead_done("b1")
    never.events = [e for e in never.events if e.type != "mr.merged"]
    assert any(v.startswith("merged once: b1: merged 0 times") for v in violations(never, ["b1"]))
    # Killed after its push, the refinery finds the change on the target when it is back: merged, not pushed again.
    after_crash = LogBuilder().bead_done("b1")
    after_crash.events = [
        Logged(seq=e.seq, type=e.type, subject=e.subject, data={**e.data, "already": True})
        if e.type == "mr.merged"
        else e
        for e in after_crash.events
    ]
    assert not [v for v in violations(after_crash, ["b1"]) if v.startswith("merged once")]
    already = LogBuilder().bead_done("b1").add("mr.submitted", mr_id="mr-2", bead="b1")
    already.add("mr.merged", mr_id="mr-2", already=True)
    assert not [v for v in violations(already, ["b1"]) if v.startswith("merged once")]


def test_an_event_after_a_merge_requests_end_is_backward() -> None:
    log = LogBuilder().bead_done("b1").add("mr.requeued", mr_id="mr-b1", reason="x")
    assert any("mr-b1: mr.requeued after mr.merged" in v for v in violations(log, ["b1"]))


def test_convoys_closed_never_or_twice_are_named() -> None:
    log = LogBuilder().add("convoy.created", convoy_id="c1").add("convoy.created", convoy_id="c2")
    log.add("convoy.closed", convoy_id="c1").add("convoy.closed", convoy_id="c1")
    found = violations(log, [], ["c1", "c2"])
    assert any(v.startswith("convoy closed once: c1: convoy.closed after it was closed") for v in found)
    assert any(v.startswith("convoy closed once: c2: never closed") for v in found)


def test_commands_with_two_outcomes_or_none_are_named() -> None:
    log = LogBuilder().outcome("k1").outcome("k1", "cmd.rejected")
    found = violations(log, [], [], ["k1", "k2"])
    assert any(v.startswith("one outcome per command: k1: 2 outcomes") for v in found)
    assert any(v.startswith("one outcome per command: k2: no outcome") for v in found)


def test_a_lease_token_that_goes_down_is_backward() -> None:
    log = LogBuilder().add("lease.acquired", lease="l", token=3).add("lease.acquired", lease="l", token=2)
    assert any(v.startswith("backward transition: l: token 2 after 3") for v in violations(log, []))


# ---- the agents' faults -----------------------------------------------------------------------------


def test_the_fault_draw_is_deterministic_and_clean_after_the_faulty_attempts() -> None:
    rates = chaos_agent.DEFAULT_RATES
    assert chaos_agent.faults_for(7, "b1", 1, rates) == chaos_agent.faults_for(7, "b1", 1, rates)
    assert all(chaos_agent.faults_for(7, f"b{i}", chaos_agent.FAULTY_ATTEMPTS + 1, rates) == "" for i in range(200))


def test_the_fault_draw_follows_the_rates() -> None:
    rates = {"crash": 0.2, "hang": 0.1, "dirty": 0.1, "fail-tests": 0.1}
    drawn = Counter(chaos_agent.faults_for(1, f"b{i}", 1, rates) != "" for i in range(4000))
    assert 0.45 < drawn[True] / 4000 < 0.55
    kinds = Counter(chaos_agent.faults_for(1, f"b{i}", 1, rates).split("@")[0].split("=")[0] for i in range(4000))
    assert set(kinds) == {
        "",
        "crash-at-step",
        "crash-after-done-intent",
        "hang",
        "crash-before-commit",
        "dirty",
        "fail-tests",
    }
    assert all(chaos_agent.faults_for(1, f"b{i}", 2, {}) == "" for i in range(100))


def test_every_drawn_fault_is_one_gt_agent_reads() -> None:
    from gt.agent_start import parse_faults

    for i in range(500):
        text = chaos_agent.faults_for(3, f"b{i}", 1 + i % 2, chaos_agent.DEFAULT_RATES)
        for fault in parse_faults(text):
            assert fault.first_attempt == 1 + i % 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("crash", "cannot read 'crash'"),
        ("boom=0.1", "cannot read 'boom=0.1'"),
        ("crash=x", "crash needs a number"),
        ("hang=1.5", "not between 0 and 1"),
        ("crash=0.6,hang=0.6", "add up to 1.2"),
    ],
)
def test_bad_rates_are_refused_with_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        chaos_agent.parse_rates(text)


def test_an_unsling_returns_a_hooked_bead_to_open_and_an_unsling_of_an_open_one_is_backward() -> None:
    log = LogBuilder().add("bead.created", bead_id="b1", title="b1").add("bead.slung", bead_id="b1", rig="r")
    log.add("bead.claimed", bead_id="b1", assignee="r/p").add("bead.unslung", bead_id="b1", rig="r")
    log.add("bead.slung", bead_id="b1", rig="r").add("bead.closed", bead_id="b1")
    assert not [v for v in violations(log, ["b1"]) if v.startswith("backward")]
    log = LogBuilder().add("bead.created", bead_id="b2", title="b2").add("bead.unslung", bead_id="b2", rig="r")
    assert any("backward transition: b2: unslung while open" in v for v in violations(log, ["b2"]))


def test_an_unsling_of_a_held_bead_gives_its_hold_back_and_is_not_backward() -> None:
    log = LogBuilder().add("bead.created", bead_id="b1", title="b1").add("bead.held", bead_id="b1", rig="r")
    log.add("bead.unslung", bead_id="b1", rig="r")
    assert not [v for v in violations(log, ["b1"]) if v.startswith("backward")]
    log.add("bead.unslung", bead_id="b1", rig="r")  # the hold was given back already
    assert any("backward transition: b1: unslung while open" in v for v in violations(log, ["b1"]))


def gate_job(*steps: tuple[str, dict[str, Any]]) -> list[Logged]:
    log = LogBuilder().add("gate.requested", job_id="g1", rig="chaos")
    for kind, data in steps:
        log.add(kind, job_id="g1", **data)
    return log.events


def test_a_gate_job_taken_again_after_its_runner_went_quiet_and_answered_once_is_fine() -> None:
    log = gate_job(
        ("gate.started", {"runner": "runner-1", "attempt": 1}),
        ("gate.heartbeat", {"runner": "runner-1", "attempt": 1}),
        ("gate.started", {"runner": "runner-2", "attempt": 2}),
        ("gate.finished", {"runner": "runner-2", "attempt": 2, "passed": True}),
    )
    assert gate_jobs_answered_once(log) == []


@pytest.mark.parametrize(
    ("steps", "invariant"),
    [
        (
            [("gate.started", {"runner": "runner-1", "attempt": 1}), ("gate.started", {"runner": "r-2", "attempt": 1})],
            "gate job taken out of turn",
        ),
        (
            [
                ("gate.started", {"runner": "runner-1", "attempt": 1}),
                ("gate.finished", {"runner": "runner-1", "attempt": 1}),
                ("gate.cancelled", {"reason": "done"}),
            ],
            "gate job answered twice",
        ),
        (
            [("gate.cancelled", {"reason": "done"}), ("gate.started", {"runner": "runner-1", "attempt": 1})],
            "gate job moved after its answer",
        ),
        (
            [
                ("gate.started", {"runner": "runner-1", "attempt": 1}),
                ("gate.started", {"runner": "runner-2", "attempt": 2}),
                ("gate.finished", {"runner": "runner-1", "attempt": 1}),
            ],
            "gate job answered by a runner that lost it",
        ),
    ],
)
def test_a_gate_job_broken_is_named(steps: list[tuple[str, dict[str, Any]]], invariant: str) -> None:
    assert invariant in {v.invariant for v in gate_jobs_answered_once(gate_job(*steps))}
