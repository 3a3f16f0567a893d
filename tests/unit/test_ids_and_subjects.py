"""Ids, command ids and subject parsing."""

from __future__ import annotations

import pytest

from shared.bus.topology import CATCH_ALL_SERVICE, command_filters, owner_of
from shared.core import ids, subjects
from shared.model import heartbeats


class TestIds:
    @pytest.mark.parametrize("value", ["hq-1a2b3c", "a", "gt_x-9", "0abc", "x" * 64])
    def test_valid_ids_are_accepted(self, value: str) -> None:
        assert ids.is_valid_id(value)

    @pytest.mark.parametrize(
        "value", ["", "hq.1", "has space", "star*", "gt>", "Upper", "-lead", "_lead", "x" * 65, "tab\t", "é"]
    )
    def test_ids_with_dots_spaces_wildcards_or_capitals_are_refused(self, value: str) -> None:
        assert not ids.is_valid_id(value)

    def test_bead_ids_carry_the_prefix_and_a_base36_suffix(self) -> None:
        bead_id = ids.random_bead_id("gt")
        prefix, suffix = bead_id.split("-")
        assert prefix == "gt"
        assert len(suffix) == ids.BEAD_SUFFIX_LEN
        assert set(suffix) <= set("0123456789abcdefghijklmnopqrstuvwxyz")
        assert ids.is_valid_id(bead_id)

    def test_base36_round_trips(self) -> None:
        for number in (0, 1, 35, 36, 123456789):
            assert int(ids.to_base36(number), 36) == number


class TestCommandId:
    def test_header_wins_over_body_and_sequence(self) -> None:
        assert ids.command_id("from-header", "from-body", 7) == "from-header"

    def test_body_cmd_id_is_used_without_a_header(self) -> None:
        assert ids.command_id(None, "from-body", 7) == "from-body"

    def test_stream_sequence_is_the_fallback(self) -> None:
        assert ids.command_id(None, None, 42) == "cmd-42"

    @pytest.mark.parametrize("raw", ["with.dots", "has spaces", "wild*card", "gt.>", "x" * 300, "MiXeD"])
    def test_an_unusable_id_becomes_a_stable_digest(self, raw: str) -> None:
        first = ids.command_id(raw, None, 1)
        assert ids.is_valid_id(first)
        assert first != raw
        # The same header must still deduplicate: the digest depends on the raw id only.
        assert ids.command_id(raw, None, 99) == first
        assert ids.command_id(None, raw, 5) == first
        assert ids.command_id(raw + "x", None, 1) != first


class TestOwnIds:
    def test_a_keyed_id_is_stable_for_its_secret_and_unguessable_without_it(self) -> None:
        first = ids.keyed_id("finish-s-1", "the-session-password")
        assert first == ids.keyed_id("finish-s-1", "the-session-password"), "a rerun sends the same id"
        assert first.startswith("finish-s-1-")
        assert ids.is_valid_id(first)
        assert first != ids.keyed_id("finish-s-1", "another-password")
        assert ids.keyed_id("finish-s-1", None) == "finish-s-1", "no secret: the id as it was"
        long = ids.keyed_id("mr-" + "x" * 80, "pw")
        assert ids.is_valid_id(long)

    def test_a_scoped_id_holds_the_session_and_is_no_id_a_sender_may_choose(self) -> None:
        scoped = ids.session_scoped_id("s-1", "close-mr-abc")
        assert scoped == "s-1~close-mr-abc"
        assert not ids.is_valid_id(scoped)
        assert ids.command_id(scoped, None, 1) != scoped


class TestSubjects:
    def test_event_and_outcome_subjects(self) -> None:
        assert subjects.event_subject("bead", "hq-1") == "gt.evt.bead.hq-1"
        assert subjects.outcome_subject("cli-1") == "gt.evt.cmd.cli-1"

    def test_a_sessions_outcome_has_the_session_as_a_token_of_its_own(self) -> None:
        scoped = ids.session_scoped_id("hq-a-1", "cli-9")
        assert subjects.outcome_subject(scoped) == "gt.evt.cmd.hq-a-1.cli-9"
        assert subjects.outcome_command_id("gt.evt.cmd.hq-a-1.cli-9") == scoped
        assert subjects.outcome_command_id("gt.evt.cmd.cli-1") == "cli-1"
        # A command stored before the change and delivered after it is found settled on either subject.
        assert subjects.outcome_subjects(scoped) == ("gt.evt.cmd.hq-a-1.cli-9", "gt.evt.cmd.hq-a-1~cli-9")
        assert subjects.outcome_subjects("cli-1") == ("gt.evt.cmd.cli-1",)
        assert subjects.session_outcomes("hq-a-1") == "gt.evt.cmd.hq-a-1.*"

    def test_v1_reply_subject(self) -> None:
        info = subjects.parse_js_reply("$JS.ACK.GT_EVT.cons.3.1042.17.1700000000000000000.5")
        assert info == subjects.DeliveryInfo(stream_seq=1042, delivered=3, pending=5)

    def test_v2_reply_subject_with_domain_and_account(self) -> None:
        info = subjects.parse_js_reply("$JS.ACK.hub.ACCHASH.GT_EVT.cons.1.77.70.1700000000000000000.0.rnd")
        assert info == subjects.DeliveryInfo(stream_seq=77, delivered=1, pending=0)

    @pytest.mark.parametrize("reply", ["", "_INBOX.abc", "$JS.ACK.a.b.c.d.e.f.g", "$JS.ACK.S.C.x.1.1.1.0"])
    def test_other_reply_subjects_are_refused(self, reply: str) -> None:
        with pytest.raises(ValueError, match="not a JetStream delivery"):
            subjects.parse_js_reply(reply)


