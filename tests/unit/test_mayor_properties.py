"""Properties of the mayor over random command sequences on beads, molecules and convoys (hypothesis)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.mayor.projection import new_projection
from services.mayor.state import STATUS_RANK, STEP_RANK, MayorState
from shared.core.errors import CommandError
from tests.mayor_town import mayor_town
from tests.memory_log import MemoryTown

SLOTS = 6  # commands name beads and convoys by creation slot, so they mostly hit things that exist
STEPS = ["load-context", "implement", "commit", "self-review", "run-tests", "submit"]
slot = st.integers(0, SLOTS)

command = st.one_of(
    st.fixed_dictionaries(
        {"verb": st.just("create"), "labels": st.lists(st.sampled_from("abc"), max_size=2)},
        optional={"needs": st.lists(slot, max_size=2), "parent": slot},
    ),
    st.fixed_dictionaries(
        {"verb": st.just("update"), "slot": slot},
        optional={
            "status": st.sampled_from(["open", "hooked", "in_progress", "closed"]),
            "assignee": st.sampled_from(["a", "b", ""]),
            "labels": st.lists(st.sampled_from("abc"), max_size=2),
            "remove_labels": st.lists(st.sampled_from("abc"), max_size=2),
            "needs": st.lists(slot, max_size=2),
            "blocks": st.lists(slot, max_size=1),
        },
    ),
    st.fixed_dictionaries({"verb": st.just("claim"), "slot": slot, "who": st.sampled_from("ab")}),
    st.fixed_dictionaries({"verb": st.just("close"), "slot": slot}),
    st.fixed_dictionaries(
        {"verb": st.just("sling"), "slot": slot, "force": st.booleans()},
        optional={"no_convoy": st.booleans(), "owned": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"verb": st.sampled_from(["step-start", "step-done"]), "slot": slot, "step": st.sampled_from(STEPS)}
    ),
    st.fixed_dictionaries(
        {"verb": st.just("convoy-create"), "beads": st.lists(slot, max_size=3), "owned": st.booleans()}
    ),
    st.fixed_dictionaries(
        {"verb": st.just("convoy-add"), "convoy": slot, "beads": st.lists(slot, min_size=1, max_size=2)}
    ),
    st.fixed_dictionaries({"verb": st.just("convoy-land"), "convoy": slot, "force": st.booleans()}),
)


def _snapshot(state: MayorState) -> dict[str, Any]:
    return {
        "beads": {b.id: b.status for b in state.beads.values()},
        "steps": {(m.bead_id, s.id): s.status for m in state.molecules.values() for s in m.steps},
        "convoys": {c.id: c.status for c in state.convoys.values()},
    }


def _run(commands: list[dict[str, Any]]) -> tuple[MemoryTown[MayorState], list[dict[str, Any]]]:
    town = mayor_town()
    beads: list[str] = []
    convoys: list[str] = []
    history = [_snapshot(town.state)]

    def bead(i: int) -> str:
        return beads[i] if i < len(beads) else f"hq-missing{i}"

    def convoy(i: int) -> str:
        return convoys[i] if i < len(convoys) else f"cv-missing{i}"

    for cmd in commands:
        verb = cmd["verb"]
        subject, body = _command(cmd, bead, convoy)
        try:
            result = town.send(subject, body)
        except CommandError:
            pass
        else:
            if verb == "create":
                beads.append(result["id"])
            elif verb == "convoy-create":
                convoys.append(result["id"])
        town.tick(3600)
        history.append(_snapshot(town.state))
    return town, history


def _command(cmd: dict[str, Any], bead: Any, convoy: Any) -> tuple[str, dict[str, Any]]:
    verb = cmd["verb"]
    if verb == "create":
        body: dict[str, Any] = {"title": "t", "labels": cmd["labels"], "needs": [bead(s) for s in cmd.get("needs", [])]}
        if "parent" in cmd:
            body["parent"] = bead(cmd["parent"])
        return "gt.cmd.bead.create", body
    if verb == "update":
        body = {k: v for k, v in cmd.items() if k not in ("verb", "slot", "needs", "blocks")}
        body.update(id=bead(cmd["slot"]), needs=[bead(s) for s in cmd.get("needs", [])])
        body["blocks"] = [bead(s) for s in cmd.get("blocks", [])]
        return "gt.cmd.bead.update", body
    if verb == "claim":
        return "gt.cmd.bead.claim", {"id": bead(cmd["slot"]), "assignee": cmd["who"]}
    if verb == "close":
        return "gt.cmd.bead.close", {"id": bead(cmd["slot"])}
    if verb == "sling":
        body = {"id": bead(cmd["slot"]), "rig": "demo", "force": cmd["force"]}
        body.update({k: cmd[k] for k in ("no_convoy", "owned") if k in cmd})
        return "gt.cmd.bead.sling", body
    if verb in ("step-start", "step-done"):
        return f"gt.cmd.step.{verb.removeprefix('step-')}", {"bead": bead(cmd["slot"]), "step": cmd["step"]}
    if verb == "convoy-create":
        return "gt.cmd.convoy.create", {"title": "c", "beads": [bead(s) for s in cmd["beads"]], "owned": cmd["owned"]}
    if verb == "convoy-add":
        return "gt.cmd.convoy.add", {"id": convoy(cmd["convoy"]), "beads": [bead(s) for s in cmd["beads"]]}
    return "gt.cmd.convoy.land", {"id": convoy(cmd["convoy"]), "force": cmd["force"]}


PROPERTY_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(st.lists(command, max_size=50))
def test_nothing_ever_moves_backward(commands: list[dict[str, Any]]) -> None:
    _, history = _run(commands)
    for before, after in itertools.pairwise(history):
        for bead_id, status in before["beads"].items():
            assert STATUS_RANK[after["beads"][bead_id]] >= STATUS_RANK[status], (bead_id, status)
        for key, status in before["steps"].items():
            assert STEP_RANK[after["steps"][key]] >= STEP_RANK[status], (key, status)
        for convoy_id, status in before["convoys"].items():
            assert not (status == "closed" and after["convoys"][convoy_id] != "closed"), convoy_id


@PROPERTY_SETTINGS
@given(st.lists(command, max_size=50))
def test_no_step_is_done_twice_and_no_convoy_closes_twice(commands: list[dict[str, Any]]) -> None:
    town, _ = _run(commands)
    envelopes = [json.loads(data) for _, _, data in town.log.messages]
    done = Counter((e["data"]["bead_id"], e["data"]["step"]) for e in envelopes if e["type"] == "step.done")
    closed = Counter(e["data"]["convoy_id"] for e in envelopes if e["type"] == "convoy.closed")
    completed = Counter(e["data"]["bead_id"] for e in envelopes if e["type"] == "molecule.completed")
    assert max(done.values(), default=1) == 1
    assert max(closed.values(), default=1) == 1
    assert max(completed.values(), default=1) == 1
    # And every non-owned convoy whose beads are all closed has been closed (level-triggered).
    for convoy in town.state.convoys.values():
        statuses = [town.state.beads[b].status for b in convoy.beads]
        if convoy.beads and not convoy.owned and all(s == "closed" for s in statuses):
            assert convoy.status == "closed"


@PROPERTY_SETTINGS
@given(st.lists(command, max_size=50), st.data())
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


@PROPERTY_SETTINGS
@given(st.lists(command, max_size=50))
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
