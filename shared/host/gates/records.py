"""What the refinery (or a runner) and a gate's watcher (``watch``) tell each other, as JSON: the watcher's spec
(``WatchSpec``, its argument) and its record of the running gate (``GateRecord``, a file), read by the sweep of a
killed starter's leftovers (``runs.stop_leftovers``). The watcher reads and writes these shapes with the standard
library alone."""

from __future__ import annotations

import msgspec


class WatchSpec(msgspec.Struct, frozen=True, kw_only=True):
    argv: list[str]
    cwd: str
    record: str
    """Where the gate's ``GateRecord`` is kept while it runs."""
    marker: str
    """The value of ``MARKER_VARIABLE`` in the gate's environment."""
    uid: int | None = None
    gid: int | None = None
    """The gate user's ids, when gates run as another user (``GT_GATE_USER``)."""


class Leader(msgspec.Struct, frozen=True, kw_only=True):
    """The gate's first process, whose pid is its group's id: the shape of ``shared.host.processes.ProcessRef``."""

    pid: int
    started: float
    """psutil ``create_time()``."""


class GateRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A running gate's process group, as the watcher recorded it: its first process with its start time, and
    the marker every process of it inherits unless it clears its environment."""

    leader: Leader
    marker: str
