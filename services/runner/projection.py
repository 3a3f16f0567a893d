"""The runner's projection: gate jobs, folded as the refinery folds them (``shared.model.gate_jobs``)."""

from __future__ import annotations

import functools

from services.runner.state import RunnerState
from shared.model.events import Envelope, Event, GateJobEvent
from shared.model.gate_jobs import fold_gate_job
from shared.service.projection import Projection

SCHEMA_VERSION = 1


@functools.singledispatch
def fold(payload: Event, state: RunnerState, env: Envelope, seq: int) -> None:
    """Events the runner does not track change nothing."""


@fold.register
def _gate_job(payload: GateJobEvent, state: RunnerState, env: Envelope, seq: int) -> None:
    fold_gate_job(payload, state.jobs, env, seq)


def new_projection() -> Projection[RunnerState]:
    return Projection("runner", RunnerState, fold, schema_version=SCHEMA_VERSION)
