"""Events nobody can decode (invalid UTF-8 in the envelope or the payload, nesting past the recursion limit,
lone surrogates): the decoders raise ``EventDecodeError`` and nothing else, a projection skips them, and the
plugin SDK passes them over without calling the plugin's handler."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gt.dashboard import view
from services.mayor.projection import new_projection
from shared.core.config import TownConfig
from shared.core.errors import EventDecodeError
from shared.model.events import REGISTRY, BeadCreated, Envelope, Event, decode_envelope, encode_event
from shared.plugins import Plugin, PluginSettings
from shared.plugins.sdk import Delivery

DEEP = 100_000


def bead_created(title: str = "TITLE", actor: str = "mayor") -> bytes:
    event = BeadCreated(bead_id="hq-bad", title=title)
    return encode_event(event, event_id="ev-bad", ts=datetime(2026, 1, 1, tzinfo=UTC), actor=actor)


POISONED = [
    bead_created().replace(b'"TITLE"', b'"\xff\xfe"'),
    bead_created().replace(b'"TITLE"', b"[" * DEEP + b"]" * DEEP),
    bead_created().replace(b'"TITLE"', b'"\\ud800"'),
    bead_created(actor="ACTOR").replace(b'"ACTOR"', b'"\xff"'),
    bead_created().replace(b'"mayor"', b'"' + b"x" * 10 + b'", "zzz": ' + b"[" * DEEP + b"]" * DEEP),
    b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    b"\xff\xfe\x00",
]


@pytest.mark.parametrize("data", POISONED)
def test_decoding_an_undecodable_event_raises_event_decode_error_only(data: bytes) -> None:
    with pytest.raises(EventDecodeError):
        REGISTRY.decode_payload(decode_envelope(data))


def test_a_projection_skips_undecodable_events_and_folds_the_next() -> None:
    projection = new_projection()
    for seq, data in enumerate(POISONED, start=1):
        projection.apply(seq, "gt.evt.bead.hq-bad", data)
    good = encode_event(
        BeadCreated(bead_id="hq-good", title="fine"), event_id="ev-good", ts=datetime.now(UTC), actor="mayor"
    )
    projection.apply(len(POISONED) + 1, "gt.evt.bead.hq-good", good)
    assert projection.skipped == len(POISONED)
    assert projection.last_seq == len(POISONED) + 1
    assert "hq-good" in projection.state.beads


async def test_the_plugin_sdk_passes_undecodable_events_over(tmp_path: Path) -> None:
    seen: list[tuple[int, Event | None]] = []

    async def handler(seq: int, env: Envelope, payload: Event | None) -> None:
        seen.append((seq, payload))

    plugin = Plugin(TownConfig(gt_home=tmp_path), PluginSettings(name="fuzz"), handler)
    for seq, data in enumerate(POISONED, start=1):
        await plugin.handle_message(Delivery(seq, "gt.evt.bead.hq-bad", data, 1, 0))
    # An envelope that decodes reaches the handler with no payload; one that does not is passed over.
    assert all(payload is None for _, payload in seen)
    assert plugin.undecodable + plugin.unknown == len(POISONED)


def test_the_dashboard_feed_skips_undecodable_events() -> None:
    state = view.DashboardState()
    entries = [view.apply(state, seq, data) for seq, data in enumerate(POISONED, start=1)]
    assert entries == [None] * len(POISONED)
    assert state.undecodable == len(POISONED)
