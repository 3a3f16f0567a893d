"""What a plugin is called, what it reads and how it retries: checked before anything connects. Pure."""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from shared import ids
from shared.subjects import DEFAULT_PLUGIN_BUCKET, EVT_PREFIX, event_subject

PLUGIN_BUCKET = DEFAULT_PLUGIN_BUCKET
"""KV bucket of idempotence marks (``<plugin>.<event id>``) and abandoned events (``<plugin>.dead.<seq>``)."""
CONSUMER_PREFIX = "plugin-"
ALL_EVENTS = EVT_PREFIX + ".>"
DEFAULT_MARK_TTL_S = 7 * 24 * 3600.0
"""How long a mark is kept. An event comes again only while its plugin has not acknowledged it: within
seconds while the plugin runs, or when it next starts; a plugin down for longer than this may repeat the
side effects of the one batch it held when it died."""
_TOKEN = re.compile(r"^(\*|>|[a-z0-9][a-z0-9_-]{0,63})$")

Exhausted = Literal["stop", "skip"]


class PluginSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How one plugin consumes ``GT_EVT``; ``validate`` says what is wrong with a bad one."""

    name: str
    """Names the durable consumer (``plugin-<name>``) and the plugin's marks; an id token."""
    subjects: tuple[str, ...] = (ALL_EVENTS,)
    """Filter subjects under ``gt.evt.``, e.g. ``gt.evt.bead.>``."""
    replay_from_start: bool = False
    """Start over: the consumer delivers the whole log again and the plugin's marks are forgotten."""
    batch: int = 64
    """Events fetched per pull request; the handler still sees them one at a time, in order."""
    ack_wait_s: float = 60.0
    """An event held this long without an acknowledgement or a progress signal is delivered again. The SDK
    signals progress while the handler works, so this only matters after the process died."""
    max_attempts: int = 5
    """Failed handler calls in a row for one event before ``on_exhausted`` applies."""
    backoff_s: float = 0.5
    """Wait before the first redelivery of a failed event; doubles per failure up to ``max_backoff_s``."""
    max_backoff_s: float = 30.0
    on_exhausted: Exhausted = "stop"
    """``stop``: the plugin stops with an error and the event stays unacknowledged, so it is the first one
    handled after a restart. ``skip``: the event is logged, recorded as ``<plugin>.dead.<seq>`` in the
    bucket, terminated (never delivered again) and the plugin goes on."""
    long_poll_s: float = 10.0
    """How long one pull request waits for a new event when the plugin has caught up."""
    idle_heartbeat_s: float = 2.0
    """Server heartbeat during a long poll: a request that hears nothing for three of these is given up."""
    mark_ttl_s: float = DEFAULT_MARK_TTL_S
    """TTL of the marks bucket when this plugin creates it (an existing bucket keeps its own)."""

    @property
    def consumer(self) -> str:
        return CONSUMER_PREFIX + self.name


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
    for field in ("ack_wait_s", "long_poll_s", "idle_heartbeat_s", "mark_ttl_s", "max_backoff_s"):
        value = getattr(settings, field)
        if not value > 0:
            raise ValueError(f"{field} must be a positive number of seconds, got {value!r}")
    if settings.backoff_s < 0 or settings.backoff_s > settings.max_backoff_s:
        raise ValueError(
            f"backoff_s must be from 0 to max_backoff_s ({settings.max_backoff_s}), got {settings.backoff_s}"
        )
    if settings.idle_heartbeat_s * 2 > settings.long_poll_s:
        raise ValueError("idle_heartbeat_s must be at most half of long_poll_s, or no heartbeat arrives in a poll")


def check_subject(subject: str) -> None:
    """A filter subject must lie inside ``gt.evt.>``: the consumer is on GT_EVT, which holds nothing else."""
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
