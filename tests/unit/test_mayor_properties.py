"""Properties of the mayor over random command sequences (hypothesis)."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.mayor.decide import decide
from services.mayor.projection import STATUS_RANK, MayorState, new_projection
from shared.errors import CommandError
from tests.memory_log import MemoryTown

SLOTS = 6  # commands refer to beads by creation slot, so they mostly hit beads that exist

command = st.one_of(
    st.fixed_dictionaries(
        {"verb": st.just("create"), "labels": st.lists(st.sampled_from("abc"), max_size=2)},
        optional={"needs": st.lists(st.integers(0, SLOTS), max_size=2), "parent": st.integers(0, SLOTS)},
    ),
    st.fixed_dictionaries(
        {"verb": st.just("update"), "slot": st.integers(0, SLOTS)},
        optional={
            "status": st.sampled_from(["open", "hooked", "in_progress", "closed"]),
            "assignee": st.sampled_from(["a", "b", ""]),
            "labels": st.lists(st.sampled_from("abc"), max_size=2),
            "remove_labels": st.lists(st.sampled_from("abc"), max_size=2),
            "needs": st.lists(st.integers(0, SLOTS), max_size=2),
            "metadata": st.dictionaries(st.sampled_from("xy"), st.sampled_from(["", "1"]), max_size=2),
        },
    ),
    st.fixed_dictionaries({"verb": st.just("claim"), "slot": st.integers(0, SLOTS), "who": st.sampled_from("ab")}),
    st.fixed_dictionaries({"verb": st.just("close"), "slot": st.integers(0, SLOTS)}),
)


def _run(commands: list[dict[str, Any]]) -> tuple[MemoryTown[MayorState], list[dict[str, str]]]:
    town = MemoryTown(new_projection(), decide)
    created: list[str] = []
    statuses: list[dict[str, str]] = []

    def bead(slot: int) -> str:
        return created[slot] if slot < len(created) else f"hq-missing{slot}"

    for cmd in commands:
        verb = cmd["verb"]
        body: dict[str, Any]
        if verb == "create":
            body = {"title": "t", "labels": cmd["labels"], "needs": [bead(s) for s in cmd.get("needs", [])]}
            if "parent" in cmd:
                body["parent"] = bead(cmd["parent"])
        elif verb == "update":
            body = {k: v for k, v in cmd.items() if k not in ("verb", "slot", "needs")}
            body["id"] = bead(cmd["slot"])
            body["needs"] = [bead(s) for s in cmd.get("needs", [])]
        elif verb == "claim":
            body = {"id": bead(cmd["slot"]), "assignee": cmd["who"]}
        else:
            body = {"id": bead(cmd["slot"])}
        try:
            result = town.send(f"gt.cmd.bead.{verb}", body)
        except CommandError:
            pass
        else:
            if verb == "create":
                created.append(result["id"])
        statuses.append({b.id: b.status for b in town.state.beads.values()})
        town.tick()
    return town, statuses


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(command, max_size=40))
def test_no_bead_status_ever_moves_backward(commands: list[dict[str, Any]]) -> None:
    _, history = _run(commands)
    for before, after in itertools.pairwise(history):
        for bead_id, status in before.items():
            assert STATUS_RANK[after[bead_id]] >= STATUS_RANK[status], (bead_id, status, after[bead_id])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(command, max_size=40), st.data())
def test_replay_and_snapshot_plus_tail_equal_the_live_projection(
    commands: list[dict[str, Any]], data: st.DataObject
) -> None:
    town, _ = _run(commands)
    replayed = new_projection()
    town.log.replay(replayed)
    assert replayed.serialize_state() == town.projection.serialize_state()

    cut = data.draw(st.integers(0, town.log.last_seq))
    head = new_projection()
    for seq, subject, raw in town.log.messages[:cut]:
        head.apply(seq, subject, raw)
    resumed = new_projection()
    assert resumed.restore(head.snapshot("s"), stream_id="s", stream_last_seq=town.log.last_seq)
    town.log.replay(resumed, after=resumed.last_seq)
    assert resumed.serialize_state() == town.projection.serialize_state()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(command, max_size=40))
def test_no_dependency_cycle_is_ever_stored(commands: list[dict[str, Any]]) -> None:
    town, _ = _run(commands)
    beads = town.state.beads
    for start in beads:
        seen: set[str] = set()
        stack = list(beads[start].needs)
        while stack:
            current = stack.pop()
            assert current != start, f"{start} depends on itself"
            if current in seen or current not in beads:
                continue
            seen.add(current)
            stack.extend(beads[current].needs)
