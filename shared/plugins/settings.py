"""What a plugin is called, what it reads and how it retries: checked before anything connects. Pure."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from shared.core import ids
from shared.core.subjects import DEFAULT_PLUGIN_BUCKET, EVT_PREFIX, event_subject

PLUGIN_BUCKET = DEFAULT_PLUGIN_BUCKET
"""KV bucket of idempotence marks (``<plugin>.<event id>``), abandoned events (``<plugin>.dead.<seq>``) and positions
(``<plugin>.position.last``); made by the services' provisioning."""
CONSUMER_PREFIX = "plugin-"
"""What plugins' durable consumers on GT_EVT were called before plugins followed the log by direct gets: a plugin
with no position yet starts after its old consumer's acknowledged floor, and the metrics exporter reports the
position of a plugin that still reads through one (another language's, with a user of its own)."""
ALL_EVENTS = EVT_PREFIX + ".>"
DEFAULT_MARK_TTL_S = 7 * 24 * 3600.0
"""How long the marks bucket keeps a mark (the services make it with this TTL). An event comes again only after
the plugin's position, which never ages out: within seconds while the plugin runs, or when it next starts; a plugin
down for longer than this may repeat the side effects of the one batch it had not recorded when it died."""
_TOKEN = re.compile(r"^(\*|>|[a-z0-9][a-z0-9_-]{0,63})$")

Exhausted = Literal["stop", "skip"]


class PluginSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How one plugin follows ``GT_EVT``; ``validate`` says what is wrong with a bad one."""

    name: str
    """Names the plugin's marks and position (``<name>.`` keys of the marks bucket); an id token."""
    subjects: tuple[str, ...] = (ALL_EVENTS,)
    """Filter subjects under ``gt.evt.``, e.g. ``gt.evt.bead.>``."""
    replay_from_start: bool = False
    """Start over: the position goes back to the log's start and the plugin's marks are forgotten."""
    batch: int = 64
    """Events read per request (one batched direct get); the handler still sees them one at a time, in order. The
    position is recorded after each batch."""
    max_attempts: int = 5
    """Failed handler calls in a row for one event before ``on_exhausted`` applies."""
    backoff_s: float = 0.5
    """Wait before handing a failed event over again; doubles per failure up to ``max_backoff_s``."""
    max_backoff_s: float = 30.0
    on_exhausted: Exhausted = "stop"
    """``stop``: the plugin stops with an error and its position stays before the event, so it is the first one
    handled after a restart. ``skip``: the event is logged, recorded as ``<plugin>.dead.<seq>`` in the bucket and
    passed over, and the plugin goes on."""
    poll_s: float = 0.05
    """Once caught up, how soon the plugin looks for new events; the wait doubles while none come, up to
    ``max_poll_s``, and starts again at this when some do."""
    max_poll_s: float = 1.0
    """The longest wait between two looks for new events: how late, at most, an idle plugin sees a new one."""

    @property
    def position_key(self) -> str:
        """The key of the marks bucket holding the last sequence the plugin is done with."""
        return position_key(self.name)


def position_key(plugin: str) -> str:
    """``<plugin>.position.last``: three tokens, so it never collides with a mark (two) or a dead record's key."""
    return f"{plugin}.position.last"


def validate(settings: PluginSettings) -> None:
    """Raise ValueError naming the first setting that cannot work."""
    if not ids.is_valid_id(settings.name):
        raise ValueError(
            f"plugin name {settings.name!r} must be lowercase letters, digits, '-' or '_' (at most 64 characters)"
        )
    if not settings.subjects:
        raise ValueError("a plugin needs at least one subject to read")
    for subject in settings.subjects:
        check_subject(subject)
    if len(set(settings.subjects)) != len(settings.subjects):
        raise ValueError(f"subjects {list(settings.subjects)} name one subject twice")
    if settings.batch < 1 or settings.batch > 10_000:
        raise ValueError(f"batch must be from 1 to 10000, got {settings.batch}")
    if settings.max_attempts < 1:
        raise ValueError(f"max_attempts must be at least 1, got {settings.max_attempts}")
    if settings.on_exhausted not in ("stop", "skip"):
        raise ValueError(f"on_exhausted must be 'stop' or 'skip', got {settings.on_exhausted!r}")
    for field in ("poll_s", "max_poll_s", "max_backoff_s"):
        value = getattr(settings, field)
        if not value > 0:
            raise ValueError(f"{field} must be a positive number of seconds, got {value!r}")
    if settings.backoff_s < 0 or settings.backoff_s > settings.max_backoff_s:
        raise ValueError(
            f"backoff_s must be from 0 to max_backoff_s ({settings.max_backoff_s}), got {settings.backoff_s}"
        )
    if settings.poll_s > settings.max_poll_s:
        raise ValueError(f"poll_s must be at most max_poll_s ({settings.max_poll_s}), got {settings.poll_s}")


def check_subject(subject: str) -> None:
    """A filter subject must lie inside ``gt.evt.>``: the plugin reads GT_EVT, which holds nothing else."""
    tokens = subject.split(".")
    if tokens[:2] != EVT_PREFIX.split(".") or len(tokens) < 3:
        example = event_subject("bead", ">")
        raise ValueError(f"subject {subject!r} must start with '{EVT_PREFIX}.' (e.g. '{example}')")
    rest = tokens[2:]
    for index, part in enumerate(rest):
        if not _TOKEN.fullmatch(part) or (part == ">" and index != len(rest) - 1):
            raise ValueError(f"subject {subject!r} has an invalid token {part!r}")


def backoff(failures: int, *, base: float, cap: float) -> float:
    """Seconds to wait before redelivering an event that failed ``failures`` times in a row (1 = first)."""
    if failures < 1:
        return 0.0
    return float(min(cap, base * 2 ** min(failures - 1, 32)))


def matches(subject: str, pattern: str) -> bool:
    """Whether ``subject`` (no wildcards) is one ``pattern`` names (``*`` one token, a final ``>`` one or more)."""
    parts, wanted = subject.split("."), pattern.split(".")
    for index, part in enumerate(wanted):
        if part == ">":
            return len(parts) > index
        if index >= len(parts) or part not in ("*", parts[index]):
            return False
    return len(parts) == len(wanted)


def server_filter(subjects: tuple[str, ...]) -> str | None:
    """The filter a direct get can apply for the plugin (it takes one): the subject when there is one, else None
    (everything is read and ``matches`` picks)."""
    return subjects[0] if len(subjects) == 1 else None
