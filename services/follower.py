"""A service whose own behaviour is still to come: it replays and follows the log and reports its health.

Witness, refinery and deacon start from this so that `gt up`, health checks and projection lag work for
all four services today; each gains its projection, decisions and commands in its own issue.
"""

from __future__ import annotations

import functools

import msgspec

from shared.events import Envelope, Event
from shared.projection import Projection


class LogTally(msgspec.Struct, kw_only=True):
    """How many events of each type the service has applied: enough to check it follows the log."""

    by_type: dict[str, int] = {}


@functools.singledispatch
def fold(payload: Event, state: LogTally, env: Envelope, seq: int) -> None:
    state.by_type[env.type] = state.by_type.get(env.type, 0) + 1


def new_projection(name: str) -> Projection[LogTally]:
    return Projection(name, LogTally, fold, schema_version=1)
