"""The mayor's side of rigs: it knows them from the witness's rig events, refuses slings to rigs that do not
take work, lets slings to a parked rig wait, and gives a hook back on unsling. Pure."""

from __future__ import annotations

import pytest

from services.mayor.state import MayorState
from shared.core.errors import CommandError
from shared.model.events import RigParked, RigRemoved
from tests.mayor_town import add_rigs, mayor_town
from tests.memory_log import MemoryTown

SLING, UNSLING = "gt.cmd.bead.sling", "gt.cmd.bead.unsling"


def rejected(town: MemoryTown[MayorState], subject: str, body: dict[str, object]) -> CommandError:
    with pytest.raises(CommandError) as caught:
        town.send(subject, body)
    return caught.value


def test_a_sling_to_an_unknown_rig_is_not_found_and_names_the_rigs() -> None:
    town = mayor_town(rigs=())
    bead = town.send("gt.cmd.bead.create", {"title": "t"})["id"]
    before = town.log.last_seq
    none = rejected(town, SLING, {"id": bead, "rig": "nosuchrig"})
    assert (none.code, none.message) == ("not_found", "no rig 'nosuchrig'; no rigs yet; add one with gt rig add")
    add_rigs(town, "web", "demo")
    some = rejected(town, SLING, {"id": bead, "rig": "nosuchrig"})
    assert some.message == "no rig 'nosuchrig'; rigs: demo, web"
    assert town.log.last_seq == before + 2, "only the two rig.added: nothing on the bead"
    assert town.state.beads[bead].status == "open"


def test_a_removed_rig_takes_no_sling_and_a_parked_one_takes_it_waiting() -> None:
    town = mayor_town()
    a, b = (town.send("gt.cmd.bead.create", {"title": t})["id"] for t in ("a", "b"))
    town.log.record([RigParked(rig="demo"), RigRemoved(rig="web")], ts=town.clock)
    town.log.replay(town.projection, after=town.projection.last_seq)
    assert town.send(SLING, {"id": a, "rig": "demo"})["parked"] is True
    gone = rejected(town, SLING, {"id": b, "rig": "web"})
    assert (gone.code, gone.message) == ("not_found", "rig 'web' was removed; rigs: demo")


def test_unsling_gives_the_hook_back_and_keeps_the_molecule_and_convoy() -> None:
    town = mayor_town()
    bead = town.send("gt.cmd.bead.create", {"title": "t"})["id"]
    release = town.send("gt.cmd.convoy.create", {"title": "Release", "beads": [bead]})["id"]
    first = town.send(SLING, {"id": bead, "rig": "demo"})
    assert first["convoy"] is not None, "a convoy of the operator's does not stand for the auto-convoy"
    town.send("gt.cmd.step.done", {"bead": bead, "step": "load-context"})
    town.send("gt.cmd.bead.claim", {"id": bead, "assignee": "polecat:demo/ace"})
    out = town.send(UNSLING, {"id": bead, "reason": "wrong rig"})
    assert (out["status"], out["rig"], out["was"]) == ("open", "demo", "in_progress")
    state = town.state.beads[bead]
    assert (state.status, state.rig) == ("open", None)
    assert [s.status for s in town.state.molecules[bead].steps][:2] == ["done", "pending"], "done stays done"
    again = town.send(SLING, {"id": bead, "rig": "web"})
    assert (again["status"], again["convoy"], again["formula"]) == ("hooked", None, None)
    assert town.state.beads[bead].convoys == [release, first["convoy"]], "the auto-convoy still tracks it"
    assert town.state.molecules[bead].steps[0].status == "done"


def test_unsling_of_an_open_or_closed_bead_is_refused() -> None:
    town = mayor_town()
    bead = town.send("gt.cmd.bead.create", {"title": "t"})["id"]
    assert rejected(town, UNSLING, {"id": bead}).code == "conflict"
    town.send("gt.cmd.bead.close", {"id": bead})
    assert rejected(town, UNSLING, {"id": bead}).code == "backward_transition"
    assert rejected(town, UNSLING, {"id": "hq-nothere"}).code == "not_found"
