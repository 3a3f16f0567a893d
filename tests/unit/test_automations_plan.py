"""The automation plan and fold: every gate type, no fire while a run is open, cooldown from the last fire, the
event cursor never firing the same event twice, how open runs move on (exec and formula), and the manual run
command. Events go through the real encoder and fold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from services.deacon.automations import plan
from services.deacon.automations.definitions import Automation, InvalidAutomation, parse
from services.deacon.automations.plan import CheckResult, SendCommand, Settle, StartExec
from services.deacon.automations.projection import fold
from services.deacon.automations.state import HISTORY, AutomationState, command_id
from shared.core.errors import CommandError
from shared.core.subjects import event_subject
from shared.model.commands import AutomationRun, BeadClose, BeadCreate
from shared.model.decision import DecideContext
from shared.model.events import (
    AutomationCompleted,
    AutomationFailed,
    AutomationFired,
    BeadClosed,
    BeadCreated,
    CommandAccepted,
    CommandRejected,
    Event,
    RigAdded,
    encode_event,
)
from shared.service.projection import Projection

T0 = datetime(2026, 5, 4, 9, 0, 20, tzinfo=UTC)  # a Monday
ME = "deacon-1-aaaaaa"
OTHER = "deacon-2-bbbbbb"


def auto(body: str, name: str = "job") -> Automation:
    parsed = parse(name, f"/a/{name}.toml", "[automation]\n" + body)
    assert isinstance(parsed, Automation), parsed
    return parsed


EXEC = 'exec = "./run.sh"\ntimeout = "1m"\n'
COOLDOWN = auto('gate = "cooldown"\ninterval = "10m"\n' + EXEC)
CRON = auto('gate = "cron"\nschedule = "30 9 * * *"\n' + EXEC)
EVENT = auto('gate = "event"\non = "bead.closed"\n' + EXEC)
CONDITION = auto('gate = "condition"\ncheck = "test -e flag"\ninterval = "1m"\n' + EXEC)
MANUAL = auto('gate = "manual"\n' + EXEC)
FORMULA = auto('gate = "manual"\nformula = "code-review"\nrig = "demo"\nvars = { change = "abc" }\n')


class Log:
    """An in-memory log feeding the real fold, with a clock the test moves."""

    def __init__(self) -> None:
        self.projection = Projection("automations", AutomationState, fold, schema_version=1)
        self.seq = 0
        self.now = T0
        self.runs = 0
        self.raw: list[tuple[str, bytes]] = []

    @property
    def state(self) -> AutomationState:
        return self.projection.state

    def store(self, payload: Event) -> int:
        self.seq += 1
        data = encode_event(payload, event_id=f"e{self.seq}", ts=self.now, actor="test")
        subject = event_subject(payload.AGGREGATE, payload.aggregate_id())
        self.raw.append((subject, data))
        self.projection.apply(self.seq, subject, data)
        assert self.projection.fold_errors == 0
        return self.seq

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)

    def due(self, *automations: Automation, **kwargs: object) -> plan.Plan:
        return plan.due({a.name: a for a in automations}, self.state, self.now, **kwargs)  # type: ignore[arg-type]

    def fire(self, a: Automation, fire: plan.Fire | None = None, *, holder: str = ME) -> str:
        version = self.state.automations[a.name].version if a.name in self.state.automations else 0
        fire = fire or plan.Fire(automation=a.name, gate="manual", reason="test", expected_seq=version)
        assert fire.expected_seq == version
        self.runs += 1
        run_id = f"run-{self.runs}"
        self.store(
            plan.fired_event(
                a,
                run_id=run_id,
                gate=fire.gate,
                reason=fire.reason,
                cursor=fire.cursor,
                now=self.now,
                holder=holder,
                grace_s=5,
            )
        )
        return run_id

    def fire_due(self, a: Automation, **kwargs: object) -> str:
        fires = self.due(a, **kwargs).fires
        assert [f.automation for f in fires] == [a.name]
        return self.fire(a, fires[0])

    def complete(self, a: Automation, run_id: str) -> None:
        self.store(AutomationCompleted(automation=a.name, run_id=run_id, result="ok"))

    def steps(self, *, active: frozenset[str] = frozenset()) -> plan.Steps:
        return plan.run_steps(self.state, self.now, holder=ME, active=active)


# ---- gates ---------------------------------------------------------------------------------------


class TestCooldown:
    def test_fires_when_never_run_then_after_each_interval_from_the_last_fire(self) -> None:
        log = Log()
        assert log.due(COOLDOWN).fires[0].reason == "never run"
        run = log.fire_due(COOLDOWN)
        log.complete(COOLDOWN, run)
        log.tick(599)
        waiting = log.due(COOLDOWN)
        assert waiting.fires == []
        assert waiting.wake_at == T0 + timedelta(seconds=600)
        assert "cooling down until 2026-05-04 09:10:20 UTC" in waiting.waiting["job"]
        log.tick(1)
        fire = log.due(COOLDOWN).fires[0]
        assert fire.reason == "10m since the last fire (interval 10m)"

    def test_a_manual_run_counts_as_a_fire(self) -> None:
        log = Log()
        run = log.fire(COOLDOWN)  # `gt automation run`
        log.complete(COOLDOWN, run)
        log.tick(300)
        assert log.due(COOLDOWN).fires == []
        log.tick(300)
        assert len(log.due(COOLDOWN).fires) == 1

    def test_the_interval_runs_from_the_fire_not_from_the_end_of_the_run(self) -> None:
        log = Log()
        run = log.fire_due(COOLDOWN)
        log.tick(900)  # the run took 15 minutes
        assert log.due(COOLDOWN).fires == []  # open
        log.complete(COOLDOWN, run)
        assert len(log.due(COOLDOWN).fires) == 1


class TestCron:
    def test_never_fired_fires_only_in_a_matching_minute(self) -> None:
        log = Log()  # 09:00:20
        waiting = log.due(CRON)
        assert waiting.fires == []
        assert waiting.wake_at == datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
        log.now = datetime(2026, 5, 4, 9, 30, 5, tzinfo=UTC)
        fire = log.due(CRON).fires[0]
        assert fire.reason == "schedule '30 9 * * *' matched 2026-05-04 09:30 UTC"

    def test_once_per_matching_minute_then_the_next_match(self) -> None:
        log = Log()
        log.now = datetime(2026, 5, 4, 9, 30, 5, tzinfo=UTC)
        run = log.fire_due(CRON)
        log.complete(CRON, run)
        log.tick(40)  # still 09:30
        assert log.due(CRON).fires == []
        log.now = datetime(2026, 5, 5, 9, 29, 59, tzinfo=UTC)
        assert log.due(CRON).fires == []
        log.tick(1)
        assert len(log.due(CRON).fires) == 1

    def test_a_minute_missed_while_no_deacon_ran_fires_once_late(self) -> None:
        log = Log()
        log.now = datetime(2026, 5, 4, 9, 30, tzinfo=UTC)
        log.complete(CRON, log.fire_due(CRON))
        log.now = datetime(2026, 5, 7, 12, 0, tzinfo=UTC)  # three days down
        fire = log.due(CRON).fires[0]
        assert "matched 2026-05-07 09:30 UTC (late" in fire.reason
        log.complete(CRON, log.fire(CRON, fire))
        assert log.due(CRON).fires == []

    def test_the_schedule_reads_the_wall_clock_of_its_timezone(self) -> None:
        berlin = auto('gate = "cron"\nschedule = "0 3 * * *"\ntimezone = "Europe/Berlin"\n' + EXEC)
        log = Log()
        log.now = datetime(2026, 7, 1, 1, 0, 10, tzinfo=UTC)  # 03:00 in Berlin (summer time)
        assert log.due(berlin).fires[0].reason.endswith("matched 2026-07-01 03:00 Europe/Berlin")
        log.now = datetime(2026, 7, 1, 3, 0, 10, tzinfo=UTC)
        assert log.due(berlin).fires == []

    def test_a_wall_clock_hour_repeated_by_a_daylight_saving_change_fires_once(self) -> None:
        berlin = auto('gate = "cron"\nschedule = "30 2 * * *"\ntimezone = "Europe/Berlin"\n' + EXEC)
        log = Log()
        log.now = datetime(2026, 10, 25, 0, 30, 10, tzinfo=UTC)  # 02:30 summer time; clocks go back at 03:00
        log.complete(berlin, log.fire_due(berlin))
        for minutes in (30, 60, 90):  # 02:00, 02:30 and 03:00 again, now winter time
            log.now = datetime(2026, 10, 25, 0, 30, 10, tzinfo=UTC) + timedelta(minutes=minutes)
            assert log.due(berlin).fires == [], log.now


class TestEvent:
    def test_fires_for_a_new_event_with_its_sequence_as_cursor(self) -> None:
        log = Log()
        assert log.due(EVENT).fires == []
        log.store(BeadCreated(bead_id="hq-1", title="t"))
        assert log.due(EVENT).fires == []  # another type
        seq = log.store(BeadClosed(bead_id="hq-1", reason="done"))
        fire = log.due(EVENT).fires[0]
        assert (fire.cursor, fire.reason) == (seq, f"bead.closed at seq {seq} (newest)")

    def test_the_cursor_never_fires_the_same_event_again(self) -> None:
        log = Log()
        first = log.store(BeadClosed(bead_id="hq-1"))
        run = log.fire_due(EVENT)
        assert log.state.automations["job"].cursor == first
        log.store(AutomationFailed(automation="job", run_id=run, error="the deacon restarted"))
        log.tick(3600)
        assert log.due(EVENT).fires == []  # a failed run consumed its events too
        second = log.store(BeadClosed(bead_id="hq-2"))
        fire = log.due(EVENT).fires[0]
        assert fire.cursor == second
        assert f"the first after seq {first}" in fire.reason

    def test_events_that_arrive_during_a_run_make_one_fire_after_it(self) -> None:
        log = Log()
        log.store(BeadClosed(bead_id="hq-1"))
        run = log.fire_due(EVENT)
        log.store(BeadClosed(bead_id="hq-2"))
        last = log.store(BeadClosed(bead_id="hq-3"))
        assert log.due(EVENT).fires == []  # open
        log.complete(EVENT, run)
        assert [f.cursor for f in log.due(EVENT).fires] == [last]

    def test_a_subject_filter_reads_the_matched_sequences_given(self) -> None:
        filtered = auto('gate = "event"\non = "bead.closed"\nsubject = "gt.evt.bead.hq-7"\n' + EXEC)
        log = Log()
        seq = log.store(BeadClosed(bead_id="hq-1"))
        assert log.due(filtered).fires == []  # the unfiltered newest does not count
        assert log.due(filtered, matched={"job": seq}).fires[0].cursor == seq
        log.complete(filtered, log.fire_due(filtered, matched={"job": seq}))
        assert log.due(filtered, matched={"job": seq}).fires == []


class TestCondition:
    def test_checks_run_every_interval_and_not_while_open_or_checking(self) -> None:
        log = Log()
        autos = {"job": CONDITION}
        assert plan.checks_to_run(autos, log.state, log.now, {}, set()) == ["job"]
        assert plan.checks_to_run(autos, log.state, log.now, {}, {"job"}) == []
        checks = {"job": CheckResult(at=log.now, exit_code=1)}
        log.tick(59)
        assert plan.checks_to_run(autos, log.state, log.now, checks, set()) == []
        assert log.due(CONDITION, checks=checks).wake_at == T0 + timedelta(seconds=60)
        log.tick(1)
        assert plan.checks_to_run(autos, log.state, log.now, checks, set()) == ["job"]
        log.fire(CONDITION)
        assert plan.checks_to_run(autos, log.state, log.now, checks, set()) == []

    def test_fires_on_a_passing_check_taken_after_the_last_fire(self) -> None:
        log = Log()
        assert log.due(CONDITION, checks={"job": CheckResult(at=log.now, exit_code=1)}).fires == []
        passed = {"job": CheckResult(at=log.now, exit_code=0)}
        assert log.due(CONDITION, checks=passed).fires[0].reason.startswith("check passed")
        log.tick(1)
        log.complete(CONDITION, log.fire_due(CONDITION, checks=passed))
        assert log.due(CONDITION, checks=passed).fires == []  # that result was used up by the fire
        log.tick(60)
        assert plan.checks_to_run({"job": CONDITION}, log.state, log.now, passed, set()) == ["job"]


def test_a_manual_gate_never_fires_by_itself() -> None:
    log = Log()
    log.tick(86400 * 30)
    waiting = log.due(MANUAL)
    assert (waiting.fires, waiting.wake_at) == ([], None)
    assert "gt automation run" in waiting.waiting["job"]


@pytest.mark.parametrize("a", [COOLDOWN, CRON, EVENT, CONDITION], ids=lambda a: a.gate)
def test_no_gate_fires_while_a_run_is_open(a: Automation) -> None:
    log = Log()
    log.now = datetime(2026, 5, 4, 9, 30, 5, tzinfo=UTC)
    log.store(BeadClosed(bead_id="hq-1"))
    run = log.fire(a)  # e.g. `gt automation run` just now, or a fire before a restart
    log.store(BeadClosed(bead_id="hq-2"))
    log.tick(86400)
    open_plan = log.due(a, checks={"job": CheckResult(at=log.now, exit_code=0)})
    assert open_plan.fires == []
    assert open_plan.waiting["job"] == f"run {run} is still open"


def test_a_disabled_automation_does_not_fire() -> None:
    off = auto('gate = "cooldown"\ninterval = "1m"\nenabled = false\n' + EXEC)
    assert Log().due(off).fires == []


def test_a_fire_carries_the_version_it_was_decided_on() -> None:
    log = Log()
    log.complete(COOLDOWN, log.fire_due(COOLDOWN))
    log.tick(600)
    assert log.due(COOLDOWN).fires[0].expected_seq == log.state.automations["job"].version == log.seq


# ---- open runs -----------------------------------------------------------------------------------


class TestExecRuns:
    def test_the_holder_starts_its_run_once(self) -> None:
        log = Log()
        run = log.fire(MANUAL)
        [step] = log.steps().steps
        assert isinstance(step, StartExec)
        assert step.run.id == run
        assert log.steps(active=frozenset({run})).steps == []

    def test_the_lease_carries_timeout_and_grace(self) -> None:
        log = Log()
        log.fire(MANUAL)
        open_run = log.state.automations["job"].open
        assert open_run is not None
        assert open_run.lease_until == T0 + timedelta(seconds=60 + 5)

    def test_another_deacons_run_is_left_alone_until_its_lease_ends_then_failed(self) -> None:
        log = Log()
        run = log.fire(MANUAL, holder=OTHER)
        waiting = log.steps()
        assert waiting.steps == []
        assert waiting.wake_at == T0 + timedelta(seconds=65)
        log.tick(65)
        [step] = log.steps().steps
        assert isinstance(step, Settle)
        assert isinstance(step.event, AutomationFailed)
        assert step.event.run_id == run
        assert "whether the command finished is unknown" in step.event.error
        assert OTHER in step.event.error
        assert step.expected_seq == log.seq

    def test_ending_a_run_keeps_a_bounded_history_and_counts(self) -> None:
        log = Log()
        for n in range(HISTORY + 3):
            run = log.fire(MANUAL)
            if n % 2:
                log.complete(MANUAL, run)
            else:
                log.store(AutomationFailed(automation="job", run_id=run, error="exit 1", exit_code=1))
        record = log.state.automations["job"]
        assert (record.runs, record.completed, record.failed, record.open) == (HISTORY + 3, 6, 7, None)
        assert len(record.history) == HISTORY
        assert record.history[-1].id == f"run-{HISTORY + 3}"
        assert record.history[-1].exit_code == 1

    def test_an_end_for_another_run_changes_nothing(self) -> None:
        log = Log()
        run = log.fire(MANUAL)
        log.store(AutomationCompleted(automation="job", run_id="run-old", result="late"))
        record = log.state.automations["job"]
        assert record.open is not None
        assert record.open.id == run


class TestFormulaRuns:
    def outcome(self, log: Log, step: str, run: str, **result: str) -> None:
        cmd = command_id("job", run, step)
        log.store(CommandAccepted(command_id=cmd, command=f"bead.{step}", result=dict(result)))

    def test_create_then_sling_then_completed_when_the_bead_closes(self) -> None:
        log = Log()
        log.store(RigAdded(rig="demo", repo="/r", prefix="dm", agent_command="gt-agent"))
        run = log.fire(FORMULA)
        [create] = log.steps().steps
        assert isinstance(create, SendCommand)
        assert isinstance(create.command, BeadCreate)
        assert (create.command.SUBJECT, create.command.cmd_id) == (
            "gt.cmd.bead.create",
            command_id("job", run, "create"),
        )
        assert create.command.prefix == "dm"
        assert create.command.metadata == {"automation": "job", "automation_run": run}
        assert (create.command.actor, create.command.correlation_id) == ("automation:job", run)
        self.outcome(log, "create", run, id="dm-abc123")
        [sling] = log.steps().steps
        assert isinstance(sling, SendCommand)
        assert sling.command.SUBJECT == "gt.cmd.bead.sling"
        body = msgspec.to_builtins(sling.command)
        assert body["cmd_id"] == command_id("job", run, "sling")
        assert body | {"actor": None, "correlation_id": None, "cmd_id": None} == {
            "id": "dm-abc123",
            "rig": "demo",
            "formula": "code-review",
            "vars": {"change": "abc"},
            "actor": None,
            "correlation_id": None,
            "cmd_id": None,
        }
        self.outcome(log, "sling", run, id="dm-abc123")
        assert log.steps().steps == []  # the bead is being worked: the run stays open
        assert log.due(FORMULA).fires == []
        log.store(BeadClosed(bead_id="dm-abc123", reason="merged"))
        [done] = log.steps().steps
        assert isinstance(done, Settle)
        assert done.event == AutomationCompleted(
            automation="job", run_id=run, result="bead dm-abc123 closed: merged", bead="dm-abc123"
        )
        log.store(done.event)
        assert log.state.awaited == {}
        assert log.state.beads == {}

    def test_a_rejected_create_fails_the_run(self) -> None:
        log = Log()
        run = log.fire(FORMULA)
        cmd = command_id("job", run, "create")
        log.store(CommandRejected(command_id=cmd, command="bead.create", code="invalid", message="`prefix` bad"))
        [step] = log.steps().steps
        assert isinstance(step, Settle)
        assert isinstance(step.event, AutomationFailed)
        assert step.event.error == "bead.create rejected (invalid): `prefix` bad"

    def test_a_rejected_sling_closes_the_bead_and_fails_the_run(self) -> None:
        log = Log()
        run = log.fire(FORMULA)
        self.outcome(log, "create", run, id="hq-1")
        cmd = command_id("job", run, "sling")
        log.store(CommandRejected(command_id=cmd, command="bead.sling", code="invalid", message="no formula"))
        close, fail = log.steps().steps
        assert isinstance(close, SendCommand)
        assert isinstance(close.command, BeadClose)
        assert (close.command.SUBJECT, close.command.id, close.command.cmd_id) == (
            "gt.cmd.bead.close",
            "hq-1",
            command_id("job", run, "close"),
        )
        assert isinstance(fail, Settle)
        assert isinstance(fail.event, AutomationFailed)
        assert (fail.event.bead, fail.event.error) == ("hq-1", "bead.sling rejected (invalid): no formula")

    def test_outcomes_of_other_commands_and_closes_of_other_beads_change_nothing(self) -> None:
        log = Log()
        run = log.fire(FORMULA)
        log.store(CommandAccepted(command_id="someone-else", command="bead.create", result={"id": "hq-9"}))
        log.store(BeadClosed(bead_id="hq-9"))
        record = log.state.automations["job"]
        assert record.open is not None
        assert (record.open.id, record.open.bead, record.open.create) == (run, None, "")

    def test_a_restarted_deacon_owes_the_same_commands_with_the_same_ids(self) -> None:
        log = Log()
        run = log.fire(FORMULA)
        self.outcome(log, "create", run, id="hq-1")
        before = log.steps().steps
        replayed = Log()
        for seq, (subject, data) in enumerate(log.raw, start=1):
            replayed.projection.apply(seq, subject, data)
        assert replayed.steps().steps == before
        assert [s.command.cmd_id for s in before if isinstance(s, SendCommand)] == [command_id("job", run, "sling")]


# ---- the manual run command ----------------------------------------------------------------------


def ctx(now: datetime = T0) -> DecideContext:
    return DecideContext(now=now, command_id="c1", actor="operator:ann", new_id=lambda prefix: f"{prefix}-zz9")


class TestDecideRun:
    def test_fires_with_the_expected_version_and_answers_the_run_id(self) -> None:
        log = Log()
        accepted = plan.decide_run(log.state, AutomationRun(name="job"), ctx(), MANUAL, holder=ME, grace_s=5)
        [new] = accepted.events
        assert new.expected_seq == 0
        assert isinstance(new.payload, AutomationFired)
        assert (new.payload.gate, new.payload.reason, new.payload.holder) == ("manual", "run by operator:ann", ME)
        assert msgspec.to_builtins(accepted.result) == {
            "id": "job",
            "run": "run-zz9",
            "status": "fired",
            "action": "exec",
        }
        log.store(new.payload)
        log.complete(MANUAL, "run-zz9")
        again = plan.decide_run(log.state, AutomationRun(name="job"), ctx(), MANUAL, holder=ME, grace_s=5)
        assert again.events[0].expected_seq == log.seq

    def test_refused_while_a_run_is_open(self) -> None:
        log = Log()
        run = log.fire(MANUAL)
        with pytest.raises(CommandError) as info:
            plan.decide_run(log.state, AutomationRun(name="job"), ctx(), MANUAL, holder=ME, grace_s=5)
        assert info.value.code == "conflict"
        assert run in info.value.message

    def test_unknown_and_broken_files(self) -> None:
        state = AutomationState()
        with pytest.raises(CommandError) as info:
            plan.decide_run(state, AutomationRun(name="nope"), ctx(), None, holder=ME, grace_s=5)
        assert info.value.code == "not_found"
        broken = InvalidAutomation(name="job", path="/a/job.toml", field="automation.gate", problem="is required")
        with pytest.raises(CommandError) as info:
            plan.decide_run(state, AutomationRun(name="job"), ctx(), broken, holder=ME, grace_s=5)
        assert info.value.code == "invalid"
        assert "/a/job.toml" in info.value.message
        assert "`automation.gate`" in info.value.message

    def test_a_disabled_automation_still_runs_by_hand(self) -> None:
        off = auto('gate = "cooldown"\ninterval = "1m"\nenabled = false\n' + EXEC)
        accepted = plan.decide_run(AutomationState(), AutomationRun(name="job"), ctx(), off, holder=ME, grace_s=5)
        assert len(accepted.events) == 1
