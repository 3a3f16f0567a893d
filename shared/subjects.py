"""Subject grammar and stream names. Pure functions, no I/O."""

from __future__ import annotations

EVT_PREFIX = "gt.evt"
CMD_PREFIX = "gt.cmd"
QUERY_PREFIX = "gt.q"

DEFAULT_EVT_STREAM = "GT_EVT"
DEFAULT_CMD_STREAM = "GT_CMD"
DEFAULT_SNAPSHOT_BUCKET = "GT_SNAP"


def event_subject(aggregate: str, aggregate_id: str) -> str:
    return f"{EVT_PREFIX}.{aggregate}.{aggregate_id}"


def outcome_subject(command_id: str) -> str:
    return f"{EVT_PREFIX}.cmd.{command_id}"


def command_subject(aggregate: str, verb: str) -> str:
    return f"{CMD_PREFIX}.{aggregate}.{verb}"


def query_subject(service: str, what: str) -> str:
    return f"{QUERY_PREFIX}.{service}.{what}"


def split_command_subject(subject: str) -> tuple[str, str] | None:
    """``gt.cmd.bead.create`` -> ("bead", "create"); anything else -> None."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != "gt" or parts[1] != "cmd":  # noqa: PLR2004
        return None
    return parts[2], parts[3]


def aggregate_of(subject: str) -> tuple[str, str] | None:
    """``gt.evt.bead.hq-1a2b3c`` -> ("bead", "hq-1a2b3c")."""
    parts = subject.split(".", 3)
    if len(parts) != 4 or parts[0] != "gt" or parts[1] != "evt":  # noqa: PLR2004
        return None
    return parts[2], parts[3]
