"""The agent heartbeat (``gt heartbeat``): one encoder, one decoder, and the bytes of the previous version."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

from shared.model import heartbeats

NOW = datetime(2026, 11, 29, 13, 24, 25, 123456, tzinfo=UTC)


def test_what_a_previous_agent_wrote_is_read() -> None:
    # Byte for byte what `gt heartbeat` wrote before the struct: json.dumps of a dict, an isoformat time.
    old = json.dumps({"ts": NOW.isoformat(), "session": "hq-abc-1", "note": "running the suite"}).encode()
    beat = heartbeats.decode_agent(old)
    assert beat == heartbeats.AgentHeartbeat(ts=NOW, session="hq-abc-1", note="running the suite")


def test_what_this_version_writes_reads_as_the_previous_readers_read_it() -> None:
    beat = heartbeats.agent_heartbeat("hq-abc-1", "x" * 600, NOW)
    body = json.loads(heartbeats.encode_agent(beat))
    assert list(body) == ["ts", "session", "note"]
    assert datetime.fromisoformat(body["ts"]) == NOW, "the previous witness, deacon and gt status parse it so"
    assert (body["session"], len(body["note"])) == ("hq-abc-1", heartbeats.AGENT_NOTE_CHARS)
    assert heartbeats.decode_agent(heartbeats.encode_agent(beat)) == beat


def test_a_naive_time_is_utc_and_another_zone_is_kept() -> None:
    naive = heartbeats.decode_agent(b'{"ts": "2020-01-01T00:00:00"}')
    assert naive is not None
    assert naive.ts == datetime(2020, 1, 1, tzinfo=UTC)
    assert naive.session == naive.note == ""
    east = heartbeats.decode_agent(b'{"ts": "2020-01-01T02:00:00+02:00", "session": "s", "note": ""}')
    assert east is not None
    assert east.ts == datetime(2020, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))


def test_what_is_no_heartbeat_is_none() -> None:
    for value in (None, b"", b"{", b"[]", b'{"session": "s"}', b'{"ts": 5}', b'{"ts": "yesterday"}', b"\xff"):
        assert heartbeats.decode_agent(value) is None, value