class TestCommandOwnership:
    def test_bead_commands_belong_to_the_mayor(self) -> None:
        assert owner_of("gt.cmd.bead.create") == "mayor"

    def test_unknown_aggregates_fall_to_the_catch_all_service(self) -> None:
        assert owner_of("gt.cmd.frobnicator.spin") == CATCH_ALL_SERVICE
        assert owner_of("gt.cmd.x") == CATCH_ALL_SERVICE

    def test_the_catch_all_service_reads_every_command(self) -> None:
        assert command_filters(CATCH_ALL_SERVICE) == ["gt.cmd.>"]


def test_a_session_subject_names_who_sent_the_command() -> None:
    origin = subjects.SessionOrigin("demo", "ace", "hq-abc-1")
    sent = subjects.session_command_subject("mr", "done", origin)
    assert sent == "gt.cmd.mr.done.demo.ace.hq-abc-1"
    assert subjects.split_origin(sent) == ("gt.cmd.mr.done", origin)
    assert origin.actor == "polecat:demo/ace"
    assert owner_of(sent) == owner_of("gt.cmd.mr.done"), "the same service owns both forms"
    for other in ("gt.cmd.mr.done", "gt.cmd.mr.done.demo.ace", "gt.cmd.mr.done.demo..s", "gt.evt.mr.x.a.b.c"):
        assert subjects.split_origin(other) == (other, None), other


def test_a_service_subject_names_the_service_that_sent_the_command() -> None:
    origin = subjects.ServiceOrigin("refinery")
    sent = subjects.service_command_subject("bead", "close", origin)
    assert sent == "gt.cmd.bead.close.svc.refinery"
    assert subjects.split_origin(sent) == ("gt.cmd.bead.close", origin)
    assert origin.actor == "refinery"
    scoped = subjects.service_command_subject("bead", "sling", subjects.ServiceOrigin("witness-east"))
    assert subjects.split_origin(scoped) == ("gt.cmd.bead.sling", subjects.ServiceOrigin("witness-east"))
    for service_subject in (sent, scoped):
        plain = subjects.split_origin(service_subject)[0]
        assert owner_of(service_subject) == owner_of(plain), "the same service owns both forms"
    assert subjects.split_origin("gt.cmd.bead.close") == ("gt.cmd.bead.close", None), "plain: an operator's"
    for other in (
        "gt.cmd.bead.close.svc",  # no service
        "gt.cmd.bead.close.svc.",  # an empty one
        "gt.cmd.bead.close.sv.refinery",  # not the service mark: a six-token subject of nobody
        "gt.cmd.bead.close.svc.refinery.x.y",  # eight tokens
        "gt.cmd..close.svc.refinery",
        "gt.evt.bead.close.svc.refinery",
    ):
        assert subjects.split_origin(other) == (other, None), other
    # Seven tokens are a session's, whatever its rig is called (a rig named "svc" included).
    assert subjects.split_origin("gt.cmd.step.done.svc.ace.s-1") == (
        "gt.cmd.step.done",
        subjects.SessionOrigin("svc", "ace", "s-1"),
    )


def test_only_a_sessions_own_inbox_names_it() -> None:
    inbox = subjects.session_inbox_prefix("hq-abc-1")
    assert subjects.session_of_inbox(f"{inbox}.nuid.1") == "hq-abc-1"
    for other in ("_INBOX.abc.1", "_INBOX_operator.x", "_INBOX_s-", "", "gt.q.mayor.x"):
        assert subjects.session_of_inbox(other) is None, other


def test_a_gate_runners_scope_is_its_own_token_under_runner_in_its_queries_and_keys() -> None:
    # The runners share one NATS user: `gt.q.runner.>` and `$KV.GT_ACTIVE.runner.*` must name every runner's and
    # nothing of another scope's, so the runner's name is a token of its own.
    assert subjects.runner_scope("2") == "runner-2"
    assert subjects.scope_tokens("runner-2") == "runner.2"
    assert subjects.scope_tokens("runner-ci-box-7") == "runner.ci-box-7"
    assert subjects.query_subject("runner-2", "status") == "gt.q.runner.2.status"
    assert heartbeats.key_of("runner-2", "123-abcdef") == "runner.2.123-abcdef"
    # Every other scope is itself: a witness of some rigs, a service, and what only looks like a runner's.
    for scope in ("mayor", "witness-east", "runner", "runner-", "runner-Bad", "runner-a.b", "runners-1"):
        assert subjects.scope_tokens(scope) == scope, scope
        assert not subjects.is_runner_scope(scope), scope
    assert subjects.query_subject("witness-east", "status") == "gt.q.witness-east.status"
    assert heartbeats.key_of("mayor", "1-a") == "mayor.1-a"
