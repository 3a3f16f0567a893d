"""The bead store contract, ported from Gas City's conformance suite (beadstest/conformance.go:
RunStoreTests, metadata, creation order, dependencies, and the MemStore-specific cases), run against the
pure model and against the real mayor through its commands and queries.

Where this product differs on purpose, the test says so and asserts ours:
- status only moves forward (open -> hooked -> in_progress -> closed); nothing reopens a bead;
- bead ids are ``<prefix>-<6 base36>``, not sequential, and are drawn by the mayor;
- a dependency or parent must name an existing bead (Gas City accepts dangling endpoints);
- there is one dependency kind (``needs``, blocking); Gas City's typed deps are not modelled;
- ``list`` needs no ``AllowScan``: it is bounded by ``limit`` (default 1000) instead;
- every list is in creation order (Gas City's ListByLabel is newest first).
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import CommandError, QueryError
from shared.model.events.beads import INFRA_TYPES
from tests.drivers import Driver

CREATE, UPDATE, CLAIM, CLOSE = (f"gt.cmd.bead.{v}" for v in ("create", "update", "claim", "close"))


async def create(driver: Driver, title: str, **fields: Any) -> str:
    result = await driver.send(CREATE, {"title": title, **fields})
    bead_id: str = result["id"]
    return bead_id


async def get(driver: Driver, bead_id: str) -> dict[str, Any]:
    bead: dict[str, Any] = await driver.ask("get", id=bead_id)
    return bead


async def rejected(driver: Driver, subject: str, body: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as info:
        await driver.send(subject, body)
    return info.value.code


def titles(beads: list[dict[str, Any]]) -> list[str]:
    return [b["title"] for b in beads]


class TestCreate:
    async def test_assigns_unique_non_empty_ids_with_the_prefix(self, driver: Driver) -> None:
        first, second = await create(driver, "first"), await create(driver, "second")
        assert first
        assert second
        assert first != second
        assert first.startswith("hq-")
        assert (await create(driver, "third", prefix="gt")).startswith("gt-")

    async def test_sets_status_open_default_type_task_priority_2(self, driver: Driver) -> None:
        bead = await get(driver, await create(driver, "Build a Tower of Hanoi app"))
        assert (bead["status"], bead["type"], bead["priority"]) == ("open", "task", 2)
        assert bead["title"] == "Build a Tower of Hanoi app"

    async def test_keeps_explicit_type_assignee_and_description(self, driver: Driver) -> None:
        bead = await get(driver, await create(driver, "round trip", type="bug", assignee="mayor", description="d"))
        assert (bead["type"], bead["assignee"], bead["description"]) == ("bug", "mayor", "d")

    async def test_stamps_created_at_and_created_by(self, driver: Driver) -> None:
        bead_id = (await driver.send(CREATE, {"title": "t"}, actor="operator:priya"))["id"]
        bead = await get(driver, bead_id)
        assert bead["created_at"]
        assert bead["created_by"] == "operator:priya"

    async def test_a_missing_parent_or_blocker_is_not_found(self, driver: Driver) -> None:
        # Differs from Gas City on purpose: endpoints must exist.
        assert await rejected(driver, CREATE, {"title": "t", "parent": "hq-nope"}) == "not_found"
        assert await rejected(driver, CREATE, {"title": "t", "needs": ["hq-nope"]}) == "not_found"

    async def test_duplicate_labels_and_needs_are_stored_once(self, driver: Driver) -> None:
        blocker = await create(driver, "blocker")
        bead = await get(driver, await create(driver, "t", labels=["a", "a", "b"], needs=[blocker, blocker]))
        assert (bead["labels"], bead["needs"]) == (["a", "b"], [blocker])


class TestGet:
    async def test_missing_bead_is_not_found(self, driver: Driver) -> None:
        await create(driver, "one")
        with pytest.raises(QueryError) as info:
            await get(driver, "nonexistent-999")
        assert info.value.code == "not_found"

    async def test_missing_bead_on_an_empty_store(self, driver: Driver) -> None:
        with pytest.raises(QueryError):
            await get(driver, "nonexistent-999")

    async def test_get_matches_the_created_bead(self, driver: Driver) -> None:
        bead_id = await create(driver, "round trip", type="bug")
        bead = await get(driver, bead_id)
        assert (bead["id"], bead["title"], bead["status"], bead["type"], bead["assignee"]) == (
            bead_id,
            "round trip",
            "open",
            "bug",
            None,
        )


class TestClose:
    async def test_close_sets_closed_with_reason_and_time(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        await driver.advance(60)
        await driver.send(CLOSE, {"id": bead_id, "reason": "done"})
        bead = await get(driver, bead_id)
        assert (bead["status"], bead["close_reason"]) == ("closed", "done")
        assert bead["closed_at"] >= bead["created_at"]

    async def test_close_not_found(self, driver: Driver) -> None:
        assert await rejected(driver, CLOSE, {"id": "nonexistent-999"}) == "not_found"

    async def test_closing_a_closed_bead_succeeds_and_changes_nothing(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        await driver.send(CLOSE, {"id": bead_id, "reason": "first"})
        result = await driver.send(CLOSE, {"id": bead_id, "reason": "second"})
        assert result == {"id": bead_id, "status": "closed", "changed": False}
        assert (await get(driver, bead_id))["close_reason"] == "first"

    async def test_close_removes_from_ready(self, driver: Driver) -> None:
        first = await create(driver, "first")
        await create(driver, "second")
        await driver.send(CLOSE, {"id": first})
        assert titles(await driver.ask("ready")) == ["second"]


class TestForwardOnly:
    async def test_claim_moves_open_to_in_progress(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        result = await driver.send(CLAIM, {"id": bead_id, "assignee": "polecat:rig/ace"})
        assert result["status"] == "in_progress"
        assert (await get(driver, bead_id))["assignee"] == "polecat:rig/ace"

    async def test_claim_by_the_same_assignee_again_is_a_no_op(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        await driver.send(CLAIM, {"id": bead_id, "assignee": "a"})
        assert (await driver.send(CLAIM, {"id": bead_id, "assignee": "a"}))["changed"] is False

    async def test_claim_of_a_bead_held_by_someone_else_is_a_conflict(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        await driver.send(CLAIM, {"id": bead_id, "assignee": "a"})
        assert await rejected(driver, CLAIM, {"id": bead_id, "assignee": "b"}) == "conflict"
        assert (await get(driver, bead_id))["assignee"] == "a"

    async def test_claiming_a_closed_bead_is_a_backward_transition(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        await driver.send(CLOSE, {"id": bead_id})
        assert await rejected(driver, CLAIM, {"id": bead_id, "assignee": "a"}) == "backward_transition"

    @pytest.mark.parametrize(
        ("setup", "target"),
        [("close", "open"), ("close", "in_progress"), ("claim", "open"), ("close", "hooked")],
    )
    async def test_status_can_never_move_back(self, driver: Driver, setup: str, target: str) -> None:
        # Differs from Gas City on purpose: no reopen, no backward status at all.
        bead_id = await create(driver, "t")
        if setup == "claim":
            await driver.send(CLAIM, {"id": bead_id, "assignee": "a"})
        else:
            await driver.send(CLOSE, {"id": bead_id})
        before = (await get(driver, bead_id))["status"]
        assert await rejected(driver, UPDATE, {"id": bead_id, "status": target}) == "backward_transition"
        assert (await get(driver, bead_id))["status"] == before

    async def test_update_may_move_status_forward(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        result = await driver.send(UPDATE, {"id": bead_id, "status": "in_progress", "assignee": "a", "title": "t2"})
        assert result == {"id": bead_id, "status": "in_progress", "changed": True}
        bead = await get(driver, bead_id)
        assert (bead["status"], bead["title"]) == ("in_progress", "t2")
        await driver.send(UPDATE, {"id": bead_id, "status": "closed"})
        assert (await get(driver, bead_id))["status"] == "closed"

    async def test_update_to_in_progress_needs_an_assignee(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        assert await rejected(driver, UPDATE, {"id": bead_id, "status": "in_progress"}) == "invalid"

    async def test_hooked_comes_only_from_sling(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        assert await rejected(driver, UPDATE, {"id": bead_id, "status": "hooked"}) == "invalid"

    async def test_stating_the_current_status_is_accepted(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        assert (await driver.send(UPDATE, {"id": bead_id, "status": "open"}))["changed"] is False

    async def test_an_unknown_status_is_invalid(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        assert await rejected(driver, UPDATE, {"id": bead_id, "status": "done"}) == "invalid"


class TestUpdate:
    async def test_description_changes(self, driver: Driver) -> None:
        bead_id = await create(driver, "t", description="original")
        await driver.send(UPDATE, {"id": bead_id, "description": "updated description"})
        assert (await get(driver, bead_id))["description"] == "updated description"

    async def test_not_found(self, driver: Driver) -> None:
        assert await rejected(driver, UPDATE, {"id": "nonexistent-999", "description": "x"}) == "not_found"

    async def test_an_empty_update_is_a_no_op(self, driver: Driver) -> None:
        bead_id = await create(driver, "t", description="original")
        assert (await driver.send(UPDATE, {"id": bead_id}))["changed"] is False
        assert (await driver.send(UPDATE, {"id": bead_id, "description": "original", "labels": []}))["changed"] is False
        assert (await get(driver, bead_id))["description"] == "original"

    async def test_labels_append_and_never_replace(self, driver: Driver) -> None:
        bead_id = await create(driver, "t", labels=["a"])
        await driver.send(UPDATE, {"id": bead_id, "labels": ["b"]})
        await driver.send(UPDATE, {"id": bead_id, "labels": ["a", "c"]})
        assert (await get(driver, bead_id))["labels"] == ["a", "b", "c"]

    async def test_remove_labels_is_explicit_and_absent_labels_are_a_no_op(self, driver: Driver) -> None:
        bead_id = await create(driver, "t", labels=["a", "b", "c"])
        await driver.send(UPDATE, {"id": bead_id, "remove_labels": ["b", "zzz"]})
        assert (await get(driver, bead_id))["labels"] == ["a", "c"]

    async def test_adds_apply_before_removes(self, driver: Driver) -> None:
        bead_id = await create(driver, "t", labels=["a", "b"])
        await driver.send(UPDATE, {"id": bead_id, "labels": ["c"], "remove_labels": ["a"]})
        assert (await get(driver, bead_id))["labels"] == ["b", "c"]

    async def test_metadata_absent_vs_empty(self, driver: Driver) -> None:
        bead_id = await create(driver, "t", metadata={"keep": "1"})
        await driver.send(UPDATE, {"id": bead_id, "metadata": {"key": "", "keep": "1"}})
        metadata = (await get(driver, bead_id))["metadata"]
        assert metadata == {"keep": "1", "key": ""}
        assert "nonexistent" not in metadata

    async def test_metadata_batch_sets_every_key(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        batch = {"key1": "value1", "key2": "value2", "key3": "value3"}
        await driver.send(UPDATE, {"id": bead_id, "metadata": batch})
        assert (await get(driver, bead_id))["metadata"] == batch

    async def test_metadata_batch_on_a_missing_bead_is_not_found(self, driver: Driver) -> None:
        assert await rejected(driver, UPDATE, {"id": "nonexistent-999", "metadata": {"k": "v"}}) == "not_found"

    async def test_an_empty_metadata_batch_is_accepted(self, driver: Driver) -> None:
        bead_id = await create(driver, "t")
        assert (await driver.send(UPDATE, {"id": bead_id, "metadata": {}}))["changed"] is False

    async def test_assignee_and_parent_can_be_cleared(self, driver: Driver) -> None:
        parent = await create(driver, "p")
        bead_id = await create(driver, "t", assignee="a", parent=parent)
        await driver.send(UPDATE, {"id": bead_id, "assignee": "", "parent": ""})
        bead = await get(driver, bead_id)
        assert (bead["assignee"], bead["parent"]) == (None, None)
        assert await driver.ask("children", id=parent) == []

    async def test_a_bead_cannot_become_its_own_ancestor(self, driver: Driver) -> None:
        grandparent = await create(driver, "g")
        parent = await create(driver, "p", parent=grandparent)
        child = await create(driver, "c", parent=parent)
        assert await rejected(driver, UPDATE, {"id": grandparent, "parent": child}) == "invalid"
        assert await rejected(driver, UPDATE, {"id": child, "parent": child}) == "invalid"

    async def test_reparenting_moves_the_bead_between_children_lists(self, driver: Driver) -> None:
        p1, p2 = await create(driver, "p1"), await create(driver, "p2")
        child = await create(driver, "c", parent=p1)
        await driver.send(UPDATE, {"id": child, "parent": p2})
        assert await driver.ask("children", id=p1) == []
        assert titles(await driver.ask("children", id=p2)) == ["c"]


class TestDependencies:
    async def test_needs_lists_down_and_dependents_list_up(self, driver: Driver) -> None:
        a, b = await create(driver, "a"), await create(driver, "b")
        await driver.send(UPDATE, {"id": a, "needs": [b]})
        assert [d["id"] for d in await driver.ask("deps", id=a)] == [b]
        assert [d["id"] for d in await driver.ask("deps", id=a, direction="down")] == [b]
        assert [d["id"] for d in await driver.ask("deps", id=b, direction="up")] == [a]

    async def test_adding_the_same_dependency_twice_lists_it_once(self, driver: Driver) -> None:
        a, b = await create(driver, "a"), await create(driver, "b")
        await driver.send(UPDATE, {"id": a, "needs": [b]})
        assert (await driver.send(UPDATE, {"id": a, "needs": [b]}))["changed"] is False
        assert len(await driver.ask("deps", id=a)) == 1

    async def test_blocks_is_needs_seen_from_the_other_side(self, driver: Driver) -> None:
        a, b = await create(driver, "a"), await create(driver, "b")
        await driver.send(UPDATE, {"id": b, "blocks": [a]})
        assert (await get(driver, a))["needs"] == [b]
        assert titles(await driver.ask("ready")) == ["b"]

    async def test_remove_a_dependency_and_removing_a_missing_one_is_a_no_op(self, driver: Driver) -> None:
        a, b, c = await create(driver, "a"), await create(driver, "b"), await create(driver, "c")
        await driver.send(UPDATE, {"id": a, "needs": [b, c]})
        await driver.send(UPDATE, {"id": a, "remove_needs": [b]})
        assert [d["id"] for d in await driver.ask("deps", id=a)] == [c]
        assert (await driver.send(UPDATE, {"id": a, "remove_needs": ["hq-none"]}))["changed"] is False

    async def test_deps_of_a_bead_with_none_are_empty(self, driver: Driver) -> None:
        assert await driver.ask("deps", id=await create(driver, "lonely")) == []

    async def test_ready_respects_blocking_dependencies(self, driver: Driver) -> None:
        blocker = await create(driver, "blocker")
        await create(driver, "blocked", needs=[blocker])
        await create(driver, "ready")
        assert titles(await driver.ask("ready")) == ["blocker", "ready"]
        await driver.send(CLOSE, {"id": blocker})
        assert titles(await driver.ask("ready")) == ["blocked", "ready"]

    async def test_a_dependency_that_closes_a_cycle_is_refused(self, driver: Driver) -> None:
        a = await create(driver, "a")
        b = await create(driver, "b", needs=[a])
        c = await create(driver, "c", needs=[b])
        assert await rejected(driver, UPDATE, {"id": a, "needs": [c]}) == "invalid"
        assert await rejected(driver, UPDATE, {"id": a, "needs": [a]}) == "invalid"
        assert await rejected(driver, UPDATE, {"id": c, "blocks": [a]}) == "invalid"
        assert (await get(driver, a))["needs"] == []

    async def test_an_unknown_dependency_is_not_found(self, driver: Driver) -> None:
        # Differs from Gas City on purpose: its DepAdd accepts endpoints that do not exist.
        a = await create(driver, "a")
        assert await rejected(driver, UPDATE, {"id": a, "needs": ["hq-missing"]}) == "not_found"
        assert await rejected(driver, UPDATE, {"id": a, "blocks": ["hq-missing"]}) == "not_found"


class TestQueries:
    async def test_list_returns_open_beads_in_creation_order(self, driver: Driver) -> None:
        for title in ("alpha", "beta", "gamma"):
            await create(driver, title)
        assert titles(await driver.ask("list")) == ["alpha", "beta", "gamma"]
        assert titles(await driver.ask("ready")) == ["alpha", "beta", "gamma"]

    async def test_list_and_ready_on_an_empty_store(self, driver: Driver) -> None:
        assert await driver.ask("list") == []
        assert await driver.ask("ready") == []

    async def test_closed_beads_are_listed_only_when_asked(self, driver: Driver) -> None:
        await create(driver, "open one")
        await driver.send(CLOSE, {"id": await create(driver, "closed one")})
        assert titles(await driver.ask("list")) == ["open one"]
        assert titles(await driver.ask("list", status="closed")) == ["closed one"]
        assert titles(await driver.ask("list", include_closed=True)) == ["open one", "closed one"]

    async def test_list_filters_are_conjunctive(self, driver: Driver) -> None:
        parent = await create(driver, "parent", type="epic", labels=["root"], metadata={"scope": "a"})
        await create(driver, "match", labels=["focus"], parent=parent, metadata={"scope": "a"})
        await create(driver, "wrong parent", labels=["focus"], metadata={"scope": "a"})
        await create(driver, "wrong metadata", labels=["focus"], parent=parent, metadata={"scope": "b"})
        await create(driver, "wrong type", type="bug", labels=["focus"], parent=parent, metadata={"scope": "a"})
        found = await driver.ask("list", type="task", label="focus", parent=parent, metadata={"scope": "a"})
        assert titles(found) == ["match"]

    async def test_list_by_assignee_status_and_limit(self, driver: Driver) -> None:
        ids = [await create(driver, f"b{i}", labels=["batch:1"]) for i in range(5)]
        await driver.send(CLAIM, {"id": ids[1], "assignee": "a"})
        assert titles(await driver.ask("list", status="in_progress")) == ["b1"]
        assert titles(await driver.ask("list", assignee="a")) == ["b1"]
        assert len(await driver.ask("list", label="batch:1", limit=2)) == 2
        assert len(await driver.ask("list", label="batch:1", limit=0)) == 5

    async def test_label_filter_matches_exactly_and_excludes_closed_unless_asked(self, driver: Driver) -> None:
        await create(driver, "no label")
        labelled = await create(driver, "labelled", labels=["role:worker"])
        assert titles(await driver.ask("list", label="role:worker")) == ["labelled"]
        assert await driver.ask("list", label="role:mayor") == []
        assert await driver.ask("list", label="role") == []
        await driver.send(CLOSE, {"id": labelled})
        assert await driver.ask("list", label="role:worker") == []
        assert titles(await driver.ask("list", label="role:worker", include_closed=True)) == ["labelled"]

    async def test_ready_excludes_infrastructure_types(self, driver: Driver) -> None:
        await create(driver, "task")
        for infra in sorted(INFRA_TYPES):
            await create(driver, infra, type=infra)
        assert titles(await driver.ask("ready")) == ["task"]

    async def test_types_are_case_sensitive_lowercase(self, driver: Driver) -> None:
        assert await rejected(driver, CREATE, {"title": "t", "type": "CONVOY"}) == "invalid"
        await create(driver, "epic", type="epic")
        assert titles(await driver.ask("ready")) == ["epic"]

    async def test_an_unknown_type_is_refused_naming_the_types(self, driver: Driver) -> None:
        with pytest.raises(CommandError) as info:
            await driver.send(CREATE, {"title": "typo", "type": "nonsense"})
        assert info.value.code == "invalid"
        assert "`type` 'nonsense' is no bead type; work: task, bug, feature, chore, docs, epic" in str(info.value)
        bead = await create(driver, "a bug", type="bug")
        with pytest.raises(CommandError) as info:
            await driver.send(UPDATE, {"id": bead, "type": "bgu"})
        assert info.value.code == "invalid"
        assert (await get(driver, bead))["type"] == "bug"
        assert await driver.ask("list", type="nonsense") == []

    async def test_children_in_creation_order_without_closed_unless_asked(self, driver: Driver) -> None:
        parent = await create(driver, "parent", type="molecule")
        c1 = await create(driver, "c1", parent=parent)
        await create(driver, "c2", parent=parent)
        await create(driver, "other")
        assert titles(await driver.ask("children", id=parent)) == ["c1", "c2"]
        await driver.send(CLOSE, {"id": c1})
        assert titles(await driver.ask("children", id=parent)) == ["c2"]
        assert titles(await driver.ask("children", id=parent, include_closed=True)) == ["c1", "c2"]
        assert await driver.ask("children", id="nonexistent") == []

    @pytest.mark.parametrize(
        ("what", "body", "code"),
        [
            ("get", {}, "invalid"),
            ("list", {"status": "done"}, "invalid"),
            ("list", {"limit": -1}, "invalid"),
            ("list", {"limit": "5"}, "invalid"),
            ("list", {"label": 3}, "invalid"),
            ("list", {"metadata": {"k": 1}}, "invalid"),
            ("deps", {"id": "hq-none"}, "not_found"),
            ("teleport", {}, "unknown_query"),
        ],
    )
    async def test_bad_queries_are_answered_with_a_code(
        self, driver: Driver, what: str, body: dict[str, Any], code: str
    ) -> None:
        with pytest.raises(QueryError) as info:
            await driver.ask(what, **body)
        assert info.value.code == code
