"""Where a plugin starts reading the log when it starts. Pure.

A plugin follows ``GT_EVT`` by direct gets from its position: the last sequence it is done with (every event up to
it handled, or abandoned, or outside its subjects), which it records in its marks after each batch. At-least-once:
a process that dies mid-batch leaves the position at the end of the batch before, so the events it handled since
come again (``once`` makes their side effects happen once).
"""

from __future__ import annotations

from typing import NamedTuple


class StartPlan(NamedTuple):
    start_seq: int
    """First stream sequence to read (1: the whole log)."""
    reason: str
    """``replay_from_start``, ``plugin_record`` (``resume_after``), ``position`` (its recorded position),
    ``consumer_floor`` (the acknowledged floor of the durable consumer an earlier version read through) or ``new``."""


def plan_start(
    recorded: int | None,
    *,
    replay: bool,
    resume_after: int | None,
    consumer_floor: int | None = None,
) -> StartPlan:
    """From which sequence to read.

    ``recorded`` is the position in the plugin's marks (None: none yet); ``resume_after`` the last sequence the
    plugin holds by its own records (the archiver's files), which wins over the recorded position; None when the
    position is its only record. ``consumer_floor``: where the consumer ``plugin-<name>`` of an earlier version
    had everything acknowledged, used only when nothing else says where the plugin stands.
    """
    for name, value in (("recorded", recorded), ("resume_after", resume_after), ("consumer_floor", consumer_floor)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be a stream sequence (0 or more), got {value}")
    if replay:
        return StartPlan(1, "replay_from_start")
    if resume_after is not None:
        return StartPlan(resume_after + 1, "plugin_record")
    if recorded is not None:
        return StartPlan(recorded + 1, "position")
    if consumer_floor is not None:
        return StartPlan(consumer_floor + 1, "consumer_floor")
    return StartPlan(1, "new")


def parse_position(value: bytes) -> int | None:
    """The sequence a position mark holds (ASCII digits); None when it holds something else."""
    text = value.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def encode_position(seq: int) -> bytes:
    return str(seq).encode()
