"""The plugin SDK's and the shipped plugins' pure parts: settings, where a plugin starts reading, mark keys, the
archive's line format and rotation rule, the metrics fold and its Prometheus text, the metrics endpoint's HTTP answers.

Events are real ones, encoded as the services store them and decoded as the plugins decode them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from services.plugins import archive_format as fmt
from services.plugins.http import PageServer
from services.plugins.metrics_state import (
    LiveFacts,
    MetricsState,
    ServiceFacts,
    apply,
    render,
)
from shared.bus.topology import PLUGIN_MARK_TTL_S
from shared.core.errors import UnknownEventTypeError
from shared.model import events as ev
from shared.plugins.marks import dead_key, mark_key
from shared.plugins.position import encode_position, parse_position, plan_start
from shared.plugins.settings import (
    ALL_EVENTS,
    DEFAULT_MARK_TTL_S,
    PluginSettings,
    backoff,
    matches,
    position_key,
    server_filter,
    validate,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def stored(payload: ev.Event, *, event_id: str = "ev-1", ts: datetime = T0) -> bytes:
    return ev.encode_event(payload, event_id=event_id, ts=ts, actor="test")


class TestSettings:
    def test_the_defaults_are_valid_and_name_the_position(self) -> None:
        settings = PluginSettings(name="notify")
        validate(settings)
        assert settings.position_key == "notify.position.last"
        assert settings.subjects == (ALL_EVENTS,)
        assert DEFAULT_MARK_TTL_S == PLUGIN_MARK_TTL_S  # the TTL the services make the marks bucket with

    @pytest.mark.parametrize(
        ("fields", "names"),
        [
            ({"name": "Notify"}, "plugin name"),
            ({"name": "a.b"}, "plugin name"),
            ({"name": ""}, "plugin name"),
            ({"subjects": ("gt.cmd.>",)}, "must start with 'gt.evt.'"),
            ({"subjects": ("gt.evt",)}, "must start with 'gt.evt.'"),
            ({"subjects": ("gt.evt.>.bead",)}, "invalid token"),
            ({"subjects": ("gt.evt.Bead.>",)}, "invalid token"),
            ({"subjects": ("gt.evt.bead.>", "gt.evt.bead.>")}, "twice"),
            ({"subjects": ()}, "at least one subject"),
            ({"batch": 0}, "batch"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"on_exhausted": "ignore"}, "on_exhausted"),
            ({"poll_s": 0.0}, "poll_s"),
            ({"max_poll_s": -1.0}, "max_poll_s"),
            ({"backoff_s": 60.0}, "backoff_s"),
            ({"poll_s": 2.0}, "poll_s must be at most max_poll_s"),
        ],
    )
    def test_a_setting_that_cannot_work_is_named(self, fields: dict[str, object], names: str) -> None:
        settings = msgspec.structs.replace(PluginSettings(name="ok"), **fields)
        with pytest.raises(ValueError, match=re.escape(names)):
            validate(settings)

    def test_filters_inside_the_log_are_accepted(self) -> None:
        validate(PluginSettings(name="beads", subjects=("gt.evt.bead.>", "gt.evt.cmd.*", "gt.evt.mr.mr-1")))

    def test_backoff_doubles_and_is_bounded(self) -> None:
        waits = [backoff(n, base=0.5, cap=30.0) for n in range(12)]
        assert waits[:5] == [0.0, 0.5, 1.0, 2.0, 4.0]
        assert max(waits) == 30.0
        assert waits == sorted(waits)
        assert backoff(10_000, base=0.5, cap=30.0) == 30.0


class TestFilters:
    @pytest.mark.parametrize(
        ("subject", "pattern", "expected"),
        [
            ("gt.evt.bead.hq-1", "gt.evt.>", True),
            ("gt.evt.bead.hq-1", "gt.evt.bead.>", True),
            ("gt.evt.bead.hq-1", "gt.evt.bead.*", True),
            ("gt.evt.bead.hq-1", "gt.evt.*.hq-1", True),
            ("gt.evt.bead.hq-1", "gt.evt.bead.hq-1", True),
            ("gt.evt.bead.hq-1", "gt.evt.mr.>", False),
            ("gt.evt.bead.hq-1", "gt.evt.bead", False),
            ("gt.evt.bead", "gt.evt.bead.>", False),
            ("gt.evt.bead.hq-1.x", "gt.evt.bead.*", False),
            ("gt.evt.cmd.c-1", "gt.evt.cmd.*", True),
        ],
    )
    def test_a_subject_matches_a_filter_as_nats_matches_it(self, subject: str, pattern: str, expected: bool) -> None:
        assert matches(subject, pattern) is expected

    def test_one_filter_is_left_to_the_server_several_are_applied_by_the_plugin(self) -> None:
        assert server_filter(("gt.evt.bead.>",)) == "gt.evt.bead.>"
        assert server_filter(("gt.evt.bead.>", "gt.evt.mr.>")) is None


class TestStartPlan:
    def test_a_new_plugin_reads_the_whole_log(self) -> None:
        assert plan_start(None, replay=False, resume_after=None) == (1, "new")

    def test_a_plugin_resumes_after_its_recorded_position(self) -> None:
        assert plan_start(40, replay=False, resume_after=None) == (41, "position")
        assert plan_start(0, replay=False, resume_after=None, consumer_floor=30) == (1, "position")

    def test_a_replay_starts_over_whatever_is_recorded(self) -> None:
        for recorded in (None, 0, 40):
            assert plan_start(recorded, replay=True, resume_after=7, consumer_floor=3) == (1, "replay_from_start")

    def test_a_plugin_record_wins_over_the_position(self) -> None:
        # Lines lost from a buffer are read again; a record ahead of the position is where the plugin stands.
        assert plan_start(40, replay=False, resume_after=35) == (36, "plugin_record")
        assert plan_start(30, replay=False, resume_after=35) == (36, "plugin_record")
        assert plan_start(None, replay=False, resume_after=0) == (1, "plugin_record")

    def test_an_earlier_versions_consumer_floor_is_used_only_when_nothing_else_says(self) -> None:
        assert plan_start(None, replay=False, resume_after=None, consumer_floor=30) == (31, "consumer_floor")
        assert plan_start(None, replay=False, resume_after=12, consumer_floor=30) == (13, "plugin_record")

    def test_a_negative_sequence_is_refused(self) -> None:
        for fields in ({"resume_after": -1}, {"resume_after": None, "consumer_floor": -1}):
            with pytest.raises(ValueError, match="sequence"):
                plan_start(None, replay=False, **fields)
        with pytest.raises(ValueError, match="recorded"):
            plan_start(-1, replay=False, resume_after=None)

    def test_a_position_is_ascii_digits_and_anything_else_reads_as_none(self) -> None:
        assert encode_position(42) == b"42"
        assert parse_position(encode_position(42)) == 42
        assert parse_position(b" 7\n") == 7
        for junk in (b"", b"-1", b"x", b"\xff", b"4.2"):
            assert parse_position(junk) is None


class TestMarkKeys:
    def test_a_mark_is_plugin_dot_event_id(self) -> None:
        assert mark_key("notify", "ev-0a1b2c") == "notify.ev-0a1b2c"

    def test_a_foreign_id_that_is_no_token_gets_a_stable_digest(self) -> None:
        key = mark_key("notify", "Some.Foreign id*")
        assert key == mark_key("notify", "Some.Foreign id*")
        assert key != mark_key("notify", "Some.Foreign id")
        assert re.fullmatch(r"notify\.evt-[0-9a-f]{24}", key)

    def test_abandoned_events_and_the_position_never_collide_with_marks(self) -> None:
        assert dead_key("notify", 42) == "notify.dead.42"
        assert dead_key("notify", 42).count(".") == 2
        assert mark_key("notify", "dead").count(".") == 1
        assert position_key("notify") == "notify.position.last"
        assert mark_key("notify", "position").count(".") == 1
        assert position_key("notify") != dead_key("notify", 0)


class TestArchiveFormat:
    def test_a_line_keeps_the_envelope_byte_for_byte(self) -> None:
        data = b'{"id": "ev-1",  "type":"bead.created","ts":"2026-03-01T12:00:00Z","actor":"x","data":{}}'
        line = fmt.encode_line(41, "gt.evt.bead.hq-1", data)
        assert line.endswith(b"}\n")
        assert line.count(b"\n") == 1
        assert json.loads(line) == {"seq": 41, "subject": "gt.evt.bead.hq-1", "envelope": json.loads(data)}
        assert fmt.decode_line(line) == fmt.ArchivedEvent(41, "gt.evt.bead.hq-1", data)

    @pytest.mark.parametrize("data", [b"\x00\xffnot json", b'{"a":\n 1}', b"", b'{"a": "b"'])
    def test_bytes_that_are_not_one_json_line_are_kept_as_base64(self, data: bytes) -> None:
        line = fmt.encode_line(7, "gt.evt.x.y", data)
        parsed = json.loads(line)
        assert base64.b64decode(parsed["raw"]) == data
        assert "envelope" not in parsed
        assert fmt.decode_line(line).data == data

    @pytest.mark.parametrize(
        "line", [b"garbage\n", b'{"seq": 1}\n', b'{"seq": 1, "subject": "s"}\n', b'{"seq":1,"subject":"s","raw":"*"}\n']
    )
    def test_a_damaged_line_is_an_error_naming_where(self, line: bytes) -> None:
        with pytest.raises(fmt.ArchiveCorruptError, match=r"events-1\.jsonl:3"):
            fmt.decode_line(line, "events-1.jsonl:3")

    def test_file_names_sort_in_log_order_and_announce_their_first_sequence(self) -> None:
        names = [fmt.file_name(seq) for seq in (1, 9, 10, 123_456)]
        assert names == sorted(names)
        assert names[0] == "events-000000000001.jsonl"
        assert [fmt.first_seq_of(n) for n in names] == [1, 9, 10, 123_456]
        assert fmt.first_seq_of("events-12.jsonl") == 12
        assert fmt.first_seq_of("README.md") is None
        assert fmt.first_seq_of("events-12.jsonl.tmp") is None

    def test_event_time_reads_the_envelope_and_takes_a_bare_time_as_utc(self) -> None:
        assert fmt.event_time(stored(ev.BeadCreated(bead_id="hq-1", title="t"))) == T0
        assert fmt.event_time(b'{"ts": "2026-03-01T12:00:00"}') == T0
        assert fmt.event_time(b"not json") is None
        assert fmt.event_time(b'{"id": "x"}') is None

    def test_rotation_by_size_never_leaves_a_file_empty(self) -> None:
        def by_size(file_bytes: int, line_bytes: int, max_bytes: int) -> bool:
            return fmt.should_rotate(
                file_bytes=file_bytes, line_bytes=line_bytes, first_ts=T0, ts=T0, max_bytes=max_bytes, max_age_s=0.0
            )

        assert not by_size(0, 5000, 1000)  # a line larger than the limit gets a file of its own
        assert not by_size(900, 100, 1000)
        assert by_size(901, 100, 1000)
        assert not by_size(10**9, 100, 0)

    def test_rotation_by_age_goes_by_the_events_own_time(self) -> None:
        def by_age(first_ts: datetime | None, ts: datetime | None) -> bool:
            return fmt.should_rotate(
                file_bytes=10, line_bytes=10, first_ts=first_ts, ts=ts, max_bytes=0, max_age_s=3600.0
            )

        assert not by_age(T0, T0 + timedelta(minutes=59))
        assert by_age(T0, T0 + timedelta(hours=1))
        assert not by_age(None, T0 + timedelta(days=9))
        assert not by_age(T0, None)
        assert not fmt.should_rotate(
            file_bytes=0, line_bytes=10, first_ts=T0, ts=T0 + timedelta(days=9), max_bytes=0, max_age_s=3600.0
        )


def fold_all(state: MetricsState, events: list[ev.Event], *, start: int = 1) -> None:
    for offset, event in enumerate(events):
        env = ev.decode_envelope(stored(event, event_id=f"ev-{start + offset}"))
        apply(state, start + offset, env, ev.REGISTRY.decode_payload(env))


def submitted(mr: str, rig: str = "demo") -> ev.MergeRequestSubmitted:
    return ev.MergeRequestSubmitted(mr_id=mr, bead="hq-1", rig=rig, branch="b", target="main", head="0" * 40)


def requested(session: str) -> ev.SessionRequested:
    return ev.SessionRequested(
        session_id=session,
        rig="demo",
        polecat="ace",
        bead="hq-1",
        worktree="/w",
        branch="b",
        tmux_name="gt-demo-ace",
        attempt=1,
    )


SAMPLE = re.compile(r'^[a-z_]+(\{[a-z_]+="(?:[^"\\]|\\.)*"(,[a-z_]+="(?:[^"\\]|\\.)*")*\})? -?[0-9]+(\.[0-9]+)?$')


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ ", line), line
            continue
        assert SAMPLE.match(line), line
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


class TestMetricsFold:
    def test_bead_statuses_only_move_forward_and_closed_ones_leave_the_map(self) -> None:
        state = MetricsState()
        fold_all(
            state,
            [
                ev.BeadCreated(bead_id="hq-1", title="a"),
                ev.BeadCreated(bead_id="hq-2", title="b"),
                ev.BeadCreated(bead_id="hq-3", title="c"),
                ev.BeadClaimed(bead_id="hq-2", assignee="ann"),
                ev.BeadSlung(bead_id="hq-2", rig="demo", forced=True),  # a forced re-sling keeps in_progress
                ev.BeadSlung(bead_id="hq-3", rig="demo"),
                ev.BeadClosed(bead_id="hq-1"),
                ev.BeadClosed(bead_id="hq-1"),  # closing again counts once
                ev.BeadClosed(bead_id="hq-404"),  # a bead this view never saw
            ],
        )
        assert state.beads == {"hq-2": "in_progress", "hq-3": "hooked"}
        assert state.closed_beads == 1
        got = samples(render(state, LiveFacts(), plugin="metrics"))
        assert [got[f'gt_beads{{status="{s}"}}'] for s in ("open", "hooked", "in_progress", "closed")] == [0, 1, 1, 1]

    def test_sessions_by_state(self) -> None:
        state = MetricsState()
        fold_all(
            state,
            [
                requested("s-1"),
                requested("s-2"),
                requested("s-3"),
                ev.SessionStarted(session_id="s-1", pane_pid=10, pid_started=1.0),
                ev.SessionStarted(session_id="s-2", pane_pid=11, pid_started=1.0),
                ev.SessionEnded(session_id="s-2", reason="done"),
                ev.SessionStarted(session_id="s-2", pane_pid=11, pid_started=1.0),  # late: ended stays ended
            ],
        )
        got = samples(render(state, LiveFacts(), plugin="metrics"))
        assert got['gt_sessions{state="requested"}'] == 1
        assert got['gt_sessions{state="started"}'] == 1
        assert got['gt_sessions{state="ended"}'] == 1

    def test_merge_queue_depth_counts_queued_and_claimed_per_rig(self) -> None:
        state = MetricsState()
        fold_all(
            state,
            [
                ev.RigAdded(rig="idle", repo="/r/idle.git", prefix="id", agent_command="gt-agent"),
                submitted("mr-1"),
                submitted("mr-2"),
                submitted("mr-3"),
                submitted("mr-4", rig="other"),
                ev.MergeRequestClaimed(mr_id="mr-1", attempt=1, holder="refinery", lease_until=T0),
                ev.MergeRequestConflicted(mr_id="mr-2", target_commit="c", conflict_command="conflict-1"),
                ev.MergeRequestFailed(mr_id="mr-3", gate="test", exit_code=1),
                ev.MergeRequestRequeued(mr_id="mr-3", reason="retry"),
                ev.MergeRequestClaimed(mr_id="mr-4", attempt=1, holder="refinery", lease_until=T0),
                ev.MergeRequestMerged(mr_id="mr-4", merged_commit="m", target_before="t"),
            ],
        )
        got = samples(render(state, LiveFacts(), plugin="metrics"))
        assert got['gt_merge_queue_depth{rig="demo"}'] == 2  # mr-1 claimed, mr-3 queued again
        assert got['gt_merge_queue_depth{rig="other"}'] == 0
        assert got['gt_merge_queue_depth{rig="idle"}'] == 0
        assert got['gt_merge_requests{status="blocked"}'] == 1
        assert got['gt_merge_requests{status="merged"}'] == 1

    def test_every_event_counts_by_type_unknown_and_undecodable_ones_too(self) -> None:
        state = MetricsState()
        fold_all(state, [ev.BeadCreated(bead_id="hq-1", title="a"), ev.BeadCreated(bead_id="hq-2", title="b")])
        future = ev.decode_envelope(b'{"id":"x","type":"beacon.lit","ts":"2026-03-01T12:00:00Z","actor":"a","data":{}}')
        with pytest.raises(UnknownEventTypeError):
            ev.REGISTRY.decode_payload(future)
        apply(state, 3, future, None)
        apply(state, 4, None, None)
        apply(state, 2, future, None)  # a redelivery of an applied sequence changes nothing
        got = samples(render(state, LiveFacts(), plugin="metrics"))
        assert got['gt_events_total{type="bead.created"}'] == 2
        assert got['gt_events_total{type="beacon.lit"}'] == 1
        assert got["gt_events_undecodable_total"] == 1
        assert got['gt_plugin_last_seq{plugin="metrics"}'] == 4


class TestMetricsText:
    def test_services_up_down_and_their_lag(self) -> None:
        live = LiveFacts(
            stream_last_seq=120,
            services={
                "mayor": ServiceFacts(last_seq=118, caught_up=True),
                "witness": None,
                "refinery": ServiceFacts(last_seq=121, caught_up=True),  # answered after a later event
            },
            plugins={"archiver": 100},
        )
        text = render(MetricsState(last_seq=120), live, plugin="metrics")
        got = samples(text)
        assert got["gt_stream_last_seq"] == 120
        assert got['gt_service_up{service="mayor"}'] == 1
        assert got['gt_service_up{service="witness"}'] == 0
        assert got['gt_projection_lag{service="mayor"}'] == 2
        assert got['gt_projection_lag{service="refinery"}'] == 0
        assert 'gt_projection_lag{service="witness"}' not in got
        assert got['gt_plugin_last_seq{plugin="archiver"}'] == 100
        assert got['gt_plugin_last_seq{plugin="metrics"}'] == 120
        assert "# TYPE gt_events_total counter" in text
        assert "# TYPE gt_merge_queue_depth gauge" in text
        assert text.endswith("\n")

    def test_each_service_figures_come_from_its_own_status(self) -> None:
        mayor = ServiceFacts(
            last_seq=10,
            caught_up=True,
            applied=10,
            commands_processed=7,
            commands_rejected=2,
            reconciles=4,
            patrol_last_s=0.25,
            patrol_max_s=0.5,
            patrol_total_s=1.0,
            uptime_s=30.0,
        )
        text = render(
            MetricsState(), LiveFacts(stream_last_seq=10, services={"mayor": mayor, "witness": None}), plugin="m"
        )
        got = samples(text)
        assert got['gt_service_events_applied_total{service="mayor"}'] == 10
        assert got['gt_service_commands_total{service="mayor"}'] == 7
        assert got['gt_service_commands_rejected_total{service="mayor"}'] == 2
        assert got['gt_service_patrols_total{service="mayor"}'] == 4
        assert got['gt_service_patrol_seconds_total{service="mayor"}'] == 1.0
        assert got['gt_service_patrol_last_seconds{service="mayor"}'] == 0.25
        assert got['gt_service_patrol_max_seconds{service="mayor"}'] == 0.5
        assert got['gt_service_uptime_seconds{service="mayor"}'] == 30.0
        assert not any('service="witness"' in name and name.startswith("gt_service_patrol") for name in got)
        assert "# TYPE gt_service_patrols_total counter" in text
        assert "# TYPE gt_service_patrol_last_seconds gauge" in text

    def test_without_the_stream_there_is_no_lag_but_still_liveness(self) -> None:
        live = LiveFacts(stream_last_seq=None, services={"mayor": ServiceFacts(last_seq=5, caught_up=False)})
        got = samples(render(MetricsState(), live, plugin="metrics"))
        assert "gt_stream_last_seq" not in got
        assert not any(name.startswith("gt_projection_lag") for name in got)
        assert got['gt_service_up{service="mayor"}'] == 1
        assert got['gt_service_caught_up{service="mayor"}'] == 0

    def test_label_values_are_escaped(self) -> None:
        state = MetricsState(events={'odd"type\\x': 1})
        line = next(x for x in render(state, LiveFacts(), plugin="m").splitlines() if x.startswith("gt_events_total{"))
        assert line == 'gt_events_total{type="odd\\"type\\\\x"} 1.0'
        assert SAMPLE.match(line)


class TestPageServer:
    """The metrics endpoint's HTTP (aiohttp's): GET on its path is the page, anything else 404, garbage 400, and
    every answer says its length and closes the connection."""

    @staticmethod
    async def exchange(raw: bytes) -> tuple[bytes, bytes]:
        async def page() -> str:
            return "gt_up 1\n"

        server = PageServer(page, host="127.0.0.1", port=0, path="/metrics", content_type="text/plain; version=0.0.4")
        port = await server.start()
        serving = asyncio.create_task(server.serve_forever())
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(raw)
            answer = await asyncio.wait_for(reader.read(), 10)  # to the end: the server closes the connection
            writer.close()
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        head, _, body = answer.partition(b"\r\n\r\n")
        return head, body

    @pytest.mark.parametrize(
        "raw", [b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"GET /metrics?name[]=x HTTP/1.0\r\n\r\n"]
    )
    async def test_get_on_the_path_is_the_page(self, raw: bytes) -> None:
        head, body = await self.exchange(raw)
        assert head.split(b"\r\n")[0].endswith(b" 200 OK")
        assert b"Content-Type: text/plain; version=0.0.4" in head
        assert body == b"gt_up 1\n"

    @pytest.mark.parametrize(
        "raw", [b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"]
    )
    async def test_anything_else_is_404_with_its_length_and_a_close(self, raw: bytes) -> None:
        head, body = await self.exchange(raw)
        assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert b"Content-Length: 33" in head
        assert b"Connection: close" in head
        assert body == b"only GET /metrics is served here\n"

    @pytest.mark.parametrize(
        "raw",
        [b"GET metrics HTTP/1.1\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00"],  # a TLS hello on the plain port
    )
    async def test_a_malformed_request_is_400(self, raw: bytes) -> None:
        head, _ = await self.exchange(raw)
        assert b" 400 Bad Request\r\n" in head
