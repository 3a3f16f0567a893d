"""A query's body decoded on the service's side into the class the client built (``shared.model.queries.registry``):
one definition for both ends, msgspec's checks in place of hand validation. Pure."""

from __future__ import annotations

import typing
from typing import Any

import msgspec
import pytest

from shared.core.errors import QueryError
from shared.model.queries import Digest, Query, Status, deacon, mayor, refinery, registry, witness
from shared.model.queries.base import LATEST_SEQ

EVERY_QUERY = [q for by_name in registry.BY_SERVICE.values() for q in by_name.values()]


def sample(kind: Any) -> Any:
    """A value of ``kind`` that differs from any default (and passes its bounds)."""
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    if typing.get_origin(kind) in (typing.Union, type(int | None)):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
        return sample(kind)
    if typing.get_origin(kind) is dict:
        return {"k": "v"}
    return {str: "x-1", int: 7, bool: True}[kind]


@pytest.mark.parametrize("cls", EVERY_QUERY, ids=[f"{q.SERVICE}.{q.NAME}" for q in EVERY_QUERY])
def test_what_a_client_sends_the_service_reads_back_as_the_same_query(cls: type[Query[Any]]) -> None:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = msgspec.structs.fields(cls)
    for values in (
        {f.name: sample(hints[f.name]) for f in fields if f.required},
        {f.name: sample(hints[f.name]) for f in fields},
    ):
        sent = cls(**values)
        assert registry.decode(cls.SERVICE, cls.NAME, msgspec.json.decode(sent.body())) == sent


def test_every_service_answers_status_and_digest_of_its_own() -> None:
    assert registry.decode("witness", "status", {}) == Status(service="witness")
    assert registry.decode("deacon", "digest", {"min_seq": LATEST_SEQ}) == Digest(service="deacon", min_seq=-1)
    assert registry.names("refinery") == ["mrs", "mr", "paused", "board", "status", "digest"]
    assert registry.names("witness")[:6] == [q.NAME for q in witness.QUERIES]
    assert {q.SERVICE for q in deacon.QUERIES + refinery.QUERIES} == {"deacon", "refinery"}


def test_a_field_it_does_not_know_is_ignored_as_it_always_was() -> None:
    assert registry.decode("mayor", "list", {"label": "x", "colour": "red"}) == mayor.Beads(label="x")


@pytest.mark.parametrize(
    ("service", "name", "body", "words"),
    [
        ("mayor", "get", {}, "missing required field `id`"),
        ("mayor", "get", {"id": ""}, "length >= 1 - at `id`"),
        ("mayor", "list", {"limit": -1}, ">= 0 - at `limit`"),
        ("mayor", "list", {"limit": True}, "at `limit`"),
        ("mayor", "list", {"metadata": {"k": 1}}, "got `int` - at `metadata[...]`"),
        ("mayor", "ready", {"page_bytes": 0}, "at `page_bytes`"),
        ("mayor", "list", {"min_seq": -2}, ">= -1 - at `min_seq`"),
        ("witness", "session", {"id": 3}, "at `id`"),
        ("deacon", "automation", {}, "`name`"),
        ("refinery", "mrs", {"rig": ["a"]}, "at `rig`"),
    ],
)
def test_a_bad_field_is_an_invalid_query_naming_it(service: str, name: str, body: dict[str, Any], words: str) -> None:
    with pytest.raises(QueryError) as refused:
        registry.decode(service, name, body)
    assert refused.value.code == "invalid"
    assert refused.value.message.startswith(f"gt.q.{service}.{name}: ")
    assert words in refused.value.message


def test_a_name_no_class_has_is_an_unknown_query_listing_what_is_answered() -> None:
    with pytest.raises(QueryError) as unknown:
        registry.decode("mayor", "teleport", {})
    assert unknown.value.code == "unknown_query"
    assert unknown.value.message == (
        "the mayor has no query 'teleport'; it answers get, list, ready, children, deps, molecule, gates, convoy, "
        "convoys, inbox, thread, escalations, costs, formulas, formula, status, digest"
    )
    with pytest.raises(QueryError):
        registry.decode("witness", "list", {})  # the mayor's, not the witness's
