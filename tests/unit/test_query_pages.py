"""List answers in pages: the mayor's cursor (``after``) and page size, and the query server's cut of any answer
to what one reply carries (``fit_reply``). Pure: no NATS (lists far over the limit on a real server:
tests/integration/test_query_pages.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
import pytest

from services.mayor import queries
from services.mayor.state import Bead, MayorState
from shared.core.errors import QueryError
from shared.model.queries import registry
from shared.model.queries.base import PAGE_BYTES, Page
from shared.service.queries import fit_reply

NOW = datetime(2026, 11, 28, tzinfo=UTC)


def ask(state: MayorState, what: str, body: dict[str, object]) -> Page:
    """The mayor's answer to ``gt.q.mayor.<what>`` with ``body``, decoded as its query server decodes it."""
    page = queries.answer(state, registry.decode("mayor", what, body))
    assert isinstance(page, Page)
    return page


def town(n: int) -> MayorState:
    state = MayorState()
    for i in range(n):
        bead_id = f"hq-{i:05d}"
        state.beads[bead_id] = Bead(id=bead_id, title=f"bead {i}", created_at=NOW, updated_at=NOW)
    return state


def ids(page: Page) -> list[str]:
    return [item.id for item in page.items]


def test_a_list_pages_through_with_the_cursor_each_item_once_in_order() -> None:
    state = town(25)
    seen: list[str] = []
    body: dict[str, object] = {"limit": 10}
    pages = 0
    while True:
        page = ask(state, "list", dict(body))
        pages += 1
        seen += ids(page)
        if page.next is None:
            break
        assert page.next == seen[-1], "the cursor is the last item's id"
        body["after"] = page.next
    assert pages == 3
    assert seen == list(state.beads)


def test_the_last_full_page_has_no_cursor() -> None:
    state = town(10)
    assert ask(state, "ready", {"limit": 10}).next is None
    assert ask(state, "ready", {"limit": 9}).next == "hq-00008"


def test_an_item_that_stopped_matching_between_pages_keeps_the_place() -> None:
    state = town(6)
    first = ask(state, "ready", {"limit": 3})
    assert ids(first) == ["hq-00000", "hq-00001", "hq-00002"]
    state.beads["hq-00002"].status = "closed"  # the cursor's own bead is no longer ready
    second = ask(state, "ready", {"limit": 3, "after": first.next})
    assert ids(second) == ["hq-00003", "hq-00004", "hq-00005"]


def test_a_cursor_no_longer_in_the_list_is_an_error_not_an_empty_page() -> None:
    with pytest.raises(QueryError) as caught:
        ask(town(3), "list", {"after": "hq-gone"})
    assert caught.value.code == "stale_cursor"
    assert "list from the start" in caught.value.message


def test_a_page_holds_at_most_page_bytes_of_items_and_always_one() -> None:
    state = town(100)
    item = len(msgspec.json.encode(state.beads["hq-00000"]))
    page = ask(state, "list", {"limit": 0, PAGE_BYTES: item * 10 + 20})
    assert len(page.items) == 10
    assert page.next == "hq-00009"
    assert len(ask(state, "list", {"limit": 0, PAGE_BYTES: 1}).items) == 1, "an item larger: still one"
    with pytest.raises(QueryError):
        ask(state, "list", {PAGE_BYTES: "a lot"})


def test_a_page_over_the_reply_limit_is_cut_with_a_cursor_where_it_was_cut() -> None:
    items = [{"id": f"hq-{i:05d}", "title": "x" * 100} for i in range(1000)]
    reply = {"ok": True, "seq": 7, "result": items, "next": None}
    body = fit_reply(reply, 20_000, "list")
    assert len(body) <= 20_000
    answer = json.loads(body)
    assert answer["ok"]
    assert 100 < len(answer["result"]) < 1000
    assert answer["next"] == answer["result"][-1]["id"]
    assert answer["result"] == items[: len(answer["result"])]


def test_an_answer_that_fits_is_sent_as_it_is() -> None:
    reply = {"ok": True, "seq": 7, "result": [{"id": "hq-1"}], "next": None}
    assert json.loads(fit_reply(reply, 20_000, "list")) == reply


def test_any_other_answer_over_the_limit_is_an_error_naming_the_limit_and_paging() -> None:
    reply = {"ok": True, "seq": 7, "result": {"thread": ["y" * 1000] * 100}}
    answer = json.loads(fit_reply(reply, 20_000, "thread"))
    assert answer["ok"] is False
    assert answer["code"] == "too_large"
    assert "20000-byte limit" in answer["message"]
    assert "`after`" in answer["message"]
