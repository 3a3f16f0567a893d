"""Parsing command bodies: every bad input becomes a CommandError with the right reason code."""

from __future__ import annotations

import json

import pytest

from shared.core.errors import CommandError
from shared.model.commands import (
    DEFAULT_MAX_COMMAND_BYTES,
    BeadClaim,
    BeadClose,
    BeadCreate,
    BeadUpdate,
    parse_command,
    peek_body_fields,
)


def _parse(subject: str, body: object) -> object:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_command(subject, raw)


def _code(subject: str, body: object) -> tuple[str, str]:
    with pytest.raises(CommandError) as info:
        _parse(subject, body)
    return info.value.code, info.value.message


class TestValidCommands:
    def test_create_with_only_a_title_takes_the_defaults(self) -> None:
        cmd = _parse("gt.cmd.bead.create", {"title": "Fix the frobulator"})
        assert isinstance(cmd, BeadCreate)
        assert (cmd.type, cmd.priority, cmd.prefix, cmd.labels, cmd.metadata) == ("task", 2, "hq", [], {})

    def test_create_with_every_field(self) -> None:
        cmd = _parse(
            "gt.cmd.bead.create",
            {
                "title": "t",
                "type": "bug",
                "priority": 0,
                "description": "d",
                "labels": ["a", "b"],
                "metadata": {"k": ""},
                "parent": "hq-1",
                "needs": ["hq-2"],
                "assignee": "max",
                "prefix": "gt",
                "cmd_id": "c1",
                "actor": "operator:max",
            },
        )
        assert isinstance(cmd, BeadCreate)
        assert cmd.metadata == {"k": ""}
        assert cmd.actor == "operator:max"

    def test_update_claim_close(self) -> None:
        assert isinstance(_parse("gt.cmd.bead.update", {"id": "hq-1", "labels": ["x"]}), BeadUpdate)
        assert isinstance(_parse("gt.cmd.bead.claim", {"id": "hq-1", "assignee": "a"}), BeadClaim)
        assert isinstance(_parse("gt.cmd.bead.close", {"id": "hq-1"}), BeadClose)

    def test_update_may_clear_assignee_and_parent_with_empty_strings(self) -> None:
        cmd = _parse("gt.cmd.bead.update", {"id": "hq-1", "assignee": "", "parent": ""})
        assert isinstance(cmd, BeadUpdate)
        assert (cmd.assignee, cmd.parent) == ("", "")


class TestBadInput:
    def test_non_json_bytes_are_malformed(self) -> None:
        code, message = _code("gt.cmd.bead.create", b"\x00\xffnot json")
        assert code == "malformed"
        assert "JSON" in message

    @pytest.mark.parametrize(
        ("body", "kind"), [([1, 2], "array"), ("str", "string"), (3, "number"), (None, "null"), (True, "boolean")]
    )
    def test_json_that_is_not_an_object_is_malformed(self, body: object, kind: str) -> None:
        code, message = _code("gt.cmd.bead.create", body)
        assert code == "malformed"
        assert kind in message

    def test_a_missing_title_is_invalid_and_named(self) -> None:
        code, message = _code("gt.cmd.bead.create", {"priority": 1})
        assert code == "invalid"
        assert "title" in message

    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({"title": 5}, "title"),
            ({"title": "t", "priority": "high"}, "priority"),
            ({"title": "t", "priority": True}, "priority"),
            ({"title": "t", "labels": "a,b"}, "labels"),
            ({"title": "t", "metadata": {"k": 1}}, "metadata"),
            ({"title": "t", "needs": [1]}, "needs"),
        ],
    )
    def test_wrong_field_types_are_invalid_and_name_the_field(self, body: dict[str, object], field: str) -> None:
        code, message = _code("gt.cmd.bead.create", body)
        assert code == "invalid"
        assert field in message

    def test_unknown_fields_are_invalid(self) -> None:
        code, message = _code("gt.cmd.bead.create", {"title": "t", "titel": "typo"})
        assert code == "invalid"
        assert "titel" in message

    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({"title": "  "}, "title"),
            ({"title": "t", "priority": 5}, "priority"),
            ({"title": "t", "priority": -1}, "priority"),
            ({"title": "t", "type": "Big Task"}, "type"),
            ({"title": "t", "labels": [""]}, "labels"),
            ({"title": "t", "prefix": "HQ"}, "prefix"),
            ({"title": "t", "metadata": {"": "v"}}, "metadata"),
            ({"title": "t", "actor": ""}, "actor"),
            ({"title": "x" * 501}, "title"),
        ],
    )
    def test_values_out_of_range_are_invalid(self, body: dict[str, object], field: str) -> None:
        code, message = _code("gt.cmd.bead.create", body)
        assert code == "invalid"
        assert field in message

    @pytest.mark.parametrize("bad_id", ["hq.1", "hq 1", "hq-*", "hq->", "HQ-1", ""])
    def test_ids_with_dots_spaces_or_wildcards_are_invalid(self, bad_id: str) -> None:
        for subject, body in [
            ("gt.cmd.bead.close", {"id": bad_id}),
            ("gt.cmd.bead.update", {"id": bad_id}),
            ("gt.cmd.bead.create", {"title": "t", "parent": bad_id or "."}),
            ("gt.cmd.bead.create", {"title": "t", "needs": [bad_id or "."]}),
        ]:
            code, message = _code(subject, body)
            assert code == "invalid", (subject, body)
            assert "id" in message or "needs" in message or "parent" in message

    def test_unknown_verb_is_unknown_command(self) -> None:
        code, message = _code("gt.cmd.bead.explode", {"id": "hq-1"})
        assert code == "unknown_command"
        assert "gt.cmd.bead.create" in message

    def test_a_body_over_the_limit_is_too_large_before_it_is_parsed(self) -> None:
        body = b'{"title": "' + b"x" * (2 * 1024 * 1024) + b'"}'
        assert len(body) > DEFAULT_MAX_COMMAND_BYTES
        code, message = _code("gt.cmd.bead.create", body)
        assert code == "too_large"
        assert str(DEFAULT_MAX_COMMAND_BYTES) in message


class TestPeek:
    def test_reads_ids_from_a_body_that_is_otherwise_invalid(self) -> None:
        body = json.dumps({"cmd_id": "c-9", "actor": "operator:ann", "priority": "bad"}).encode()
        assert peek_body_fields(body) == ("c-9", "operator:ann", None)

    @pytest.mark.parametrize("body", [b"nope", b"[1]", b'{"cmd_id": 5, "actor": ""}'])
    def test_gives_nothing_for_unusable_bodies(self, body: bytes) -> None:
        assert peek_body_fields(body) == (None, None, None)


@pytest.mark.parametrize("name", ["hook-gt-abc", "merge-demo"])
def test_leases_the_services_keep_for_themselves_cannot_be_acquired_by_command(name: str) -> None:
    code, message = _code("gt.cmd.lease.acquire", {"lease": name, "holder": "me", "ttl_s": 10})
    assert code == "invalid"
    assert "prefix the services keep for themselves" in message
