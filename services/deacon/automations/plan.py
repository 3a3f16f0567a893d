"""Which automations are due and why, and what each open run still owes. Pure: time, ids, the newest matching
events and the results of condition checks are passed in.

A gate is looked at only while its automation has no open run: that, and ``automation.fired`` being appended
with the aggregate's expected sequence before the action starts, is what keeps a restarted (or a second)
deacon from firing twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import msgspec

from services.deacon.automations import cron
from services.deacon.automations.definitions import Automation, InvalidAutomation
from services.deacon.automations.state import AutomationRecord, AutomationState, Run, command_id
from shared.core.errors import CommandError
from shared.model.commands import AutomationRun, BeadClose, BeadCreate, BeadSling
from shared.model.decision import Accepted, DecideContext, NewEvent
from shared.model.events import AutomationCompleted, AutomationFailed, AutomationFired
from shared.model.results import AutomationRunResult

MAX_RESULT = 2000
"""Characters of a run's result or error kept in its event."""


class Fire(msgspec.Struct, frozen=True, kw_only=True):
    automation: str
    gate: str
    reason: str
    cursor: int | None = None
    expected_seq: int = 0
    """The automation's version the gate was looked at on: ``fired`` is appended on it or not at all."""


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """A condition check's outcome: exit 0 means due."""

    at: datetime
    exit_code: int
    output: str = ""


class Plan(msgspec.Struct, kw_only=True):
    fires: list[Fire] = []
    waiting: dict[str, str] = {}
    """Automation -> why it does not fire now, for a person."""
    wake_at: datetime | None = None
    """The earliest time a gate may open by the clock alone (None: only an event or a check can open one)."""


class StartExec(msgspec.Struct, frozen=True, kw_only=True):
    automation: str
    run: Run


class SendCommand(msgspec.Struct, frozen=True, kw_only=True):
    """Store ``command`` for the mayor: a formula run's step, as ``automation:<name>``, correlated by the run's id,
    under an id fixed by the run (``state.command_id``), so a resend after a crash is carried out once."""

    automation: str
    run_id: str
    command: BeadCreate | BeadSling | BeadClose


class Settle(msgspec.Struct, frozen=True, kw_only=True):
    """Record a run's end (``expected_seq``: the automation's version it was decided on)."""

    event: AutomationCompleted | AutomationFailed
    expected_seq: int


Step = StartExec | SendCommand | Settle


class Steps(msgspec.Struct, kw_only=True):
    steps: list[Step] = []
    wake_at: datetime | None = None


# ---- gates ---------------------------------------------------------------------------------------


def due(
    automations: Mapping[str, Automation],
    state: AutomationState,
    now: datetime,
    *,
    matched: Mapping[str, int] | None = None,
    checks: Mapping[str, CheckResult] | None = None,
) -> Plan:
    """The automations whose gate is open now. ``matched``: for event gates with a ``subject`` filter, the
    sequence of the newest event matching it (the others read ``state.newest``); ``checks``: the newest
    condition check result per automation."""
    plan = Plan()
    for name, auto in sorted(automations.items()):
        record = state.automations.get(name) or AutomationRecord(name=name)
        if record.open is not None:
            plan.waiting[name] = f"run {record.open.id} is still open"
            continue
        if not auto.enabled:
            plan.waiting[name] = "disabled (enabled = false); `gt automation run` still runs it"
            continue
        fire, why, wake = _gate(auto, record, state, now, matched or {}, checks or {})
        if fire is not None:
            plan.fires.append(msgspec.structs.replace(fire, expected_seq=record.version))
        else:
            plan.waiting[name] = why
        if wake is not None and (plan.wake_at is None or wake < plan.wake_at):
            plan.wake_at = wake
    return plan


def _gate(
    auto: Automation,
    record: AutomationRecord,
    state: AutomationState,
    now: datetime,
    matched: Mapping[str, int],
    checks: Mapping[str, CheckResult],
) -> tuple[Fire | None, str, datetime | None]:
    last = record.last_fired_at
    if auto.gate == "cooldown":
        assert auto.interval_s is not None
        if last is None:
            return Fire(automation=auto.name, gate="cooldown", reason="never run"), "", None
        elapsed = (now - last).total_seconds()
        if elapsed >= auto.interval_s:
            reason = f"{_span(elapsed)} since the last fire (interval {_span(auto.interval_s)})"
            return Fire(automation=auto.name, gate="cooldown", reason=reason), "", None
        wake = last + timedelta(seconds=auto.interval_s)
        return None, f"cooling down until {_at(wake)}", wake
    if auto.gate == "cron":
        return _cron(auto, last, now)
    if auto.gate == "event":
        assert auto.on is not None
        seen = matched.get(auto.name) if auto.subject else state.newest.get(auto.on)
        if seen is not None and seen > record.cursor:
            where = f" on {auto.subject}" if auto.subject else ""
            since = f", the first after seq {record.cursor}" if record.cursor else ""
            reason = f"{auto.on}{where} at seq {seen} (newest{since})"
            return Fire(automation=auto.name, gate="event", reason=reason, cursor=seen), "", None
        return None, f"waiting for a {auto.on} after seq {record.cursor}", None
    if auto.gate == "condition":
        result = checks.get(auto.name)
        if result is not None and result.exit_code == 0 and (last is None or result.at > last):
            reason = f"check passed (exit 0) at {_at(result.at)}"
            return Fire(automation=auto.name, gate="condition", reason=reason), "", None
        check_at = next_check(auto, record, checks)
        how = f"last check exited {result.exit_code}" if result is not None else "not checked yet"
        return None, f"{how}; next check at {_at(check_at) if check_at else 'once started'}", check_at
    return None, "manual: fires only on `gt automation run`", None


