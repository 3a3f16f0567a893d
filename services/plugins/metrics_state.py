"""The metrics exporter's projection (a fold of the log) and its Prometheus text (written by
prometheus_client). Pure: no I/O, no clock.

Beads, sessions and merge requests are tracked only while they can still change; once final (closed,
ended, merged) they leave the maps and are counted, so memory follows the live work, not the history.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import msgspec
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from shared.model import events as ev
from shared.model.events.beads import BEAD_STATUSES, BeadStatus, forward
from shared.model.events.merge_requests import MR_IN_QUEUE, MR_STATUSES, MrStatus
from shared.model.events.sessions import SESSION_STATUSES, SessionStatus

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class MergeRequestInfo(msgspec.Struct, kw_only=True):
    rig: str
    status: MrStatus = "queued"


class MetricsState(msgspec.Struct, kw_only=True):
    last_seq: int = 0
    events: dict[str, int] = {}
    """Events by type, unknown types included."""
    undecodable: int = 0
    beads: dict[str, BeadStatus] = {}
    """Bead id -> status, for beads not closed yet."""
    closed_beads: int = 0
    sessions: dict[str, SessionStatus] = {}
    """Session id -> state, for sessions not ended yet."""
    ended_sessions: int = 0
    mrs: dict[str, MergeRequestInfo] = {}
    """Merge requests not merged yet."""
    merged_mrs: int = 0
    rigs: set[str] = set()


class ServiceFacts(msgspec.Struct, frozen=True, kw_only=True):
    """A service's answer to ``gt.q.<service>.status``."""

    last_seq: int
    caught_up: bool
    applied: int = 0
    """Events folded into its projection since it started."""
    commands_processed: int = 0
    commands_rejected: int = 0
    fold_errors: int = 0
    reconcile_errors: int = 0
    reconciles: int = 0
    """Patrols (reconcile passes) since it started."""
    patrol_last_s: float = 0.0
    patrol_max_s: float = 0.0
    patrol_total_s: float = 0.0
    uptime_s: float = 0.0


class LiveFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a scrape asks the town at that moment."""

    stream_last_seq: int | None = None
    """None: the stream could not be asked."""
    services: dict[str, ServiceFacts | None] = {}
    """Per service: its status, or None when it did not answer."""
    plugins: dict[str, int] = {}
    """Other plugins' consumers: plugin name -> acknowledged floor (stream sequence)."""


def apply(state: MetricsState, seq: int, env: ev.Envelope | None, payload: ev.Event | None) -> None:
    """Fold the event stored at ``seq``: ``env`` None when the envelope did not decode, ``payload`` None
    when its type is unknown here. Sequences at or below the last applied one are skipped."""
    if seq <= state.last_seq:
        return
    state.last_seq = seq
    if env is None:
        state.undecodable += 1
        return
    state.events[env.type] = state.events.get(env.type, 0) + 1
    if payload is not None:
        fold(payload, state)


@functools.singledispatch
def fold(payload: ev.Event, state: MetricsState) -> None:
    """Events without a gauge only count (in ``events``)."""


@fold.register
def _bead_created(payload: ev.BeadCreated, state: MetricsState) -> None:
    state.beads.setdefault(payload.bead_id, "open")


def _bead_forward(state: MetricsState, bead_id: str, status: BeadStatus) -> None:
    current = state.beads.get(bead_id)
    if current is not None:
        state.beads[bead_id] = forward(current, status)


@fold.register
def _bead_slung(payload: ev.BeadSlung, state: MetricsState) -> None:
    _bead_forward(state, payload.bead_id, "hooked")


@fold.register
def _bead_claimed(payload: ev.BeadClaimed, state: MetricsState) -> None:
    _bead_forward(state, payload.bead_id, "in_progress")


@fold.register
def _bead_closed(payload: ev.BeadClosed, state: MetricsState) -> None:
    if state.beads.pop(payload.bead_id, None) is not None:
        state.closed_beads += 1


@fold.register
def _session_requested(payload: ev.SessionRequested, state: MetricsState) -> None:
    state.sessions.setdefault(payload.session_id, "requested")


