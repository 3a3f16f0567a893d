"""The fold of automation events into ``AutomationState``: each automation's runs (open, completed, failed), its
last fire, its event cursor, and the outcomes of the commands its formula runs sent. Pure; no I/O, mutates the
state it is given.

Besides the automation events it folds: the newest sequence of every event type (what event gates compare
their cursor with), the outcomes of the commands formula runs send (by their fixed ids), ``bead.closed`` of
the beads those runs slung, and the rigs' bead prefixes.
"""

from __future__ import annotations

import functools
from datetime import datetime

from services.deacon.automations.state import (
    FORMULA_STEPS,
    HISTORY,
    AutomationRecord,
    AutomationState,
    Awaited,
    Run,
    command_id,
)
from shared.model.events import (
    AutomationCompleted,
    AutomationFailed,
    AutomationFired,
    BeadClosed,
    CommandAccepted,
    CommandRejected,
    Envelope,
    Event,
    GcSwept,
    RigAdded,
)
from shared.model.events.automations import RunStatus


def fold(payload: Event, state: AutomationState, env: Envelope, seq: int) -> None:
    state.newest[env.type] = seq
    _fold(payload, state, env, seq)


@functools.singledispatch
def _fold(payload: Event, state: AutomationState, env: Envelope, seq: int) -> None:
    """Other events change nothing else."""


def _record(state: AutomationState, name: str, seq: int) -> AutomationRecord:
    record = state.automations.get(name)
    if record is None:
        record = state.automations[name] = AutomationRecord(name=name)
    record.version = seq
    return record


@_fold.register
def _fired(payload: AutomationFired, state: AutomationState, env: Envelope, seq: int) -> None:
    record = _record(state, payload.automation, seq)
    if record.open is not None:
        # Cannot happen through the deacon (it appends with the expected sequence after seeing the open run);
        # a writer that did it anyway leaves the earlier run's outcome unknown.
        _finish(state, record, record.open, "failed", env.ts, error=f"superseded by run {payload.run_id}")
    run = Run(
        id=payload.run_id,
        gate=payload.gate,
        reason=payload.reason,
        action=payload.action,
        fired_at=env.ts,
        fired_seq=seq,
        holder=payload.holder,
        lease_until=payload.lease_until,
        cursor=payload.cursor,
        exec=payload.exec,
        timeout_s=payload.timeout_s,
        formula=payload.formula,
        rig=payload.rig,
        title=payload.title,
        vars=dict(payload.vars),
    )
    record.open = run
    record.runs += 1
    record.last_fired_at = env.ts
    if payload.cursor is not None:
        record.cursor = max(record.cursor, payload.cursor)
    if run.action == "formula":
        for step in FORMULA_STEPS:
            state.awaited[command_id(record.name, run.id, step)] = Awaited(
                automation=record.name, run=run.id, step=step
            )


@_fold.register
def _completed(payload: AutomationCompleted, state: AutomationState, env: Envelope, seq: int) -> None:
    record = _record(state, payload.automation, seq)
    run = record.open
    if run is not None and run.id == payload.run_id:
        _finish(state, record, run, "completed", env.ts, result=payload.result)


@_fold.register
def _failed(payload: AutomationFailed, state: AutomationState, env: Envelope, seq: int) -> None:
    record = _record(state, payload.automation, seq)
    run = record.open
    if run is not None and run.id == payload.run_id:
        _finish(state, record, run, "failed", env.ts, error=payload.error, exit_code=payload.exit_code)


def _finish(
    state: AutomationState,
    record: AutomationRecord,
    run: Run,
    status: RunStatus,
    at: datetime,
    *,
    result: str = "",
    error: str = "",
    exit_code: int | None = None,
) -> None:
    run.status, run.ended_at, run.result, run.error, run.exit_code = status, at, result, error, exit_code
    if status == "completed":
        record.completed += 1
    else:
        record.failed += 1
    record.open = None
    record.history.append(run)
    del record.history[:-HISTORY]
    for step in FORMULA_STEPS:
        state.awaited.pop(command_id(record.name, run.id, step), None)
    if run.bead is not None:
        state.beads.pop(run.bead, None)


def _awaited_run(state: AutomationState, command: str) -> tuple[Awaited, Run] | None:
    awaited = state.awaited.get(command)
    if awaited is None:
        return None
    record = state.automations.get(awaited.automation)
    run = record.open if record is not None else None
    if run is None or run.id != awaited.run:
        return None
    return awaited, run


@_fold.register
def _accepted(payload: CommandAccepted, state: AutomationState, env: Envelope, seq: int) -> None:
    found = _awaited_run(state, payload.command_id)
    if found is None:
        return
    awaited, run = found
    if awaited.step == "create":
        bead = payload.created_id()
        if bead is not None and run.create != "accepted":
            run.create, run.bead = "accepted", bead
            state.beads[bead] = awaited.automation
    elif awaited.step == "sling":
        run.sling = "accepted"


@_fold.register
def _rejected(payload: CommandRejected, state: AutomationState, env: Envelope, seq: int) -> None:
    found = _awaited_run(state, payload.command_id)
    if found is None:
        return
    awaited, run = found
    message = f"{payload.command} rejected ({payload.code}): {payload.message}"
    if awaited.step == "create" and not run.create:
        run.create, run.refusal = "rejected", message
    elif awaited.step == "sling" and not run.sling:
        run.sling, run.refusal = "rejected", message


@_fold.register
def _bead_closed(payload: BeadClosed, state: AutomationState, env: Envelope, seq: int) -> None:
    name = state.beads.get(payload.bead_id)
    record = state.automations.get(name) if name is not None else None
    run = record.open if record is not None else None
    if run is not None and run.bead == payload.bead_id:
        run.bead_closed, run.close_reason = True, payload.reason


@_fold.register
def _rig_added(payload: RigAdded, state: AutomationState, env: Envelope, seq: int) -> None:
    state.rig_prefixes[payload.rig] = payload.prefix  # a rig added again after its removal may take another


@_fold.register
def _gc_swept(payload: GcSwept, state: AutomationState, env: Envelope, seq: int) -> None:
    """Finished runs that ended before the cutoff leave the history; what the gates read (last fire, cursor,
    counters) and open runs stay."""
    for record in state.automations.values():
        if any(run.ended_at is not None and run.ended_at < payload.cutoff for run in record.history):
            record.history = [r for r in record.history if r.ended_at is None or r.ended_at >= payload.cutoff]
