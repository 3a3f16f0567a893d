"""The projection base: skip what was applied, survive unknown events, snapshot and restore."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest
from structlog.testing import capture_logs

from services.mayor.projection import SCHEMA_VERSION, new_projection
from services.mayor.state import MayorState
from shared.core.errors import EventLogLostError
from shared.model.events import BeadClosed, BeadCreated, encode_event

TS = datetime(2026, 5, 1, tzinfo=UTC)


def _created(bead_id: str, title: str = "t") -> bytes:
    return encode_event(BeadCreated(bead_id=bead_id, title=title), event_id=f"e-{bead_id}", ts=TS, actor="op")


def test_a_sequence_at_or_below_the_last_applied_is_skipped() -> None:
    projection = new_projection()
    projection.apply(1, "gt.evt.bead.hq-1", _created("hq-1", "first"))
    projection.apply(1, "gt.evt.bead.hq-1", _created("hq-1", "replayed"))
    projection.apply(2, "gt.evt.bead.hq-2", _created("hq-2"))
    projection.apply(2, "gt.evt.bead.hq-2", _created("hq-2", "again"))
    assert projection.last_seq == 2
    assert projection.applied == 2
    assert projection.state.beads["hq-1"].title == "first"
    assert projection.state.beads["hq-2"].title == "t"


def test_unknown_and_undecodable_events_are_logged_once_per_kind_and_skipped() -> None:
    projection = new_projection()
    unknown = b'{"id":"x","type":"rig.teleported","ts":"2026-05-01T00:00:00Z","actor":"a","data":{}}'
    with capture_logs() as logs:
        projection.apply(1, "gt.evt.rig.r", unknown)
        projection.apply(2, "gt.evt.rig.r", unknown)
        projection.apply(3, "gt.evt.bead.b", b"garbage")
        projection.apply(4, "gt.evt.bead.hq-1", _created("hq-1"))
    assert projection.last_seq == 4
    assert projection.skipped == 3
    assert list(projection.state.beads) == ["hq-1"]
    skipped = [entry for entry in logs if entry["event"] == "event_skipped"]
    assert [entry["seq"] for entry in skipped] == [1, 3]


def test_an_event_stored_on_another_aggregates_subject_is_skipped_not_folded() -> None:
    # A writer allowed one aggregate's subjects only (a gate runner: gt.evt.gate.>) stores a close there: no close.
    projection = new_projection()
    closed = encode_event(BeadClosed(bead_id="hq-1", reason="forged"), event_id="c", ts=TS, actor="refinery")
    with capture_logs() as logs:
        projection.apply(1, "gt.evt.bead.hq-1", _created("hq-1"))
        projection.apply(2, "gt.evt.gate.g1", closed)
        projection.apply(3, "gt.evt.gate.g2", closed)
        projection.apply(4, "gt.evt.beads.hq-1", closed)  # a prefix of the bead's aggregate is not the aggregate
    assert projection.state.beads["hq-1"].status == "open"
    assert (projection.last_seq, projection.skipped, projection.applied) == (4, 3, 1)
    misplaced = [entry for entry in logs if entry["event"] == "event_misplaced"]
    assert [(entry["seq"], entry["subject"]) for entry in misplaced] == [(2, "gt.evt.gate.g1")], "once per type"
    projection.apply(5, "gt.evt.bead.hq-1", closed)
    assert projection.state.beads["hq-1"].closed_at is not None, "on its own subject it is a close"


def test_skip_to_moves_the_last_sequence_forward_only() -> None:
    projection = new_projection()
    projection.apply(3, "gt.evt.bead.hq-1", _created("hq-1"))
    projection.skip_to(10)
    projection.skip_to(7)
    assert (projection.last_seq, projection.applied) == (10, 1)
    projection.apply(9, "gt.evt.bead.hq-2", _created("hq-2"))
    assert "hq-2" not in projection.state.beads, "what it read past is not applied later"


def _filled() -> tuple[bytes, object]:
    projection = new_projection()
    for seq in range(1, 6):
        projection.apply(seq, f"gt.evt.bead.hq-{seq}", _created(f"hq-{seq}"))
    projection.apply(6, "gt.evt.bead.hq-1", encode_event(BeadClosed(bead_id="hq-1"), event_id="c", ts=TS, actor="a"))
    return projection.snapshot("stream-A"), projection


def test_a_snapshot_restores_state_and_sequence() -> None:
    data, original = _filled()
    restored = new_projection()
    assert restored.restore(data, stream_id="stream-A", stream_last_seq=6)
    assert restored.last_seq == 6
    assert restored.serialize_state() == original.serialize_state()  # type: ignore[attr-defined]
    assert list(restored.state.beads) == [f"hq-{i}" for i in range(1, 6)]  # creation order survives


@pytest.mark.parametrize(
    ("mangle", "stream_id", "stream_last", "reason"),
    [
        (lambda d: d[: len(d) // 2], "stream-A", 6, "undecodable"),
        (lambda d: b"\x00" + d, "stream-A", 6, "undecodable"),
    ],
)
def test_an_unusable_snapshot_is_ignored_and_leaves_the_state_empty(
    mangle: object, stream_id: str, stream_last: int, reason: str
) -> None:
    data, _ = _filled()
    projection = new_projection()
    with capture_logs() as logs:
        assert not projection.restore(mangle(data), stream_id=stream_id, stream_last_seq=stream_last)  # type: ignore[operator]
    assert projection.last_seq == 0
    assert projection.state == MayorState()
    assert any(e["event"] == "snapshot_ignored" and e["reason"] == reason for e in logs)


@pytest.mark.parametrize(
    ("stream_id", "stream_last", "said"),
    [("stream-B", 6, "not the stream the mayor's snapshot was taken of"), ("stream-A", 5, "holds 5 events, fewer")],
)
def test_a_snapshot_of_another_or_a_longer_log_says_the_log_was_lost(
    stream_id: str, stream_last: int, said: str
) -> None:
    # The log is not the town's any more (recreated, or shorter than what the snapshot covers): replaying it would
    # start an empty (or foreign) town over the old one's work. Refused, the state untouched.
    data, _ = _filled()
    projection = new_projection()
    with pytest.raises(EventLogLostError, match=said):
        projection.restore(data, stream_id=stream_id, stream_last_seq=stream_last)
    assert projection.last_seq == 0
    assert projection.state == MayorState()


def test_a_snapshot_of_another_schema_is_ignored() -> None:
    data, _ = _filled()

    class OtherState(msgspec.Struct, kw_only=True):
        beads: dict[str, int] = {}

    from shared.service.projection import Projection

    other = Projection("mayor", OtherState, lambda *a: None, schema_version=1)
    with capture_logs() as logs:
        assert not other.restore(data, stream_id="stream-A", stream_last_seq=6)
    assert logs[-1]["reason"] == "schema_fingerprint_differs"
    # Bumping the schema version of the same state type also invalidates old snapshots.
    bumped = Projection("mayor", MayorState, lambda *a: None, schema_version=SCHEMA_VERSION + 1)
    assert not bumped.restore(data, stream_id="stream-A", stream_last_seq=6)


def test_state_with_a_snapshot_then_the_tail_equals_a_full_replay() -> None:
    events = [(seq, f"gt.evt.bead.hq-{seq}", _created(f"hq-{seq}", f"title {seq}")) for seq in range(1, 21)]
    full = new_projection()
    for seq, subject, data in events:
        full.apply(seq, subject, data)
    head = new_projection()
    for seq, subject, data in events[:12]:
        head.apply(seq, subject, data)
    resumed = new_projection()
    assert resumed.restore(head.snapshot("s"), stream_id="s", stream_last_seq=20)
    for seq, subject, data in events:  # the whole log again: the first 12 must be skipped
        resumed.apply(seq, subject, data)
    assert resumed.serialize_state() == full.serialize_state()


def test_a_fold_that_raises_is_logged_skipped_and_does_not_stop_the_projection() -> None:
    import functools

    from shared.model.events import Envelope, Event
    from shared.service.projection import Projection

    @functools.singledispatch
    def fold(payload: Event, state: MayorState, env: Envelope, seq: int) -> None:
        if isinstance(payload, BeadClosed):
            raise KeyError("a bug in the fold")
        state.commands_accepted += 1

    projection = Projection("buggy", MayorState, fold, schema_version=1)
    closed = encode_event(BeadClosed(bead_id="hq-1"), event_id="c", ts=TS, actor="a")
    with capture_logs() as logs:
        projection.apply(1, "gt.evt.bead.hq-1", _created("hq-1"))
        projection.apply(2, "gt.evt.bead.hq-1", closed)
        projection.apply(3, "gt.evt.bead.hq-2", _created("hq-2"))
    assert projection.last_seq == 3
    assert projection.fold_errors == 1
    assert projection.state.commands_accepted == 2
    failed = [e for e in logs if e["event"] == "event_fold_failed"]
    assert len(failed) == 1
    assert (failed[0]["seq"], failed[0]["type"]) == (2, "bead.closed")