@fold.register
def _session_started(payload: ev.SessionStarted, state: MetricsState) -> None:
    if state.sessions.get(payload.session_id) == "requested":
        state.sessions[payload.session_id] = "started"


@fold.register
def _session_ended(payload: ev.SessionEnded, state: MetricsState) -> None:
    if state.sessions.pop(payload.session_id, None) is not None:
        state.ended_sessions += 1


@fold.register
def _rig_added(payload: ev.RigAdded, state: MetricsState) -> None:
    state.rigs.add(payload.rig)


@fold.register
def _mr_submitted(payload: ev.MergeRequestSubmitted, state: MetricsState) -> None:
    state.rigs.add(payload.rig)
    state.mrs.setdefault(payload.mr_id, MergeRequestInfo(rig=payload.rig))


def _mr_status(state: MetricsState, mr_id: str, status: MrStatus) -> None:
    mr = state.mrs.get(mr_id)
    if mr is not None:
        mr.status = status


@fold.register
def _mr_claimed(payload: ev.MergeRequestClaimed, state: MetricsState) -> None:
    _mr_status(state, payload.mr_id, "claimed")


@fold.register
def _mr_conflicted(payload: ev.MergeRequestConflicted, state: MetricsState) -> None:
    _mr_status(state, payload.mr_id, "conflicted" if payload.sent_back else "blocked")


@fold.register
def _mr_failed(payload: ev.MergeRequestFailed, state: MetricsState) -> None:
    _mr_status(state, payload.mr_id, "escalated" if payload.escalated else "failed")


@fold.register
def _mr_requeued(payload: ev.MergeRequestRequeued, state: MetricsState) -> None:
    _mr_status(state, payload.mr_id, "queued")


@fold.register
def _mr_rejected(payload: ev.MergeRequestRejected, state: MetricsState) -> None:
    _mr_status(state, payload.mr_id, "rejected")


@fold.register
def _mr_merged(payload: ev.MergeRequestMerged, state: MetricsState) -> None:
    if state.mrs.pop(payload.mr_id, None) is not None:
        state.merged_mrs += 1


# ---- exposition ----------------------------------------------------------------------------------


class _Families(Collector):
    """One scrape's metric families, in the order they were added, for prometheus_client's text writer."""

    def __init__(self) -> None:
        self.families: list[Metric] = []

    def collect(self) -> Iterable[Metric]:
        return self.families

    def family(self, name: str, kind: str, help_text: str) -> Metric:
        # Counter families are named without ``_total``: prometheus_client adds it to the family and its samples.
        family = CounterMetricFamily(name, help_text) if kind == "counter" else GaugeMetricFamily(name, help_text)
        self.families.append(family)
        return family


def _add(family: Metric, value: float, **labels: str) -> None:
    family.add_sample(family.name + ("_total" if family.type == "counter" else ""), labels, value)


def _by_label(family: Metric, label: str, values: Iterable[tuple[str, int]]) -> None:
    for key, value in values:
        _add(family, value, **{label: key})


def _counts(values: Iterable[str], known: tuple[str, ...]) -> list[tuple[str, int]]:
    counts = dict.fromkeys(known, 0)
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return sorted(counts.items(), key=lambda kv: (known.index(kv[0]) if kv[0] in known else len(known), kv[0]))