def _cron(auto: Automation, last: datetime | None, now: datetime) -> tuple[Fire | None, str, datetime | None]:
    assert auto.schedule is not None
    zone = ZoneInfo(auto.timezone)
    local_now = now.astimezone(zone).replace(tzinfo=None)
    upcoming = cron.next_due(auto.schedule, local_now)
    wake = upcoming.replace(tzinfo=zone).astimezone(UTC) if upcoming is not None else None
    fire_minute: datetime | None = None
    if last is None:
        # Never fired: only the current minute counts (there is no start to catch up from).
        if cron.matches(auto.schedule, local_now):
            fire_minute = local_now.replace(second=0, microsecond=0)
    else:
        last_minute = last.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
        previous = cron.previous_due(auto.schedule, local_now)
        if previous is not None and previous > last_minute:
            fire_minute = previous  # also one missed while no deacon ran: fired once, late
    if fire_minute is None:
        return None, f"next at {_at(wake) if wake else 'never'}", wake
    late = " (late: no deacon was running then)" if fire_minute < local_now.replace(second=0, microsecond=0) else ""
    reason = f"schedule {auto.schedule.text!r} matched {fire_minute:%Y-%m-%d %H:%M} {auto.timezone}{late}"
    return Fire(automation=auto.name, gate="cron", reason=reason), "", wake


def next_check(auto: Automation, record: AutomationRecord, checks: Mapping[str, CheckResult]) -> datetime | None:
    """When a condition automation's check is due next (None: at once)."""
    assert auto.interval_s is not None
    times = [t for t in (record.last_fired_at, checks[auto.name].at if auto.name in checks else None) if t]
    return max(times) + timedelta(seconds=auto.interval_s) if times else None


def checks_to_run(
    automations: Mapping[str, Automation],
    state: AutomationState,
    now: datetime,
    checks: Mapping[str, CheckResult],
    checking: Set[str],
) -> list[str]:
    """Condition automations whose check should run now: enabled, no open run, none running, and at least
    ``interval`` since both its last check and its last fire (a condition that stays true fires at most once
    per interval)."""
    out = []
    for name, auto in sorted(automations.items()):
        if auto.gate != "condition" or not auto.enabled or name in checking:
            continue
        record = state.automations.get(name) or AutomationRecord(name=name)
        if record.open is not None:
            continue
        wake = next_check(auto, record, checks)
        if wake is None or wake <= now:
            out.append(name)
    return out


def next_due(auto: Automation, record: AutomationRecord | None, now: datetime) -> datetime | None:
    """When the clock alone opens the gate next (cooldown, cron), for a person; None otherwise."""
    if auto.gate == "cooldown" and auto.interval_s is not None:
        last = record.last_fired_at if record is not None else None
        return now if last is None else max(now, last + timedelta(seconds=auto.interval_s))
    if auto.gate == "cron" and auto.schedule is not None:
        zone = ZoneInfo(auto.timezone)
        upcoming = cron.next_due(auto.schedule, now.astimezone(zone).replace(tzinfo=None))
        return upcoming.replace(tzinfo=zone).astimezone(UTC) if upcoming is not None else None
    return None


# ---- firing --------------------------------------------------------------------------------------


def fired_event(
    auto: Automation,
    *,
    run_id: str,
    gate: str,
    reason: str,
    cursor: int | None,
    now: datetime,
    holder: str,
    grace_s: float,
) -> AutomationFired:
    """The event that opens a run: it carries the action as the file has it now, so the run can be finished
    from the log alone."""
    if auto.action == "exec":
        return AutomationFired(
            automation=auto.name,
            run_id=run_id,
            gate=gate,
            reason=reason,
            action="exec",
            cursor=cursor,
            holder=holder,
            lease_until=now + timedelta(seconds=auto.timeout_s + grace_s),
            exec=auto.exec,
            timeout_s=auto.timeout_s,
        )
    assert auto.formula is not None
    assert auto.rig is not None
    return AutomationFired(
        automation=auto.name,
        run_id=run_id,
        gate=gate,
        reason=reason,
        action="formula",
        cursor=cursor,
        holder=holder,
        formula=auto.formula,
        rig=auto.rig,
        title=auto.title or f"{auto.name}: {auto.formula} on {auto.rig}",
        vars=dict(auto.vars),
    )


