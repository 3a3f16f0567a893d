"""The agent runtime a sling chooses for its bead (`gt sling --agent`), the mayor's side: a runtime's name or the
command is refused before anything is recorded, and the choice is the bead's, carried on by every later sling
(the witness's re-slings, a held bead's release, a sling after an unsling) until a sling names another. Pure."""

from __future__ import annotations

import pytest

from gt import narration as narrate
from gt.cli import render
from services.mayor.state import MayorState
from shared.core.errors import CommandError
from shared.model.beads import BeadDetail
from shared.model.events import REGISTRY, BeadHeld, BeadSlung, decode_envelope
from tests.mayor_town import mayor_town
from tests.memory_log import MemoryTown

CREATE, CLOSE, SLING, UNSLING = "gt.cmd.bead.create", "gt.cmd.bead.close", "gt.cmd.bead.sling", "gt.cmd.bead.unsling"


def hooks(town: MemoryTown[MayorState], bead: str) -> list[BeadSlung | BeadHeld]:
    """The bead's ``bead.slung`` and ``bead.held`` events, oldest first, as the log holds them."""
    payloads = (
        REGISTRY.decode_payload(decode_envelope(m[2])) for m in town.log.messages if m[1] == f"gt.evt.bead.{bead}"
    )
    return [p for p in payloads if isinstance(p, BeadSlung | BeadHeld)]


@pytest.mark.parametrize("agent", ["codx", "claude --model opus", "", "CODEX"])
def test_an_agent_that_is_no_runtime_is_refused_naming_the_runtimes_and_nothing_is_recorded(agent: str) -> None:
    town = mayor_town()
    bead = town.send(CREATE, {"title": "t"})["id"]
    before = town.log.last_seq
    with pytest.raises(CommandError) as caught:
        town.send(SLING, {"id": bead, "rig": "demo", "agent": agent})  # the body as `nats pub` sends it
    assert caught.value.code == "invalid"
    assert caught.value.message == (
        f"`agent` {agent!r} is not an agent runtime; the runtimes: claude, codex, gemini, gt-agent, opencode "
        "(a command line of your own is a rig's agent: `gt rig add --agent`)"
    )
    assert town.log.last_seq == before, "nothing recorded"
    assert (town.state.beads[bead].status, town.state.beads[bead].agent) == ("open", None)


def test_a_sling_with_an_agent_records_it_on_the_sling_and_the_bead_and_one_without_says_nothing() -> None:
    town = mayor_town()
    chosen, plain = (town.send(CREATE, {"title": t})["id"] for t in ("chosen", "plain"))
    result = town.send(SLING, {"id": chosen, "rig": "demo", "agent": "codex"})
    assert (result["status"], result["agent"]) == ("hooked", "codex")
    assert [h.agent for h in hooks(town, chosen)] == ["codex"]
    assert town.state.beads[chosen].agent == "codex"
    assert "agent" not in town.send(SLING, {"id": plain, "rig": "demo"}), "the rig's agent runs it"
    assert [h.agent for h in hooks(town, plain)] == [None]


def test_the_choice_is_the_beads_re_slings_carry_it_on_until_one_names_another() -> None:
    town = mayor_town()
    bead = town.send(CREATE, {"title": "t"})["id"]
    town.send(SLING, {"id": bead, "rig": "demo", "agent": "codex"})
    # The witness's re-sling after a death names no agent: the bead's carries on.
    resling = town.send(SLING, {"id": bead, "rig": "demo", "force": True, "session": f"{bead}-2"})
    assert resling["agent"] == "codex"
    town.send(UNSLING, {"id": bead})
    assert town.send(SLING, {"id": bead, "rig": "web"})["agent"] == "codex", "slung again after an unsling"
    assert town.send(SLING, {"id": bead, "rig": "web", "force": True, "agent": "gemini"})["agent"] == "gemini"
    assert [h.agent for h in hooks(town, bead)] == ["codex", "codex", "codex", "gemini"]
    assert town.state.beads[bead].agent == "gemini"


def test_a_held_sling_keeps_its_agent_and_the_mayors_sling_of_it_carries_it() -> None:
    town = mayor_town()
    blocker = town.send(CREATE, {"title": "blocker"})["id"]
    bead = town.send(CREATE, {"title": "held", "needs": [blocker]})["id"]
    held = {"id": bead, "rig": "demo", "hold": True, "no_convoy": True}
    assert town.send(SLING, held | {"agent": "codex"})["agent"] == "codex"
    again = town.send(SLING, held)
    assert (again["changed"], again["agent"]) == (False, "codex"), "held as it was: the same rig, the same agent"
    assert town.send(SLING, held | {"agent": "gemini"})["changed"] is True, "held again, to run another"
    town.send(CLOSE, {"id": blocker})
    assert [(type(h).__name__, h.agent) for h in hooks(town, bead)] == [
        ("BeadHeld", "codex"),
        ("BeadHeld", "gemini"),
        ("BeadSlung", "gemini"),
    ]
    assert (town.state.beads[bead].status, town.state.beads[bead].agent) == ("hooked", "gemini")


def test_the_agent_is_told_in_the_feed_and_in_bead_show() -> None:
    slung, _ = narrate.describe("bead.slung", {"bead_id": "b", "rig": "r", "agent": "codex"})
    assert slung == "bead b slung to rig r to run codex"
    held, _ = narrate.describe("bead.held", {"bead_id": "b", "rig": "r", "blockers": ["a"], "agent": "codex"})
    assert held == "bead b held for rig r to run codex: slung once a closed"
    town = mayor_town()
    bead = town.send(CREATE, {"title": "t"})["id"]
    town.send(SLING, {"id": bead, "rig": "demo", "agent": "codex"})
    record = town.state.beads[bead]
    shown = render.bead_detail(BeadDetail(**{f: getattr(record, f) for f in record.__struct_fields__}))
    assert "  agent:     codex" in shown.splitlines()
