"""The dashboard's fold keeps the open convoys and the last few closed ones: a long-lived town closes convoys for
ever, and the page would list them all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gt.dashboard import view
from shared.model.events import BeadClosed, BeadCreated, ConvoyClosed, ConvoyCreated, Event, encode_event

START = datetime(2026, 1, 1, tzinfo=UTC)


def fold(events: list[Event]) -> dict[str, object]:
    state = view.DashboardState()
    for seq, event in enumerate(events, start=1):
        raw = encode_event(event, event_id=f"ev-{seq}", ts=START + timedelta(seconds=seq), actor="mayor")
        view.apply(state, seq, raw)
    return view.render(state)


def test_the_open_convoys_then_the_last_closed_newest_first_and_the_older_closed_counted() -> None:
    events: list[Event] = []
    for n in range(8):
        events += [
            BeadCreated(bead_id=f"hq-b{n}", title=f"bead {n}"),
            ConvoyCreated(convoy_id=f"cv-c{n}", title=f"convoy {n}", beads=[f"hq-b{n}"]),
        ]
    events.append(ConvoyCreated(convoy_id="cv-open", title="still open", beads=["hq-b0"]))
    for n in range(8):
        events += [BeadClosed(bead_id=f"hq-b{n}", reason="done"), ConvoyClosed(convoy_id=f"cv-c{n}")]
    shown = fold(events)
    convoys = shown["convoys"]
    assert isinstance(convoys, list)
    assert [c["id"] for c in convoys] == ["cv-open", "cv-c7", "cv-c6", "cv-c5", "cv-c4", "cv-c3"]
    assert shown["older_closed_convoys"] == 3
    assert convoys[0]["closed"] == 1, "a dropped convoy's beads still count where an open convoy tracks them"