def decide_run(
    state: AutomationState,
    cmd: AutomationRun,
    ctx: DecideContext,
    found: Automation | InvalidAutomation | None,
    *,
    holder: str,
    grace_s: float,
) -> Accepted[AutomationRunResult]:
    """``gt.cmd.automation.run``: fire now, whatever the gate; ``found`` is the file as read before deciding.

    Raises:
        CommandError: no such automation (``not_found``), its file is broken (``invalid``), or a run is still
            open (``conflict``).
    """
    if found is None:
        raise CommandError("not_found", f"no automation {cmd.name!r} (`gt automation list` shows them)")
    if isinstance(found, InvalidAutomation):
        raise CommandError("invalid", f"automation {cmd.name} cannot run: {found.message}")
    record = state.automations.get(cmd.name)
    if record is not None and record.open is not None:
        run = record.open
        raise CommandError(
            "conflict",
            f"automation {cmd.name} has run {run.id} open since {_at(run.fired_at)} ({run.gate}: {run.reason}); "
            "it fires again once that run completes or fails",
        )
    run_id = ctx.new_id("run")
    event = fired_event(
        found,
        run_id=run_id,
        gate="manual",
        reason=f"run by {ctx.actor}",
        cursor=None,
        now=ctx.now,
        holder=holder,
        grace_s=grace_s,
    )
    expected = record.version if record is not None else 0
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=expected)],
        result=AutomationRunResult(id=cmd.name, run=run_id, status="fired", action=found.action),
    )


# ---- open runs -----------------------------------------------------------------------------------


def run_steps(state: AutomationState, now: datetime, *, holder: str, active: Set[str]) -> Steps:
    """What each open run owes now. ``active``: runs this process is executing (or has finished and is still
    recording); an exec run fired by another process is settled as failed only once its lease ran out."""
    out = Steps()
    for name, record in sorted(state.automations.items()):
        run = record.open
        if run is None or run.id in active:
            continue
        if run.action == "exec":
            if run.holder == holder:
                out.steps.append(StartExec(automation=name, run=run))
            elif run.lease_until is None or now >= run.lease_until:
                error = (
                    f"the deacon running it ({run.holder or 'unknown'}) stopped before recording how it ended; "
                    "whether the command finished is unknown"
                )
                out.steps.append(_settle_failed(record, run, error))
            elif out.wake_at is None or run.lease_until < out.wake_at:
                out.wake_at = run.lease_until
        else:
            out.steps.extend(_formula_steps(state, record, run))
    return out


def _formula_steps(state: AutomationState, record: AutomationRecord, run: Run) -> list[Step]:
    name = record.name
    if run.create == "rejected":
        return [_settle_failed(record, run, run.refusal)]
    actor = f"automation:{name}"  # what the deacon acts for: its commands carry the run's id as correlation
    if run.create == "" or run.bead is None:
        rig = run.rig or ""
        create = BeadCreate(
            title=run.title,
            description=f"Filed by automation {name}, run {run.id} ({run.gate}: {run.reason}).",
            labels=["automation"],
            metadata={"automation": name, "automation_run": run.id},
            prefix=state.rig_prefixes.get(rig, "hq"),
            cmd_id=command_id(name, run.id, "create"),
            actor=actor,
            correlation_id=run.id,
        )
        return [SendCommand(automation=name, run_id=run.id, command=create)]
    if run.sling == "":
        sling = BeadSling(
            id=run.bead,
            rig=run.rig or "",
            formula=run.formula,
            vars=dict(run.vars),
            cmd_id=command_id(name, run.id, "sling"),
            actor=actor,
            correlation_id=run.id,
        )
        return [SendCommand(automation=name, run_id=run.id, command=sling)]
    if run.sling == "rejected":
        close = BeadClose(
            id=run.bead,
            reason=f"automation {name} run {run.id}: {run.refusal}"[:4096],
            cmd_id=command_id(name, run.id, "close"),
            actor=actor,
            correlation_id=run.id,
        )
        return [SendCommand(automation=name, run_id=run.id, command=close), _settle_failed(record, run, run.refusal)]
    if run.bead_closed:
        why = f": {run.close_reason}" if run.close_reason else ""
        event = AutomationCompleted(
            automation=name, run_id=run.id, result=f"bead {run.bead} closed{why}"[:MAX_RESULT], bead=run.bead
        )
        return [Settle(event=event, expected_seq=record.version)]
    return []


def _settle_failed(record: AutomationRecord, run: Run, error: str, exit_code: int | None = None) -> Settle:
    event = AutomationFailed(
        automation=record.name, run_id=run.id, error=error[:MAX_RESULT], exit_code=exit_code, bead=run.bead
    )
    return Settle(event=event, expected_seq=record.version)


# ---- words ---------------------------------------------------------------------------------------


def _at(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
