"""The bead aggregate: the bead store contract (ported from Gas City's conformance suite) plus this
project's forward-only rules, run through the mayor's pure decide and fold."""

from __future__ import annotations

from typing import Any

import pytest

from services.mayor import queries
from services.mayor.decide import decide
from services.mayor.projection import INFRA_TYPES, MayorState, new_projection
from shared.errors import QueryError
from tests.memory_log import T0, MemoryTown

CREATE, UPDATE, CLAIM, CLOSE = (f"gt.cmd.bead.{v}" for v in ("create", "update", "claim", "close"))


@pytest.fixture
def town() -> MemoryTown[MayorState]:
    return MemoryTown(new_projection(), decide)


def create(town: MemoryTown[MayorState], title: str, **fields: Any) -> str:
    result = town.send(CREATE, {"title": title, **fields})
    bead_id: str = result["id"]
    return bead_id


def get(town: MemoryTown[MayorState], bead_id: str) -> dict[str, Any]:
    bead: dict[str, Any] = queries.answer(town.state, "get", {"id": bead_id})
    return bead


def ask(town: MemoryTown[MayorState], what: str, **body: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = queries.answer(town.state, what, body)
    return found


def titles(beads: list[dict[str, Any]]) -> list[str]:
    return [b["title"] for b in beads]


class TestCreate:
    def test_assigns_unique_non_empty_ids_with_the_prefix(self, town: MemoryTown[MayorState]) -> None:
        first, second = create(town, "first"), create(town, "second")
        assert first
        assert second
        assert first != second
        assert first.startswith("hq-")
        assert create(town, "third", prefix="gt").startswith("gt-")

    def test_sets_status_open_default_type_task_priority_2(self, town: MemoryTown[MayorState]) -> None:
        bead = get(town, create(town, "Build a Tower of Hanoi app"))
        assert (bead["status"], bead["type"], bead["priority"], bead["title"]) == (
            "open",
            "task",
            2,
            "Build a Tower of Hanoi app",
        )

    def test_keeps_explicit_type_assignee_and_description(self, town: MemoryTown[MayorState]) -> None:
        bead = get(town, create(town, "round trip", type="bug", assignee="mayor", description="d"))
        assert (bead["type"], bead["assignee"], bead["description"]) == ("bug", "mayor", "d")

    def test_stamps_created_at_from_the_command_time(self, town: MemoryTown[MayorState]) -> None:
        assert get(town, create(town, "t"))["created_at"] == T0.isoformat().replace("+00:00", "Z")

    def test_a_missing_parent_or_blocker_is_not_found(self, town: MemoryTown[MayorState]) -> None:
        assert town.reject_code(CREATE, {"title": "t", "parent": "hq-nope"}) == "not_found"
        assert town.reject_code(CREATE, {"title": "t", "needs": ["hq-nope"]}) == "not_found"

    def test_duplicate_labels_and_needs_are_stored_once(self, town: MemoryTown[MayorState]) -> None:
        blocker = create(town, "blocker")
        bead = get(town, create(town, "t", labels=["a", "a", "b"], needs=[blocker, blocker]))
        assert (bead["labels"], bead["needs"]) == (["a", "b"], [blocker])


class TestGet:
    def test_missing_bead_is_not_found(self, town: MemoryTown[MayorState]) -> None:
        create(town, "one")
        with pytest.raises(QueryError) as info:
            get(town, "nonexistent-999")
        assert info.value.code == "not_found"

    def test_missing_bead_on_an_empty_store(self, town: MemoryTown[MayorState]) -> None:
        with pytest.raises(QueryError):
            get(town, "nonexistent-999")


class TestClose:
    def test_close_sets_closed_with_reason_and_time(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        town.tick(60)
        town.send(CLOSE, {"id": bead_id, "reason": "done"})
        bead = get(town, bead_id)
        assert (bead["status"], bead["close_reason"]) == ("closed", "done")
        assert bead["closed_at"] > bead["created_at"]

    def test_close_not_found(self, town: MemoryTown[MayorState]) -> None:
        assert town.reject_code(CLOSE, {"id": "nonexistent-999"}) == "not_found"

    def test_closing_a_closed_bead_succeeds_and_changes_nothing(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        town.send(CLOSE, {"id": bead_id, "reason": "first"})
        events_before = town.log.last_seq
        result = town.send(CLOSE, {"id": bead_id, "reason": "second"})
        assert result == {"id": bead_id, "status": "closed", "changed": False}
        assert town.log.last_seq == events_before
        assert get(town, bead_id)["close_reason"] == "first"

    def test_close_removes_from_ready(self, town: MemoryTown[MayorState]) -> None:
        first = create(town, "first")
        create(town, "second")
        town.send(CLOSE, {"id": first})
        assert titles(ask(town, "ready")) == ["second"]


class TestForwardOnly:
    def test_claim_moves_open_to_in_progress(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        result = town.send(CLAIM, {"id": bead_id, "assignee": "polecat:rig/ace"})
        assert result["status"] == "in_progress"
        assert get(town, bead_id)["assignee"] == "polecat:rig/ace"

    def test_claim_by_the_same_assignee_again_is_a_no_op(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        town.send(CLAIM, {"id": bead_id, "assignee": "a"})
        before = town.log.last_seq
        assert town.send(CLAIM, {"id": bead_id, "assignee": "a"})["changed"] is False
        assert town.log.last_seq == before

    def test_claim_of_a_bead_held_by_someone_else_is_a_conflict(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        town.send(CLAIM, {"id": bead_id, "assignee": "a"})
        assert town.reject_code(CLAIM, {"id": bead_id, "assignee": "b"}) == "conflict"
        assert get(town, bead_id)["assignee"] == "a"

    def test_claiming_a_closed_bead_is_a_backward_transition(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        town.send(CLOSE, {"id": bead_id})
        assert town.reject_code(CLAIM, {"id": bead_id, "assignee": "a"}) == "backward_transition"

    @pytest.mark.parametrize(
        ("setup", "target"),
        [("close", "open"), ("close", "in_progress"), ("claim", "open"), ("close", "hooked")],
    )
    def test_status_can_never_move_back(self, town: MemoryTown[MayorState], setup: str, target: str) -> None:
        bead_id = create(town, "t")
        if setup == "claim":
            town.send(CLAIM, {"id": bead_id, "assignee": "a"})
        else:
            town.send(CLOSE, {"id": bead_id})
        status_before = get(town, bead_id)["status"]
        assert town.reject_code(UPDATE, {"id": bead_id, "status": target}) == "backward_transition"
        assert get(town, bead_id)["status"] == status_before

    def test_update_may_move_status_forward(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        result = town.send(UPDATE, {"id": bead_id, "status": "in_progress", "assignee": "a", "title": "t2"})
        assert result == {"id": bead_id, "status": "in_progress", "changed": True}
        assert (get(town, bead_id)["status"], get(town, bead_id)["title"]) == ("in_progress", "t2")
        town.send(UPDATE, {"id": bead_id, "status": "closed"})
        assert get(town, bead_id)["status"] == "closed"

    def test_update_to_in_progress_needs_an_assignee(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        assert town.reject_code(UPDATE, {"id": bead_id, "status": "in_progress"}) == "invalid"

    def test_hooked_comes_only_from_sling(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        assert town.reject_code(UPDATE, {"id": bead_id, "status": "hooked"}) == "invalid"

    def test_stating_the_current_status_is_accepted(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        assert town.send(UPDATE, {"id": bead_id, "status": "open"})["changed"] is False

    def test_an_unknown_status_is_invalid(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        assert town.reject_code(UPDATE, {"id": bead_id, "status": "done"}) == "invalid"


class TestUpdate:
    def test_description_changes(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t", description="original")
        town.send(UPDATE, {"id": bead_id, "description": "updated description"})
        assert get(town, bead_id)["description"] == "updated description"

    def test_not_found(self, town: MemoryTown[MayorState]) -> None:
        assert town.reject_code(UPDATE, {"id": "nonexistent-999", "description": "x"}) == "not_found"

    def test_an_empty_update_is_a_no_op_that_stores_nothing(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t", description="original")
        before = town.log.last_seq
        assert town.send(UPDATE, {"id": bead_id})["changed"] is False
        assert town.send(UPDATE, {"id": bead_id, "description": "original", "labels": []})["changed"] is False
        assert town.log.last_seq == before
        assert get(town, bead_id)["description"] == "original"

    def test_labels_append_and_never_replace(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t", labels=["a"])
        town.send(UPDATE, {"id": bead_id, "labels": ["b"]})
        town.send(UPDATE, {"id": bead_id, "labels": ["a", "c"]})
        assert get(town, bead_id)["labels"] == ["a", "b", "c"]

    def test_remove_labels_is_explicit_and_absent_labels_are_a_no_op(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t", labels=["a", "b", "c"])
        town.send(UPDATE, {"id": bead_id, "remove_labels": ["b", "zzz"]})
        assert get(town, bead_id)["labels"] == ["a", "c"]

    def test_adds_apply_before_removes(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t", labels=["a", "b"])
        town.send(UPDATE, {"id": bead_id, "labels": ["c"], "remove_labels": ["a"]})
        assert get(town, bead_id)["labels"] == ["b", "c"]

    def test_metadata_merges_and_an_empty_value_is_present(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t", metadata={"keep": "1"})
        town.send(UPDATE, {"id": bead_id, "metadata": {"key": "", "keep": "1"}})
        metadata = get(town, bead_id)["metadata"]
        assert metadata == {"keep": "1", "key": ""}
        assert "nonexistent" not in metadata

    def test_metadata_batch_sets_every_key(self, town: MemoryTown[MayorState]) -> None:
        bead_id = create(town, "t")
        town.send(UPDATE, {"id": bead_id, "metadata": {"key1": "value1", "key2": "value2", "key3": "value3"}})
        assert get(town, bead_id)["metadata"] == {"key1": "value1", "key2": "value2", "key3": "value3"}

    def test_assignee_and_parent_can_be_cleared(self, town: MemoryTown[MayorState]) -> None:
        parent = create(town, "p")
        bead_id = create(town, "t", assignee="a", parent=parent)
        town.send(UPDATE, {"id": bead_id, "assignee": "", "parent": ""})
        bead = get(town, bead_id)
        assert (bead["assignee"], bead["parent"]) == (None, None)
        assert ask(town, "children", id=parent) == []

    def test_a_bead_cannot_become_its_own_ancestor(self, town: MemoryTown[MayorState]) -> None:
        grandparent = create(town, "g")
        parent = create(town, "p", parent=grandparent)
        child = create(town, "c", parent=parent)
        assert town.reject_code(UPDATE, {"id": grandparent, "parent": child}) == "invalid"
        assert town.reject_code(UPDATE, {"id": child, "parent": child}) == "invalid"

    def test_reparenting_moves_the_bead_between_children_lists(self, town: MemoryTown[MayorState]) -> None:
        p1, p2 = create(town, "p1"), create(town, "p2")
        child = create(town, "c", parent=p1)
        town.send(UPDATE, {"id": child, "parent": p2})
        assert ask(town, "children", id=p1) == []
        assert titles(ask(town, "children", id=p2)) == ["c"]


class TestDependencies:
    def test_ready_respects_blocking_dependencies(self, town: MemoryTown[MayorState]) -> None:
        blocker = create(town, "blocker")
        create(town, "blocked", needs=[blocker])
        create(town, "ready")
        assert titles(ask(town, "ready")) == ["blocker", "ready"]
        town.send(CLOSE, {"id": blocker})
        assert titles(ask(town, "ready")) == ["blocked", "ready"]

    def test_needs_can_be_added_by_update(self, town: MemoryTown[MayorState]) -> None:
        a, b = create(town, "a"), create(town, "b")
        town.send(UPDATE, {"id": b, "needs": [a]})
        assert titles(ask(town, "ready")) == ["a"]

    def test_a_dependency_that_closes_a_cycle_is_refused(self, town: MemoryTown[MayorState]) -> None:
        a = create(town, "a")
        b = create(town, "b", needs=[a])
        c = create(town, "c", needs=[b])
        assert town.reject_code(UPDATE, {"id": a, "needs": [c]}) == "invalid"
        assert town.reject_code(UPDATE, {"id": a, "needs": [a]}) == "invalid"
        assert get(town, a)["needs"] == []

    def test_an_unknown_blocker_is_not_found(self, town: MemoryTown[MayorState]) -> None:
        a = create(town, "a")
        assert town.reject_code(UPDATE, {"id": a, "needs": ["hq-missing"]}) == "not_found"


class TestQueries:
    def test_list_returns_open_beads_in_creation_order(self, town: MemoryTown[MayorState]) -> None:
        for title in ("alpha", "beta", "gamma"):
            create(town, title)
        assert titles(ask(town, "list")) == ["alpha", "beta", "gamma"]
        assert titles(ask(town, "ready")) == ["alpha", "beta", "gamma"]

    def test_list_on_an_empty_store(self, town: MemoryTown[MayorState]) -> None:
        assert ask(town, "list") == []
        assert ask(town, "ready") == []

    def test_closed_beads_are_listed_only_when_asked(self, town: MemoryTown[MayorState]) -> None:
        create(town, "open one")
        town.send(CLOSE, {"id": create(town, "closed one")})
        assert titles(ask(town, "list")) == ["open one"]
        assert titles(ask(town, "list", status="closed")) == ["closed one"]
        assert titles(ask(town, "list", include_closed=True)) == ["open one", "closed one"]

    def test_list_filters_are_conjunctive(self, town: MemoryTown[MayorState]) -> None:
        parent = create(town, "parent", type="epic", labels=["root"])
        create(town, "match", labels=["focus"], parent=parent, assignee="ann")
        create(town, "wrong parent", labels=["focus"], assignee="ann")
        create(town, "wrong label", labels=["other"], parent=parent, assignee="ann")
        create(town, "wrong assignee", labels=["focus"], parent=parent, assignee="bob")
        create(town, "wrong type", type="bug", labels=["focus"], parent=parent, assignee="ann")
        found = ask(town, "list", type="task", label="focus", parent=parent, assignee="ann")
        assert titles(found) == ["match"]

    def test_list_by_status_and_limit(self, town: MemoryTown[MayorState]) -> None:
        for i in range(5):
            create(town, f"b{i}", labels=["batch:1"])
        town.send(CLAIM, {"id": ask(town, "list")[1]["id"], "assignee": "a"})
        assert titles(ask(town, "list", status="in_progress")) == ["b1"]
        assert len(ask(town, "list", label="batch:1", limit=2)) == 2
        assert len(ask(town, "list", label="batch:1", limit=0)) == 5

    def test_label_filter_matches_exactly(self, town: MemoryTown[MayorState]) -> None:
        create(town, "no label")
        create(town, "labelled", labels=["role:worker"])
        assert titles(ask(town, "list", label="role:worker")) == ["labelled"]
        assert ask(town, "list", label="role:mayor") == []
        assert ask(town, "list", label="role") == []

    def test_ready_excludes_infrastructure_types(self, town: MemoryTown[MayorState]) -> None:
        create(town, "task")
        for infra in sorted(INFRA_TYPES):
            create(town, infra, type=infra)
        assert titles(ask(town, "ready")) == ["task"]

    def test_types_are_case_sensitive_lowercase(self, town: MemoryTown[MayorState]) -> None:
        assert town.reject_code(CREATE, {"title": "t", "type": "CONVOY"}) == "invalid"
        create(town, "epic", type="epic")
        assert titles(ask(town, "ready")) == ["epic"]

    def test_children_in_creation_order_without_closed_unless_asked(self, town: MemoryTown[MayorState]) -> None:
        parent = create(town, "parent", type="molecule")
        c1 = create(town, "c1", parent=parent)
        create(town, "c2", parent=parent)
        create(town, "other")
        assert titles(ask(town, "children", id=parent)) == ["c1", "c2"]
        town.send(CLOSE, {"id": c1})
        assert titles(ask(town, "children", id=parent)) == ["c2"]
        assert titles(ask(town, "children", id=parent, include_closed=True)) == ["c1", "c2"]
        assert ask(town, "children", id="nonexistent") == []

    @pytest.mark.parametrize(
        ("what", "body", "code"),
        [
            ("get", {}, "invalid"),
            ("list", {"status": "done"}, "invalid"),
            ("list", {"limit": -1}, "invalid"),
            ("list", {"limit": "5"}, "invalid"),
            ("list", {"label": 3}, "invalid"),
            ("teleport", {}, "unknown_query"),
        ],
    )
    def test_bad_queries_are_answered_with_a_code(
        self, town: MemoryTown[MayorState], what: str, body: dict[str, Any], code: str
    ) -> None:
        with pytest.raises(QueryError) as info:
            queries.answer(town.state, what, body)
        assert info.value.code == code
