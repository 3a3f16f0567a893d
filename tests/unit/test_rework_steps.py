"""Work the merge queue sends back appends rework steps to the bead's molecule, never reopening a done step: the
mayor's fold and plan over the in-memory log, the witness waiting for them before it starts the session, and what
the agent is told (``gt prime``, the Stop hook). Pure: no NATS, no git."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from gt import narration
from gt.cli.polecats import stop_reason
from services.mayor import plan
from services.mayor.projection import new_projection
from services.mayor.state import MayorState, current_step
from services.witness.plan import needs_session
from shared.model.events import (
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestRequeued,
    MergeRequestSubmitted,
    MoleculeAttached,
    ReworkAdded,
    StepCompleted,
    StepSpec,
    decode_envelope,
)
from shared.model.formulas import rework
from shared.model.prime import Prime, prime_text
from tests import records
from tests.mayor_town import mayor_town
from tests.memory_log import MemoryTown
from tests.unit.test_witness_plan import World

FORMULA_STEPS = ["load-context", "implement", "commit", "self-review", "run-tests", "submit"]
BRANCH = "polecat/ace/{bead}"


def worked_bead(town: MemoryTown[MayorState], mr: str = "mr-1") -> str:
    """A bead slung with polecat-work, every step done by its polecat and submitted as merge request ``mr``."""
    bead = str(town.send("gt.cmd.bead.create", {"title": "Write CONFLICT.txt"})["id"])
    town.send("gt.cmd.bead.sling", {"id": bead, "rig": "demo", "no_convoy": True})
    for step in FORMULA_STEPS:
        town.send("gt.cmd.step.done", {"bead": bead, "step": step}, actor="polecat:demo/ace")
    submit(town, bead, mr)
    return bead


def submit(town: MemoryTown[MayorState], bead: str, mr: str) -> None:
    submitted = MergeRequestSubmitted(
        mr_id=mr, bead=bead, rig="demo", branch=BRANCH.format(bead=bead), target="main", head="a" * 40
    )
    refinery(town, submitted)


def refinery(town: MemoryTown[MayorState], *events: Any) -> None:
    """Events as the refinery stores them; then the mayor reconciles, as it does after every event it applies."""
    town.log.record(events, ts=town.clock, actor="refinery")
    town.log.replay(town.projection, after=town.projection.last_seq)
    town.reconcile()


def conflicted(mr: str = "mr-1") -> MergeRequestConflicted:
    return MergeRequestConflicted(
        mr_id=mr, target_commit="c0ffee" * 6 + "beef", conflict_command="", files=["CONFLICT.txt"], sent_back=True
    )


def of_type(town: MemoryTown[MayorState], kind: str) -> list[dict[str, Any]]:
    found = []
    for _, _, data in town.log.messages:
        env = decode_envelope(data)
        if env.type == kind:
            found.append({"actor": env.actor, **json.loads(bytes(env.data))})
    return found


def test_a_conflict_sent_back_appends_one_round_after_the_done_steps_which_stay_done() -> None:
    town = mayor_town()
    bead = worked_bead(town)
    molecule = town.state.molecules[bead]
    done_before = [(s.id, s.status, s.done_at) for s in molecule.steps]
    assert current_step(molecule) is None, "every step done: the agent ran `gt done`"

    refinery(town, conflicted())

    [added] = of_type(town, "molecule.rework_added")
    assert added["actor"] == "mayor"
    assert (added["mr_id"], added["round"], added["reason"]) == ("mr-1", 1, "conflict")
    ids = [s.id for s in molecule.steps]
    assert ids == [*FORMULA_STEPS, "rework-1-rebase", "rework-1-run-tests", "rework-1-submit"]
    assert [(s.id, s.status, s.done_at) for s in molecule.steps[:6]] == done_before, "no done step reopened"
    step = current_step(molecule)
    assert step is not None
    assert step.id == "rework-1-rebase"
    assert "CONFLICT.txt" in step.title
    assert "c0ffeec0ffee" in step.title
    assert "git rebase " + "c0ffee" * 6 + "beef" in step.description
    assert f"git push --force-with-lease origin {BRANCH.format(bead=bead)}" in step.description
    assert molecule.steps[7].needs == ["rework-1-rebase"]
    assert molecule.steps[8].needs == ["rework-1-run-tests"]
    assert town.state.send_backs == {}, "settled by the rework it got"
    assert town.reconcile() == 0, "appended once"

    # The rework steps are worked like any; the molecule completed once, when its formula's steps were done.
    for step_id in ("rework-1-rebase", "rework-1-run-tests", "rework-1-submit"):
        town.send("gt.cmd.step.done", {"bead": bead, "step": step_id}, actor="polecat:demo/ace")
    assert current_step(molecule) is None
    assert len(of_type(town, "molecule.completed")) == 1
    done = Counter(e["step"] for e in of_type(town, "step.done"))
    assert set(done.values()) == {1}, "no step done twice"
    assert town.send("gt.cmd.step.done", {"bead": bead, "step": "implement"})["changed"] is False


def test_the_rework_is_owed_once_across_a_restart_and_replay_owes_nothing_more() -> None:
    town = mayor_town()
    bead = worked_bead(town)
    # The mayor died before it reconciled: the send-back is in the log, its rework is not.
    town.log.record([conflicted()], ts=town.clock, actor="refinery")
    restarted = new_projection()
    town.log.replay(restarted)
    [owed] = plan.rework_owed(restarted.state)
    assert isinstance(owed.payload, ReworkAdded)
    assert owed.expected_seq == restarted.state.molecules[bead].version, "stored once even when decided twice"
    assert plan.rework_owed(restarted.state) == [owed], "level-triggered: the same decision until it is stored"

    # Stored (by one of them); a mayor replaying the log now owes nothing, and neither does the one that stored it.
    town.log.replay(town.projection, after=town.projection.last_seq)
    assert town.reconcile() == 1
    again = new_projection()
    town.log.replay(again)
    assert plan.rework_owed(again.state) == []
    assert again.serialize_state() == town.projection.serialize_state()
    assert len(of_type(town, "molecule.rework_added")) == 1


def test_a_failed_gate_gets_a_fix_round_and_a_second_send_back_a_second_round() -> None:
    town = mayor_town()
    bead = worked_bead(town)
    refinery(town, MergeRequestFailed(mr_id="mr-1", gate="test", exit_code=3, tail="AssertionError: 2 != 3"))
    molecule = town.state.molecules[bead]
    step = current_step(molecule)
    assert step is not None
    assert step.id == "rework-1-fix"
    assert "test gate" in step.title
    assert "exit 3" in step.description
    assert "AssertionError: 2 != 3" in step.description
    for step_id in ("rework-1-fix", "rework-1-run-tests", "rework-1-submit"):
        town.send("gt.cmd.step.done", {"bead": bead, "step": step_id}, actor="polecat:demo/ace")
    submit(town, bead, "mr-2")
    refinery(town, conflicted("mr-2"))
    assert [s.id for s in molecule.steps][-3:] == ["rework-2-rebase", "rework-2-run-tests", "rework-2-submit"]
    assert [e["round"] for e in of_type(town, "molecule.rework_added")] == [1, 2]
    assert all(s.status == "done" for s in molecule.steps[:9])


def test_nothing_is_owed_for_an_escalation_a_conflict_for_the_operator_a_resubmission_or_a_closed_bead() -> None:
    town = mayor_town()
    escalated = worked_bead(town, "mr-e")
    refinery(town, MergeRequestFailed(mr_id="mr-e", gate="test", exit_code=1, escalated=True))
    operators = worked_bead(town, "mr-o")
    refinery(town, MergeRequestConflicted(mr_id="mr-o", target_commit="t", conflict_command="conflict-mr-o"))
    resubmitted = worked_bead(town, "mr-r")
    town.log.record(
        [MergeRequestFailed(mr_id="mr-r", gate="test", exit_code=1), MergeRequestRequeued(mr_id="mr-r", reason="x")],
        ts=town.clock,
        actor="refinery",
    )
    closed = worked_bead(town, "mr-c")
    town.log.record([conflicted("mr-c")], ts=town.clock, actor="refinery")
    town.log.replay(town.projection, after=town.projection.last_seq)
    town.send("gt.cmd.bead.close", {"id": closed, "reason": "done elsewhere"})
    assert of_type(town, "molecule.rework_added") == []
    for bead in (escalated, operators, resubmitted, closed):
        assert [s.id for s in town.state.molecules[bead].steps] == FORMULA_STEPS
    assert town.state.send_backs == {}
    assert town.state.merge_requests.keys() == {"mr-e", "mr-o", "mr-r"}, "a closed bead's are dropped"


def test_round_numbers_and_names() -> None:
    assert rework.next_round(FORMULA_STEPS) == 1
    assert rework.next_round([*FORMULA_STEPS, "rework-1-fix", "rework-1-submit", "rework-2-rebase"]) == 3
    assert rework.what("rework-12-run-tests") == "run-tests"
    assert rework.what("run-tests") is None
    assert not rework.is_rework("reworked-1-fix")
    told, kind = narration.describe(
        "molecule.rework_added",
        {"bead_id": "b", "mr_id": "mr-1", "reason": "conflict", "steps": [{"id": "rework-1-rebase"}]},
    )
    assert (told, kind) == (
        "bead b: merge request mr-1 sent back (conflict): rework steps rework-1-rebase appended",
        "warn",
    )


def test_the_witness_starts_the_sent_back_session_only_once_the_rework_steps_are_there() -> None:
    w = World()
    w.rig()
    w.bead("gt-abc")
    specs = [StepSpec(id=s, title=s) for s in FORMULA_STEPS]
    w.add(MoleculeAttached(bead_id="gt-abc", formula="polecat-work", steps=specs))
    session = w.running("gt-abc")
    w.add(*(StepCompleted(bead_id="gt-abc", step=s) for s in FORMULA_STEPS))
    w.add(MergeRequestSubmitted(mr_id="mr-1", bead="gt-abc", rig="demo", branch="b", target="main", head="abc"))
    w.end(session, "done", removed=True)
    w.add(conflicted())
    bead, rig = w.state.beads["gt-abc"], w.state.rigs["demo"]
    assert needs_session(w.state, bead, rig) == (False, None), "told every step is done, it would run `gt done`"
    steps = rework.rework_steps(1, mr="mr-1", reason="conflict", files=["CONFLICT.txt"], target_commit="t")
    w.add(ReworkAdded(bead_id="gt-abc", mr_id="mr-1", sent_back_by="ev-x", round=1, reason="conflict", steps=steps))
    assert needs_session(w.state, bead, rig) == (True, None)
    assert bead.current_step == "rework-1-rebase"
    assert bead.steps[-3:] == ["rework-1-rebase", "rework-1-run-tests", "rework-1-submit"]


def prime_data(current: dict[str, Any] | None) -> Prime:
    steps = [{"id": s, "title": s, "status": "done"} for s in FORMULA_STEPS]
    if current is not None:
        steps.append({**current, "status": "pending"})
    return records.prime(
        session="gt-abc-2",
        attempt=2,
        rig={"name": "demo", "base_branch": "main", "test_command": "make test"},
        worktree="/town/rigs/demo/polecats/ace",
        branch="polecat/ace/gt-abc",
        bead={"id": "gt-abc", "status": "in_progress", "title": "Write CONFLICT.txt"},
        molecule={
            "formula": "polecat-work",
            "done": 6,
            "total": len(steps),
            "steps": steps,
            "current_step": current["id"] if current else None,
        },
        current_step=current,
        merge_failure={
            "mr": "mr-1",
            "gate": "conflict",
            "exit_code": 0,
            "files": ["CONFLICT.txt"],
            "target_commit": "c0ffee",
        },
        instructions="INSTRUCTIONS",
    )


def test_prime_leads_with_the_send_back_while_a_rework_step_is_current_and_the_stop_hook_names_it() -> None:
    [first, *_] = rework.rework_steps(1, mr="mr-1", reason="conflict", files=["CONFLICT.txt"], target_commit="c0ffee")
    data = prime_data({"id": first.id, "title": first.title, "description": first.description})
    text = prime_text(data)
    lines = text.splitlines()
    assert lines[2].startswith("Hook: bead gt-abc")
    assert lines[4].startswith("The merge queue sent this work back: merge request mr-1 conflicted"), text
    assert "CONFLICT.txt" in lines[4]
    assert "c0ffee" in lines[4]
    assert "`rework-1-rebase`" in lines[4]
    assert "Every step is done" not in text
    assert "Current step: rework-1-rebase" in text
    reason = stop_reason(data)
    assert reason is not None
    assert "rework-1-rebase" in reason
    assert "sent your work back" in reason
    assert "Every step" not in reason

    # Once the round's steps are done, `gt done` is what is left; the send-back is still told, further down.
    finished = prime_text(prime_data(None))
    assert "Every step is done: run `gt done`." in finished
    assert finished.index("Every step is done") < finished.index("conflicted with the target")


def test_every_runtime_is_told_to_integrate_with_what_landed_never_to_keep_both_sides() -> None:
    """The rework step and `gt prime` (what every runtime reads) ask for an integration that keeps what landed
    working and the gates green; "keep both changes" merged two contradicting sentences into main."""
    [first, *_] = rework.rework_steps(1, mr="mr-1", reason="conflict", files=["README.md"], target_commit="c0ffee")
    primed = prime_text(prime_data({"id": first.id, "title": first.title, "description": first.description}))
    for text in (first.description, primed):
        flat = " ".join(text.split())
        assert "keeping both" not in flat
        assert "Integrate your change with what landed" in flat
        assert "keep what is on the target now as it is and working" in flat
        assert "what landed stands" in flat
        assert "Never keep both sides of a conflict side by side" in flat
        assert "gates must pass" in flat
    assert "what landed is kept and still works" in first.acceptance
