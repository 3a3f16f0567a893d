"""Dispatch in dependency order, the pure parts: convoy waves, the holds reconcile releases, how they are told."""

from __future__ import annotations

from gt import narration as narrate
from gt.cli import render
from services.mayor import plan
from services.mayor.state import convoy_waves
from shared.model.events import REGISTRY, BeadSlung, RigRemoved, decode_envelope
from tests import records
from tests.mayor_town import mayor_town

CREATE, UPDATE, CLOSE, SLING = "gt.cmd.bead.create", "gt.cmd.bead.update", "gt.cmd.bead.close", "gt.cmd.bead.sling"


def test_waves_follow_the_longest_chain_of_needs_inside_the_convoy() -> None:
    town = mayor_town()
    outside = town.send(CREATE, {"title": "outside"})["id"]
    top = town.send(CREATE, {"title": "top"})["id"]
    left = town.send(CREATE, {"title": "left", "needs": [top]})["id"]
    right = town.send(CREATE, {"title": "right", "needs": [top, outside]})["id"]
    bottom = town.send(CREATE, {"title": "bottom", "needs": [left, right]})["id"]
    late = town.send(CREATE, {"title": "late", "needs": [top, bottom]})["id"]
    convoy_id = town.send("gt.cmd.convoy.create", {"title": "c", "beads": [late, bottom, right, left, top]})["id"]
    waves = convoy_waves(town.state, town.state.convoys[convoy_id])
    assert waves == {top: 1, left: 2, right: 2, bottom: 3, late: 4}


def test_a_chain_longer_than_the_recursion_limit_has_a_wave_per_link() -> None:
    town = mayor_town()
    chain = [town.send(CREATE, {"title": "0"})["id"]]
    for i in range(1, 1500):
        chain.append(town.send(CREATE, {"title": str(i), "needs": [chain[-1]]})["id"])
    convoy_id = town.send("gt.cmd.convoy.create", {"title": "c"})["id"]
    newest_first = list(reversed(chain))
    for at in range(0, len(newest_first), 250):  # a command names at most 256 beads
        town.send("gt.cmd.convoy.add", {"id": convoy_id, "beads": newest_first[at : at + 250]})
    waves = convoy_waves(town.state, town.state.convoys[convoy_id])
    assert [waves[b] for b in chain] == list(range(1, 1501))


def test_a_hold_is_owed_its_sling_once_its_blockers_close_and_not_before() -> None:
    town = mayor_town()  # reconciles after every command, as the service does after every change
    blocker = town.send(CREATE, {"title": "blocker"})["id"]
    held = town.send(CREATE, {"title": "held", "needs": [blocker]})["id"]
    assert town.send(SLING, {"id": held, "rig": "demo", "hold": True, "no_convoy": True})["status"] == "held"
    assert plan.released_holds(town.state) == []
    assert (town.state.beads[held].status, list(town.state.holds)) == ("open", [held])
    town.send(CLOSE, {"id": blocker, "reason": "won't do"})  # closed is closed
    assert (town.state.beads[held].status, town.state.beads[held].rig, town.state.holds) == ("hooked", "demo", {})
    [slung] = [m for m in town.log.messages if m[1] == f"gt.evt.bead.{held}" and b'"bead.slung"' in m[2]]
    env = decode_envelope(slung[2])
    assert env.actor == "mayor"
    assert REGISTRY.decode_payload(env) == BeadSlung(bead_id=held, rig="demo", held_for=[blocker])
    assert town.reconcile() == 0


def test_a_blocker_added_to_a_held_bead_holds_it_longer() -> None:
    town = mayor_town()
    first, second = (town.send(CREATE, {"title": t})["id"] for t in ("first", "second"))
    held = town.send(CREATE, {"title": "held", "needs": [first]})["id"]
    town.send(SLING, {"id": held, "rig": "demo", "hold": True, "no_convoy": True})
    town.send(UPDATE, {"id": held, "needs": [second]})
    town.send(CLOSE, {"id": first})
    assert town.state.beads[held].status == "open"
    town.send(CLOSE, {"id": second})
    assert town.state.beads[held].status == "hooked"


def test_slings_and_holds_are_told_with_their_blockers() -> None:
    forced, _ = narrate.describe("bead.slung", {"bead_id": "b", "rig": "r", "forced": True, "ignored_blockers": ["a"]})
    assert forced == "bead b slung to rig r (forced past open blocker a)"
    released, _ = narrate.describe("bead.slung", {"bead_id": "b", "rig": "r", "held_for": ["a", "c"]})
    assert released == "bead b slung to rig r (held until a, c closed)"
    held, _ = narrate.describe("bead.held", {"bead_id": "b", "rig": "r", "blockers": ["a"]})
    assert held == "bead b held for rig r: slung once a closed"


def test_convoy_status_lists_beads_wave_by_wave_with_what_held_and_blocked_ones_wait_for() -> None:
    beads = [
        {"id": "a", "title": "A", "status": "hooked", "rig": "demo", "wave": 1, "waiting_for": [], "held_for": None},
        {"id": "b", "title": "B", "status": "open", "rig": None, "wave": 2, "waiting_for": ["a"], "held_for": "demo"},
        {"id": "c", "title": "C", "status": "open", "rig": None, "wave": 1, "waiting_for": ["x"], "held_for": None},
    ]
    text = render.convoy_detail(records.convoy(id="cv-1", title="Sprint", total=3, held=1, bead_details=beads))
    lines = [line.split() for line in text.splitlines()]
    assert lines[1][-2:] == ["1", "held"]
    assert "0/3," in lines[1]
    assert lines[2] == ["WAVE", "BEAD", "STATUS", "RIG", "TITLE"]
    assert lines[3] == ["1", "a", "hooked", "demo", "A"]
    assert lines[4] == ["1", "c", "blocked:", "waiting", "for", "x", "-", "C"]  # wave by wave
    assert lines[5] == ["2", "b", "held:", "waiting", "for", "a", "demo", "B"]


def test_a_bead_held_for_a_rig_removed_since_stays_held_instead_of_being_slung_there() -> None:
    town = mayor_town()
    blocker = town.send(CREATE, {"title": "blocker"})["id"]
    held = town.send(CREATE, {"title": "held", "needs": [blocker]})["id"]
    town.send(SLING, {"id": held, "rig": "web", "hold": True, "no_convoy": True})
    town.log.record([RigRemoved(rig="web")], ts=town.clock, actor="witness")
    town.log.replay(town.projection, after=town.projection.last_seq)
    town.send(CLOSE, {"id": blocker})
    assert (town.state.beads[held].status, list(town.state.holds)) == ("open", [held]), "never slung to a removed rig"
    moved = town.send(SLING, {"id": held, "rig": "demo", "hold": True, "no_convoy": True})
    assert (moved["status"], town.state.beads[held].rig) == ("hooked", "demo"), "a sling elsewhere takes it"
