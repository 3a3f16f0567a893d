"""What a gate runner knows: the gate jobs of the town (``shared.model.gate_jobs``). Plain data."""

from __future__ import annotations

import msgspec

from shared.model.gate_jobs import GateJob


class RunnerState(msgspec.Struct, kw_only=True):
    jobs: dict[str, GateJob] = {}
    """Gate jobs by id: the open ones, and the newest finished ones (``gate_jobs.KEEP_FINISHED``)."""
