"""The mayor on a real server: commands published as raw bytes (as the nats CLI does), outcomes, queries,
bad input, redelivery, snapshots and the service lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import nats.js.errors
import pytest
from nats.aio.client import Client

from services.mayor.projection import new_projection
from services.mayor.service import MayorService
from shared.bus.append import Appender, PendingEvent
from shared.bus.snapshots import SnapshotStore
from shared.core import ids
from shared.core.config import TownConfig
from shared.model.events import CommandAccepted, encode_event
from shared.service import ServiceSettings
from tests.helpers import assert_eventually, serving, started
from tests.log_tools import SEEDED_RIGS, digest, fresh_replay, outcome_of, outcomes, read_all, seed_rigs

FAST = ServiceSettings(patrol_interval=0.5, idle_heartbeat=0.5, snapshot_check_interval=0.2)


@contextlib.asynccontextmanager
async def run_mayor(
    town: TownConfig,
    settings: ServiceSettings = FAST,
    rigs: tuple[str, ...] = SEEDED_RIGS,
    *,
    service_class: type[MayorService] = MayorService,
) -> AsyncIterator[MayorService]:
    """A mayor on the town's server; ``rigs`` are in the log (as a witness would have added them) once it is
    ready, so slings to them are accepted."""
    service = service_class(town, settings)
    async with serving(service, name="mayor"):
        if rigs:
            assert service.nc is not None
            assert service.reader is not None
            await service.reader.wait_for_seq(await seed_rigs(service.nc, *rigs), timeout=30)
        yield service


@pytest.fixture
async def mayor(town: TownConfig) -> AsyncIterator[MayorService]:
    async with run_mayor(town) as service:
        yield service


async def pub(nc: Client, subject: str, body: bytes | dict[str, Any], msg_id: str | None = None) -> None:
    """What `nats pub <subject> '<json>' [-H Nats-Msg-Id:<id>]` does: a plain publish."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    await nc.publish(subject, raw, headers={"Nats-Msg-Id": msg_id} if msg_id else None)
    await nc.flush()