def render(state: MetricsState, live: LiveFacts, *, plugin: str) -> str:
    """The Prometheus text exposition (format 0.0.4, prometheus_client's writer) of the projection and of the
    scrape's facts."""
    out = _Families()
    events = out.family("gt_events_total", "counter", "Events in the log, by type (unknown types included).")
    _by_label(events, "type", sorted(state.events.items()))
    undecodable = out.family(
        "gt_events_undecodable_total", "counter", "Stored messages whose envelope does not decode."
    )
    _add(undecodable, state.undecodable)

    beads = _counts(state.beads.values(), BEAD_STATUSES)
    _by_label(
        out.family("gt_beads", "gauge", "Beads by status."),
        "status",
        [(s, n + state.closed_beads if s == "closed" else n) for s, n in beads],
    )

    sessions = _counts(state.sessions.values(), SESSION_STATUSES)
    _by_label(
        out.family("gt_sessions", "gauge", "Polecat sessions by state (ended: every session that ever ended)."),
        "state",
        [(s, n + state.ended_sessions if s == "ended" else n) for s, n in sessions],
    )

    depth = dict.fromkeys(state.rigs, 0)
    for mr in state.mrs.values():
        if mr.status in MR_IN_QUEUE:
            depth[mr.rig] = depth.get(mr.rig, 0) + 1
    _by_label(
        out.family("gt_merge_queue_depth", "gauge", "Merge requests queued or being processed, by rig."),
        "rig",
        sorted(depth.items()),
    )
    mrs = _counts((mr.status for mr in state.mrs.values()), MR_STATUSES)
    _by_label(
        out.family("gt_merge_requests", "gauge", "Merge requests by status (merged: every one that ever merged)."),
        "status",
        [(s, n + state.merged_mrs if s == "merged" else n) for s, n in mrs],
    )

    if live.stream_last_seq is not None:
        _add(out.family("gt_stream_last_seq", "gauge", "Sequence of the last event in the log."), live.stream_last_seq)
    up = out.family("gt_service_up", "gauge", "1 when the service answered its status query during this scrape.")
    for service, facts in sorted(live.services.items()):
        _add(up, int(facts is not None), service=service)
    if live.stream_last_seq is not None:
        lag = out.family("gt_projection_lag", "gauge", "Events in the log the service has not applied yet.")
        for service, facts in sorted(live.services.items()):
            if facts is not None:
                _add(lag, max(0, live.stream_last_seq - facts.last_seq), service=service)
    caught_up = out.family(
        "gt_service_caught_up", "gauge", "1 when the service has caught up with the log since it started."
    )
    for service, facts in sorted(live.services.items()):
        if facts is not None:
            _add(caught_up, int(facts.caught_up), service=service)

    _service_figures(out, live)

    plugins = {**live.plugins, plugin: state.last_seq}
    _by_label(
        out.family(
            "gt_plugin_last_seq",
            "gauge",
            "Last sequence a plugin handled: this exporter's applied sequence, other plugins' acknowledged floor.",
        ),
        "plugin",
        sorted(plugins.items()),
    )
    return generate_latest(out).decode()


_SERVICE_COUNTERS = (
    ("gt_service_events_applied_total", "applied", "Events the service folded into its projection since it started."),
    ("gt_service_commands_total", "commands_processed", "Commands the service settled since it started."),
    ("gt_service_commands_rejected_total", "commands_rejected", "Commands it rejected since it started."),
    ("gt_service_fold_errors_total", "fold_errors", "Events its projection failed to fold since it started."),
    ("gt_service_patrol_errors_total", "reconcile_errors", "Patrols that failed since it started."),
    ("gt_service_patrols_total", "reconciles", "Patrols (reconcile passes) since it started."),
    ("gt_service_patrol_seconds_total", "patrol_total_s", "Seconds spent patrolling since it started."),
)
_SERVICE_GAUGES = (
    ("gt_service_patrol_last_seconds", "patrol_last_s", "How long its last patrol took."),
    ("gt_service_patrol_max_seconds", "patrol_max_s", "Its longest patrol since it started."),
    ("gt_service_uptime_seconds", "uptime_s", "Seconds since the service process started."),
)


def _service_figures(out: _Families, live: LiveFacts) -> None:
    """What each service says of itself at the scrape (its status query): counters restart from 0 with the
    process, as Prometheus counters do."""
    answered = sorted((name, facts) for name, facts in live.services.items() if facts is not None)
    for families, kind in ((_SERVICE_COUNTERS, "counter"), (_SERVICE_GAUGES, "gauge")):
        for name, attr, help_text in families:
            family = out.family(name, kind, help_text)
            for service, facts in answered:
                _add(family, getattr(facts, attr), service=service)
