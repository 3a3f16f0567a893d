"""What ``gt.q.deacon.automations`` and ``gt.q.deacon.automation`` answer: the files as read, the runs as the
log has them, and why each automation waits. Pure."""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from msgspec import UNSET, UnsetType

from services.deacon.automations import plan as automation_plan
from services.deacon.automations.definitions import Automation, Definitions, InvalidAutomation
from services.deacon.automations.state import AutomationRecord, AutomationState, Run
from shared.core.errors import QueryError
from shared.model.queries.deacon import AutomationView, RunView

T = TypeVar("T")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _given(value: T | None) -> T | UnsetType:
    """A field an answer leaves out when it has nothing."""
    return UNSET if value is None else value


def run_view(run: Run) -> RunView:
    return RunView(
        id=run.id,
        status=run.status,
        gate=run.gate,
        reason=run.reason,
        action=run.action,
        fired_at=_iso(run.fired_at),
        ended_at=_iso(run.ended_at),
        holder=run.holder,
        cursor=run.cursor,
        lease_until=_iso(run.lease_until),
        exec=run.exec or None,
        formula=run.formula,
        rig=run.rig,
        bead=run.bead,
        result=run.result or None,
        error=run.error or None,
        exit_code=run.exit_code,
    )


def _file_view(
    name: str, auto: Automation, status: str, next_due: datetime | None, waiting: str | None
) -> AutomationView:
    """A usable automation's file as read: its gate's fields and its action's, each only where it applies."""
    view = AutomationView(
        name=name,
        status=status,
        file=auto.path,
        description=auto.description,
        enabled=auto.enabled,
        gate=auto.gate,
        action=auto.action,
        interval_s=_given(auto.interval_s),
        schedule=_given(auto.schedule.text if auto.schedule is not None else None),
        timezone=_given(auto.timezone if auto.gate == "cron" else None),
        on=_given(auto.on),
        subject=_given(auto.subject),
        check=_given(auto.check),
        check_timeout_s=_given(auto.check_timeout_s if auto.gate == "condition" else None),
        next_due=_iso(next_due),
        waiting=waiting,
    )
    if auto.action == "exec":
        view.exec, view.timeout_s = auto.exec, auto.timeout_s
    else:
        view.formula, view.rig, view.title, view.vars = auto.formula, auto.rig, auto.title, dict(auto.vars)
    return view


def automation_view(
    name: str,
    defs: Definitions,
    record: AutomationRecord | None,
    waiting: str | None,
    now: datetime,
) -> AutomationView:
    auto = defs.automations.get(name)
    broken: InvalidAutomation | None = defs.invalid.get(name)
    if auto is not None:
        status = "running" if record is not None and record.open is not None else "idle"
        if not auto.enabled and status == "idle":
            status = "disabled"
        view = _file_view(name, auto, status, automation_plan.next_due(auto, record, now), waiting)
    elif broken is not None:
        view = AutomationView(name=name, status="invalid", file=broken.path, error=broken.message, field=broken.field)
    else:
        view = AutomationView(
            name=name, status="removed" if record is None or record.open is None else "running (file removed)"
        )
    if record is not None:
        last = record.last_run()
        view.runs, view.completed, view.failed = record.runs, record.completed, record.failed
        view.last_fired_at = _iso(record.last_fired_at)
        view.cursor = record.cursor or None
        view.open_run = run_view(record.open) if record.open is not None else None
        view.last_run = run_view(last) if last is not None else None
    return view


def list_view(
    defs: Definitions, state: AutomationState, waiting: dict[str, str], now: datetime
) -> list[AutomationView]:
    """Every automation with a file (usable or not) or a history in the log, by name."""
    names = sorted({*defs.automations, *defs.invalid, *state.automations})
    return [automation_view(n, defs, state.automations.get(n), waiting.get(n), now) for n in names]


def detail_view(
    name: str, defs: Definitions, state: AutomationState, waiting: dict[str, str], now: datetime
) -> AutomationView:
    record = state.automations.get(name)
    if record is None and name not in defs.automations and name not in defs.invalid:
        raise QueryError("not_found", f"no automation {name!r} (`gt automation list` shows them)")
    view = automation_view(name, defs, record, waiting.get(name), now)
    view.history = [run_view(r) for r in reversed(record.history)] if record is not None else []
    return view