async def ask(nc: Client, what: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    reply = await nc.request(f"gt.q.mayor.{what}", json.dumps(body or {}).encode(), timeout=15)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


async def latest_seq(nc: Client) -> int:
    return int((await nc.jetstream().stream_info("GT_EVT")).state.last_seq)


class TestCommandPath:
    async def test_a_create_published_with_a_msg_id_header_is_accepted(self, nc: Client, mayor: MayorService) -> None:
        await pub(nc, "gt.cmd.bead.create", {"title": "Fix the frobulator", "labels": ["p1"]}, msg_id="op-1")
        outcome = await outcome_of(nc, "op-1")
        assert outcome["type"] == "cmd.accepted"
        assert outcome["command"] == "bead.create"
        bead_id = outcome["result"]["id"]
        assert [e["type"] for e in outcome["events"]] == ["bead.created"]
        answer = await ask(nc, "get", {"id": bead_id, "min_seq": outcome["seq"]})
        assert answer["ok"]
        assert answer["result"]["title"] == "Fix the frobulator"
        assert answer["result"]["created_by"] == "operator"

    async def test_a_create_without_any_id_is_answered_under_its_stream_sequence(
        self, nc: Client, mayor: MayorService
    ) -> None:
        ack = await nc.jetstream().publish("gt.cmd.bead.create", b'{"title": "no id"}')
        outcome = await outcome_of(nc, f"cmd-{ack.seq}")
        assert outcome["type"] == "cmd.accepted"

    async def test_actor_and_correlation_from_the_body_are_recorded(self, nc: Client, mayor: MayorService) -> None:
        body = {"title": "t", "cmd_id": "c-actor", "actor": "operator:ann", "correlation_id": "sprint-7"}
        await pub(nc, "gt.cmd.bead.create", body)
        outcome = await outcome_of(nc, "c-actor")
        [(_, _, raw)] = await read_all(nc, "GT_EVT", outcome["events"][0]["subject"])
        envelope = json.loads(raw)
        assert (envelope["actor"], envelope["causation_id"], envelope["correlation_id"]) == (
            "operator:ann",
            "c-actor",
            "sprint-7",
        )

    async def test_the_same_msg_id_twice_gives_one_outcome_and_one_bead(self, nc: Client, mayor: MayorService) -> None:
        for _ in range(3):
            await pub(nc, "gt.cmd.bead.create", {"title": "once"}, msg_id="dup-1")
        await outcome_of(nc, "dup-1")
        await pub(nc, "gt.cmd.bead.create", {"title": "marker"}, msg_id="after")
        await outcome_of(nc, "after")
        assert len((await outcomes(nc))["dup-1"]) == 1
        beads = (await ask(nc, "list", {"min_seq": await latest_seq(nc)}))["result"]
        assert [b["title"] for b in beads].count("once") == 1

    async def test_a_body_cmd_id_sent_twice_has_no_second_effect(self, nc: Client, mayor: MayorService) -> None:
        # Both copies are stored (no header, so GT_CMD cannot deduplicate them); the id still makes one outcome.
        await pub(nc, "gt.cmd.bead.create", {"title": "body id", "cmd_id": "body-1"})
        await outcome_of(nc, "body-1")
        await pub(nc, "gt.cmd.bead.create", {"title": "body id", "cmd_id": "body-1"})
        await pub(nc, "gt.cmd.bead.create", {"title": "marker", "cmd_id": "body-2"})
        await outcome_of(nc, "body-2")
        await assert_eventually(lambda: mayor.intake is not None and mayor.intake.duplicates >= 1)
        assert len((await outcomes(nc))["body-1"]) == 1
        beads = (await ask(nc, "list", {"min_seq": await latest_seq(nc)}))["result"]
        assert [b["title"] for b in beads].count("body id") == 1

    async def test_a_header_id_with_dots_and_spaces_is_replaced_by_a_stable_digest(
        self, nc: Client, mayor: MayorService
    ) -> None:
        raw_id = "ops.team 2026/* create"
        await pub(nc, "gt.cmd.bead.create", {"title": "odd id"}, msg_id=raw_id)
        outcome = await outcome_of(nc, ids.stable_digest_id(raw_id))
        assert outcome["type"] == "cmd.accepted"
        assert outcome["command_id"] == ids.stable_digest_id(raw_id)

    async def test_a_command_whose_outcome_is_already_stored_changes_nothing(
        self, nc: Client, town: TownConfig, mayor: MayorService
    ) -> None:
        # As after a crash between storing the outcome and acking the command: the redelivered command
        # must find its outcome and produce neither a second outcome nor a second effect.
        outcome = CommandAccepted(command_id="crashed-1", command="bead.create", result={"id": "hq-earlier"})
        data = encode_event(outcome, event_id="ev-prior", ts=datetime.now(UTC), actor="mayor")
        appender = Appender(nc, town.evt_stream)
        await appender.append(
            [PendingEvent(subject="gt.evt.cmd.crashed-1", data=data, event_id="ev-prior", expected_seq=0)]
        )
        before = await latest_seq(nc)
        await pub(nc, "gt.cmd.bead.create", {"title": "again"}, msg_id="crashed-1")
        await pub(nc, "gt.cmd.bead.create", {"title": "marker"}, msg_id="marker-1")
        await outcome_of(nc, "marker-1")
        log = await read_all(nc, "GT_EVT")
        after_prior = [json.loads(d)["type"] for seq, _, d in log if seq > before]
        assert after_prior == ["bead.created", "cmd.accepted"]  # the marker only
        assert len((await outcomes(nc))["crashed-1"]) == 1

    async def test_read_your_writes_a_command_sees_the_bead_an_earlier_outcome_reported(
        self, nc: Client, mayor: MayorService
    ) -> None:
        parent_id = None
        for i in range(30):
            body: dict[str, Any] = {"title": f"link {i}"}
            if parent_id:
                body["parent"] = parent_id
            await pub(nc, "gt.cmd.bead.create", body, msg_id=f"chain-{i}")
            outcome = await outcome_of(nc, f"chain-{i}")
            assert outcome["type"] == "cmd.accepted", outcome
            parent_id = outcome["result"]["id"]

    async def test_commands_on_one_bead_apply_in_order(self, nc: Client, mayor: MayorService) -> None:
        await pub(nc, "gt.cmd.bead.create", {"title": "t"}, msg_id="seq-0")
        bead_id = (await outcome_of(nc, "seq-0"))["result"]["id"]
        for i in range(1, 41):
            await nc.publish(
                "gt.cmd.bead.update",
                json.dumps({"id": bead_id, "labels": [f"l{i}"]}).encode(),
                headers={"Nats-Msg-Id": f"seq-{i}"},
            )
        await nc.flush()
        for i in range(1, 41):
            assert (await outcome_of(nc, f"seq-{i}"))["type"] == "cmd.accepted"
        bead = (await ask(nc, "get", {"id": bead_id, "min_seq": await latest_seq(nc)}))["result"]
        assert bead["labels"] == [f"l{i}" for i in range(1, 41)]


BAD_INPUT = [
    ("bad-json", "gt.cmd.bead.create", b"\xff\xfe not json", "malformed"),
    ("bad-array", "gt.cmd.bead.create", b'[{"title": "x"}]', "malformed"),
    ("bad-types", "gt.cmd.bead.create", b'{"title": "x", "priority": "high"}', "invalid"),
    ("bad-no-title", "gt.cmd.bead.create", b'{"description": "no title"}', "invalid"),
    ("bad-verb", "gt.cmd.bead.explode", b'{"id": "hq-1"}', "unknown_command"),
    ("bad-aggregate", "gt.cmd.frobnicator.spin", b"{}", "unknown_command"),
    ("bad-large", "gt.cmd.bead.create", b'{"title": "' + b"x" * (2 * 1024 * 1024) + b'"}', "too_large"),
    ("bad-dot-id", "gt.cmd.bead.close", b'{"id": "hq.1"}', "invalid"),
    ("bad-space-id", "gt.cmd.bead.close", b'{"id": "hq 1"}', "invalid"),
    ("bad-wild-id", "gt.cmd.bead.close", b'{"id": "hq-*"}', "invalid"),
    ("bad-wild-parent", "gt.cmd.bead.create", b'{"title": "x", "parent": "gt.>"}', "invalid"),
    ("bad-missing", "gt.cmd.bead.close", b'{"id": "hq-nothere"}', "not_found"),
]


class TestBadInput:
    async def test_each_bad_command_gets_one_rejection_and_valid_ones_around_it_take_effect(
        self, nc: Client, mayor: MayorService
    ) -> None:
        await pub(nc, "gt.cmd.bead.create", {"title": "closed early"}, msg_id="good-0")
        closed_id = (await outcome_of(nc, "good-0"))["result"]["id"]
        await pub(nc, "gt.cmd.bead.close", {"id": closed_id}, msg_id="good-close")
        await outcome_of(nc, "good-close")
        cases = [
            *BAD_INPUT,
            (
                "bad-backward",
                "gt.cmd.bead.claim",
                json.dumps({"id": closed_id, "assignee": "a"}).encode(),
                "backward_transition",
            ),
        ]
        for i, (cmd_id, subject, body, _) in enumerate(cases):
            await pub(nc, "gt.cmd.bead.create", {"title": f"good {i}"}, msg_id=f"good-{i + 1}")
            await pub(nc, subject, body, msg_id=cmd_id)
        await pub(nc, "gt.cmd.bead.create", {"title": "good last"}, msg_id="good-last")

        for cmd_id, subject, _, code in cases:
            outcome = await outcome_of(nc, cmd_id)
            assert (outcome["type"], outcome["code"]) == ("cmd.rejected", code), (cmd_id, outcome)
            assert outcome["message"]
            assert outcome["command"] == subject.removeprefix("gt.cmd.")
        for i in range(1, len(cases) + 1):
            assert (await outcome_of(nc, f"good-{i}"))["type"] == "cmd.accepted"
        assert (await outcome_of(nc, "good-last"))["type"] == "cmd.accepted"
        counts = {cmd_id: len(found) for cmd_id, found in (await outcomes(nc)).items()}
        assert all(count == 1 for count in counts.values()), counts
        status = (await ask(nc, "status"))["result"]
        assert status["caught_up"]
        assert status["connected"]
        assert status["commands_rejected"] == len(cases)

    async def test_a_body_over_the_server_limit_is_refused_at_publish_and_nothing_is_lost(
        self, nc: Client, mayor: MayorService
    ) -> None:
        import nats.errors

        with pytest.raises(nats.errors.MaxPayloadError):
            await nc.publish("gt.cmd.bead.create", b"x" * (5 * 1024 * 1024))
        await pub(nc, "gt.cmd.bead.create", {"title": "still fine"}, msg_id="after-huge")
        assert (await outcome_of(nc, "after-huge"))["type"] == "cmd.accepted"


class TestIntakeRobustness:
    async def test_a_decide_bug_or_an_oversized_decision_is_rejected_and_the_mayor_keeps_serving(
        self, nc: Client, town: TownConfig
    ) -> None:
        from shared.model.commands import BeadCreate, Command
        from shared.model.decision import Accepted, DecideContext, NewEvent
        from shared.model.events import BeadCreated

        class Flawed(MayorService):
            def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
                if isinstance(cmd, BeadCreate) and cmd.title == "bug":
                    raise ZeroDivisionError("a bug in a decision")
                if isinstance(cmd, BeadCreate) and cmd.title == "huge":
                    events = [NewEvent(BeadCreated(bead_id=f"hq-{i}", title="x"), 0) for i in range(1200)]
                    return Accepted(events=events, result={})
                return super().decide(cmd, ctx)

        service = Flawed(town, FAST)
        task = asyncio.create_task(service.run())
        try:
            await asyncio.wait_for(service.ready.wait(), 30)
            await pub(nc, "gt.cmd.bead.create", {"title": "bug"}, msg_id="flaw-1")
            await pub(nc, "gt.cmd.bead.create", {"title": "huge"}, msg_id="flaw-2")
            await pub(nc, "gt.cmd.bead.create", {"title": "fine"}, msg_id="flaw-3")
            bug = await outcome_of(nc, "flaw-1")
            assert (bug["type"], bug["code"]) == ("cmd.rejected", "invalid")
            assert "ZeroDivisionError" in bug["message"]
            huge = await outcome_of(nc, "flaw-2")
            assert (huge["type"], huge["code"]) == ("cmd.rejected", "too_large")
            assert (await outcome_of(nc, "flaw-3"))["type"] == "cmd.accepted"
            assert not task.done()
        finally:
            await service.shutdown()
            await task


class TestCommandsHeldByADeadInstance:
    """A mayor killed while it holds a command (delivered, not acked) leaves it to JetStream, which hands it out
    again only after the ack wait. The 1,000-bead chaos run caught the next mayor settling the agent's next
    `step.done` first: rejected ("needs run-tests done first"), and the bead merged without its last step."""

    STEPS = ("load-context", "implement", "commit", "self-review")

    async def _held_by_a_dead_mayor(self, nc: Client, subject: str, body: dict[str, Any], msg_id: str) -> int:
        """Store the command and take it the way a mayor does, then vanish without acking it."""
        await pub(nc, subject, body, msg_id=msg_id)
        sub = await nc.jetstream().pull_subscribe_bind("mayor-cmd", "GT_CMD")
        [msg] = await sub.fetch(1, timeout=10)
        assert msg.subject == subject
        await sub.unsubscribe()
        return int(msg.metadata.sequence.stream)

    async def test_the_next_mayor_settles_the_held_command_before_the_newer_one_of_the_same_bead(
        self, nc: Client, town: TownConfig
    ) -> None:
        async with run_mayor(town):
            await pub(nc, "gt.cmd.bead.create", {"title": "held step"}, msg_id="held-bead")
            bead = (await outcome_of(nc, "held-bead"))["result"]["id"]
            await pub(nc, "gt.cmd.bead.sling", {"id": bead, "rig": "demo"}, msg_id="held-sling")
            assert (await outcome_of(nc, "held-sling"))["type"] == "cmd.accepted"
            for step in self.STEPS:
                await pub(nc, "gt.cmd.step.done", {"bead": bead, "step": step}, msg_id=f"held-{step}")
                assert (await outcome_of(nc, f"held-{step}"))["type"] == "cmd.accepted"
        # The mayor is gone. The agent's `gt step done run-tests` is stored, and a mayor takes it and dies.
        held_seq = await self._held_by_a_dead_mayor(
            nc, "gt.cmd.step.done", {"bead": bead, "step": "run-tests"}, "held-run-tests"
        )
        # `gt step done` said "durably queued", so the agent went on with its next step.
        await pub(nc, "gt.cmd.step.done", {"bead": bead, "step": "submit"}, msg_id="held-submit")
        info = await nc.jetstream().consumer_info("GT_CMD", "mayor-cmd")
        assert info.num_ack_pending == 1

        async with run_mayor(town) as mayor:
            run_tests = await outcome_of(nc, "held-run-tests")
            submit = await outcome_of(nc, "held-submit")
            assert run_tests["type"] == "cmd.accepted", run_tests
            assert submit["type"] == "cmd.accepted", submit
            assert run_tests["seq"] < submit["seq"], "settled in the order they were stored"
            assert submit["result"]["complete"] is True
            molecule = (await ask(nc, "molecule", {"bead": bead, "min_seq": submit["seq"]}))["result"]
            assert (molecule["done"], molecule["total"]) == (6, 6)
            intake = mayor.intake
            assert intake is not None
            await assert_eventually(lambda: intake.held_settled == 1)
            # The held delivery comes back after its ack wait; its outcome is found stored and it is acked.
            await assert_eventually(lambda: intake.duplicates >= 1, timeout=60)

            async def nothing_pending() -> bool:
                state = await nc.jetstream().consumer_info("GT_CMD", "mayor-cmd")
                return (state.num_ack_pending, state.num_pending) == (0, 0)

            drained: bool = await assert_eventually(nothing_pending, timeout=60)
            assert drained
        assert len((await outcomes(nc))["held-run-tests"]) == 1
        assert len((await outcomes(nc))["held-submit"]) == 1
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().get_msg("GT_CMD", held_seq)
            raise AssertionError("the held command is still stored in GT_CMD")

    async def test_a_held_command_whose_outcome_was_stored_is_not_carried_out_again(
        self, nc: Client, town: TownConfig
    ) -> None:
        """A mayor settles a held command (outcome and effects stored) and dies before the redelivery it acks;
        the next mayor finds it held still, and its stored outcome. A create would make a second bead."""
        async with run_mayor(town):
            pass  # provisions the command consumer
        await self._held_by_a_dead_mayor(nc, "gt.cmd.bead.create", {"title": "exactly once"}, "once-create")
        async with run_mayor(town) as first:
            assert (await outcome_of(nc, "once-create"))["type"] == "cmd.accepted"
            first_intake = first.intake
            assert first_intake is not None
            await assert_eventually(lambda: first_intake.held_settled == 1)
        async with run_mayor(town) as second:
            await pub(nc, "gt.cmd.bead.create", {"title": "marker"}, msg_id="once-marker")
            marker = await outcome_of(nc, "once-marker")
            second_intake = second.intake
            assert second_intake is not None
            # Still held when this mayor started: it is settled again, and found settled.
            await assert_eventually(lambda: (second_intake.held_settled, second_intake.duplicates) == (1, 1))
            assert len((await outcomes(nc))["once-create"]) == 1
            beads = (await ask(nc, "list", {"min_seq": marker["seq"]}))["result"]
            assert [b["title"] for b in beads].count("exactly once") == 1


class TestQueries:
    async def test_queries_answer_errors_with_codes(self, nc: Client, mayor: MayorService) -> None:
        assert (await ask(nc, "get", {"id": "hq-none"}))["code"] == "not_found"
        assert (await ask(nc, "teleport"))["code"] == "unknown_query"
        assert (await ask(nc, "list", {"min_seq": -2}))["code"] == "invalid"  # (-1: the log's last, LATEST_SEQ)
        reply = await nc.request("gt.q.mayor.list", b"[1,2]", timeout=5)
        assert json.loads(reply.data)["code"] == "malformed"
        reply = await nc.request("gt.q.mayor.list", b"{nope", timeout=5)
        assert json.loads(reply.data)["code"] == "malformed"

    async def test_a_query_waits_for_min_seq_and_says_when_it_cannot(self, nc: Client, mayor: MayorService) -> None:
        start = await latest_seq(nc)  # the seeded rigs
        waiting = asyncio.ensure_future(ask(nc, "list", {"min_seq": start + 2}))
        await pub(nc, "gt.cmd.bead.create", {"title": "t"}, msg_id="w-1")
        answer = await waiting
        assert answer["ok"]
        assert answer["seq"] >= start + 2
        assert [b["title"] for b in answer["result"]] == ["t"]

    async def test_the_bodies_an_operator_types_with_nats_req_are_answered_as_documented(
        self, nc: Client, mayor: MayorService
    ) -> None:
        """docs/operating.md and README.md: `nats req gt.q.mayor.list '{"label": "backend"}'`, byte for byte; the
        server decodes the body into the query's class (shared.model.queries.registry), which ignores unknown fields."""
        await pub(nc, "gt.cmd.bead.create", {"title": "api", "labels": ["backend"]}, msg_id="req-1")
        await pub(nc, "gt.cmd.bead.create", {"title": "css", "labels": ["frontend"]}, msg_id="req-2")
        await outcome_of(nc, "req-1")
        bead = (await outcome_of(nc, "req-2"))["result"]["id"]
        await mayor.catch_up()

        async def req(what: str, typed: bytes) -> dict[str, Any]:
            reply = await nc.request(f"gt.q.mayor.{what}", typed, timeout=15)
            answer: dict[str, Any] = json.loads(reply.data)
            return answer

        listed = await req("list", b'{"label": "backend"}')
        assert (listed["ok"], [b["title"] for b in listed["result"]], listed["next"]) == (True, ["api"], None)
        assert [b["title"] for b in (await req("ready", b"{}"))["result"]] == ["api", "css"]
        assert [b["title"] for b in (await req("ready", b""))["result"]] == ["api", "css"], "no body: {}"
        assert (await req("get", f'{{"id": "{bead}"}}'.encode()))["result"]["title"] == "css"
        digest = await req("digest", b"{}")
        assert digest["result"]["last_seq"] == digest["seq"]
        assert (await req("status", b'{"min_seq": "whatever"}'))["result"]["service"] == "mayor", "status: at once"
        unknown_field = await req("list", b'{"label": "backend", "colour": "red"}')
        assert unknown_field["result"] == listed["result"], "a field it does not know is ignored, as it always was"
        for what, body, field in (
            ("get", b"{}", "id"),
            ("get", b'{"id": ""}', "id"),
            ("list", b'{"limit": "5"}', "limit"),
            ("list", b'{"limit": -1}', "limit"),
            ("list", b'{"include_closed": "yes"}', "include_closed"),
            ("inbox", b'{"to": 7}', "to"),
            ("list", b'{"min_seq": true}', "min_seq"),
        ):
            bad = await req(what, body)
            assert (bad["ok"], bad["code"]) == (False, "invalid"), (what, body)
            assert bad["message"].startswith(f"gt.q.mayor.{what}: "), bad["message"]
            assert f"`{field}`" in bad["message"], bad["message"]
        teleport = await req("teleport", b"{}")
        assert teleport["code"] == "unknown_query"
        assert "it answers get, list, ready" in teleport["message"]
        assert teleport["message"].endswith("status, digest")


class TestSnapshots:
    async def test_a_restart_from_a_snapshot_equals_a_full_replay(self, nc: Client, town: TownConfig) -> None:
        async with run_mayor(town) as first:
            for i in range(60):
                await pub(nc, "gt.cmd.bead.create", {"title": f"b{i}", "labels": [f"l{i % 3}"]}, msg_id=f"s-{i}")
            await outcome_of(nc, "s-59")
            await assert_eventually(lambda: first.projection.last_seq >= 120)
        snapshot_seq = await latest_seq(nc)  # shutdown stored a snapshot covering everything so far
        # A tail the snapshot does not have, written by a mayor that keeps no snapshots.
        async with run_mayor(town, msgspec.structs.replace(FAST, use_snapshots=False)) as tail_writer:
            assert tail_writer.projection.applied == snapshot_seq
            for i in range(10):
                await pub(nc, "gt.cmd.bead.create", {"title": f"tail {i}"}, msg_id=f"t-{i}")
            await outcome_of(nc, "t-9")
        last = await latest_seq(nc)
        assert last == snapshot_seq + 20
        async with run_mayor(town) as resumed:
            await assert_eventually(lambda: resumed.projection.last_seq == last)
            assert resumed.projection.applied == last - snapshot_seq  # only the tail came from the log
            replayed = await fresh_replay(nc, new_projection(), upto=last)
            assert digest(resumed.projection) == digest(replayed)
            answer = await ask(nc, "digest")
            assert answer["result"] == {"last_seq": last, "sha256": digest(replayed)}

    @pytest.mark.parametrize("damage", ["garbage", "other_fingerprint"])
    async def test_a_damaged_snapshot_is_ignored_and_the_log_rebuilds_the_state(
        self, nc: Client, town: TownConfig, damage: str
    ) -> None:
        async with run_mayor(town, rigs=()):
            for i in range(20):
                await pub(nc, "gt.cmd.bead.create", {"title": f"b{i}"}, msg_id=f"d-{i}")
            await outcome_of(nc, "d-19")
        store = SnapshotStore(nc, town.snapshot_bucket)
        good = await store.load("mayor")
        assert good is not None
        if damage == "garbage":
            await store.save("mayor", b"\x93not a snapshot")
        else:
            snap = msgspec.msgpack.decode(good)
            snap[0] = "0" * 32
            await store.save("mayor", msgspec.msgpack.encode(snap))
        async with run_mayor(town, rigs=()) as rebuilt:
            await assert_eventually(lambda: rebuilt.projection.last_seq == 40)
            assert rebuilt.projection.applied == 40  # everything came from the log
            replayed = await fresh_replay(nc, new_projection())
            assert digest(rebuilt.projection) == digest(replayed)


class TestLifecycle:
    async def test_shutdown_before_run_is_safe_and_run_then_returns_at_once(self, town: TownConfig) -> None:
        service = MayorService(town, FAST)
        await service.shutdown()
        await service.shutdown()
        await asyncio.wait_for(service.run(), 5)

    async def test_run_twice_is_refused(self, town: TownConfig) -> None:
        async with run_mayor(town) as service:
            with pytest.raises(RuntimeError, match="already ran"):
                await service.run()

    async def test_shutdown_finishes_when_a_heartbeat_swallowed_the_stop(self, town: TownConfig) -> None:
        # nats-py waits for replies with asyncio.wait_for, which on 3.11 drops a cancel that lands as the reply
        # arrives: the heartbeat loop then lost the one cancel that was to end it, and shutdown hung for good.
        in_put = asyncio.Event()
        swallowed = 0

        service = MayorService(town, ServiceSettings(patrol_interval=0.2, heartbeat_interval=0.2))
        put = service.heartbeats.put

        async def swallowing_put(*, stopping: bool = False) -> None:
            nonlocal swallowed
            await put(stopping=stopping)
            if stopping or swallowed:
                return
            in_put.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                swallowed += 1

        service.heartbeats.put = swallowing_put  # type: ignore[method-assign]
        task = await started(service, name="mayor")
        await asyncio.wait_for(in_put.wait(), 30)
        await service.shutdown()
        done, _ = await asyncio.wait({task}, timeout=30)
        if not done:
            # Unstick it, so the failure is reported instead of hanging the event loop's teardown.
            for stuck in asyncio.all_tasks():
                if stuck.get_name() == "heartbeats":
                    stuck.cancel()
            await asyncio.wait({task}, timeout=30)
        assert done, "run() did not return after shutdown()"
        task.result()
        assert swallowed == 1

    async def test_a_fatal_error_comes_out_of_run(self, nc: Client, town: TownConfig) -> None:
        from shared.core.errors import NotProvisionedError  # the bus's words for nats-py's NotFoundError

        service = MayorService(town, ServiceSettings(patrol_interval=0.2, idle_heartbeat=0.5))
        task = asyncio.create_task(service.run())
        await asyncio.wait_for(service.ready.wait(), 30)
        await nc.jetstream().delete_stream(town.evt_stream)  # the log itself is gone: nothing to serve from
        with pytest.raises(NotProvisionedError):
            await asyncio.wait_for(task, 60)
        await service.shutdown()  # still safe afterwards

    async def test_a_failing_reconcile_is_logged_and_the_service_keeps_serving(
        self, nc: Client, town: TownConfig
    ) -> None:
        class Broken(MayorService):
            async def reconcile(self) -> None:
                raise LookupError("reconcile exploded")

        service = Broken(town, ServiceSettings(patrol_interval=0.1, idle_heartbeat=0.5))
        task = asyncio.create_task(service.run())
        try:
            await asyncio.wait_for(service.ready.wait(), 30)
            await assert_eventually(lambda: service.reconcile_errors >= 2)
            await pub(nc, "gt.cmd.bead.create", {"title": "still served"}, msg_id="rec-1")
            assert (await outcome_of(nc, "rec-1"))["type"] == "cmd.accepted"
            assert (await ask(nc, "status"))["result"]["reconcile_errors"] >= 2
        finally:
            await service.shutdown()
            await task

    async def test_shutdown_while_nats_is_unreachable_stops_the_connect_loop(self, tmp_path: Any) -> None:
        service = MayorService(TownConfig(nats_url="nats://127.0.0.1:1", gt_home=tmp_path), FAST)
        task = asyncio.create_task(service.run())
        await assert_eventually(lambda: not task.done(), timeout=1)
        await service.shutdown()
        await asyncio.wait_for(task, 10)

    async def test_reconcile_runs_after_catch_up_on_events_and_on_patrol(self, nc: Client, town: TownConfig) -> None:
        calls: list[int] = []

        class Counting(MayorService):
            async def reconcile(self) -> None:
                calls.append(self.projection.last_seq)

        service = Counting(town, ServiceSettings(patrol_interval=0.2, idle_heartbeat=0.5))
        task = asyncio.create_task(service.run())
        try:
            await asyncio.wait_for(service.ready.wait(), 30)
            assert calls
            assert calls[0] == 0
            await pub(nc, "gt.cmd.bead.create", {"title": "t"}, msg_id="r-1")
            await assert_eventually(lambda: calls[-1] >= 2)  # after the applied events
            count = len(calls)
            await assert_eventually(lambda: len(calls) >= count + 2)  # patrol ticks with nothing new
        finally:
            await service.shutdown()
            await task
