"""What ``gt.q.deacon.automations`` and ``gt.q.deacon.automation`` answer: the files as read, the runs as the
log has them, and why each automation waits. Pure."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from services.deacon.automations import plan as automation_plan
from services.deacon.automations.definitions import Automation, Definitions, InvalidAutomation
from services.deacon.automations.state import AutomationRecord, AutomationState, Run
from shared.core.errors import QueryError


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def run_view(run: Run) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": run.id,
        "status": run.status,
        "gate": run.gate,
        "reason": run.reason,
        "action": run.action,
        "fired_at": _iso(run.fired_at),
        "ended_at": _iso(run.ended_at),
        "holder": run.holder,
    }
    optional = {
        "cursor": run.cursor,
        "lease_until": _iso(run.lease_until),
        "exec": run.exec or None,
        "formula": run.formula,
        "rig": run.rig,
        "bead": run.bead,
        "result": run.result or None,
        "error": run.error or None,
        "exit_code": run.exit_code,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def _gate_fields(auto: Automation) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "interval_s": auto.interval_s,
        "schedule": auto.schedule.text if auto.schedule is not None else None,
        "timezone": auto.timezone if auto.gate == "cron" else None,
        "on": auto.on,
        "subject": auto.subject,
        "check": auto.check,
        "check_timeout_s": auto.check_timeout_s if auto.gate == "condition" else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _action_fields(auto: Automation) -> dict[str, Any]:
    if auto.action == "exec":
        return {"exec": auto.exec, "timeout_s": auto.timeout_s}
    return {"formula": auto.formula, "rig": auto.rig, "title": auto.title, "vars": dict(auto.vars)}


def automation_view(
    name: str,
    defs: Definitions,
    record: AutomationRecord | None,
    waiting: str | None,
    now: datetime,
) -> dict[str, Any]:
    auto = defs.automations.get(name)
    broken: InvalidAutomation | None = defs.invalid.get(name)
    out: dict[str, Any] = {"name": name}
    if auto is not None:
        status = "running" if record is not None and record.open is not None else "idle"
        if not auto.enabled and status == "idle":
            status = "disabled"
        next_due = automation_plan.next_due(auto, record, now)
        out.update(
            status=status,
            file=auto.path,
            description=auto.description,
            enabled=auto.enabled,
            gate=auto.gate,
            action=auto.action,
            **_gate_fields(auto),
            **_action_fields(auto),
            next_due=_iso(next_due),
            waiting=waiting,
        )
    elif broken is not None:
        out.update(status="invalid", file=broken.path, error=broken.message, field=broken.field)
    else:
        out.update(status="removed" if record is None or record.open is None else "running (file removed)")
    if record is not None:
        last = record.last_run()
        out.update(
            runs=record.runs,
            completed=record.completed,
            failed=record.failed,
            last_fired_at=_iso(record.last_fired_at),
            cursor=record.cursor or None,
            open_run=run_view(record.open) if record.open is not None else None,
            last_run=run_view(last) if last is not None else None,
        )
    else:
        out.update(runs=0, completed=0, failed=0, last_fired_at=None, open_run=None, last_run=None)
    return out


def list_view(
    defs: Definitions, state: AutomationState, waiting: dict[str, str], now: datetime
) -> list[dict[str, Any]]:
    """Every automation with a file (usable or not) or a history in the log, by name."""
    names = sorted({*defs.automations, *defs.invalid, *state.automations})
    return [automation_view(n, defs, state.automations.get(n), waiting.get(n), now) for n in names]


def detail_view(
    name: str, defs: Definitions, state: AutomationState, waiting: dict[str, str], now: datetime
) -> dict[str, Any]:
    record = state.automations.get(name)
    if record is None and name not in defs.automations and name not in defs.invalid:
        raise QueryError("not_found", f"no automation {name!r} (`gt automation list` shows them)")
    out = automation_view(name, defs, record, waiting.get(name), now)
    out["history"] = [run_view(r) for r in reversed(record.history)] if record is not None else []
    return out
