"""A witness of some rigs: its identity, which commands it settles, and which actions it carries out. Pure."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.witness.plan import PaneSeen, Policy, scope
from services.witness.plan.actions import Action, KillOrphan, Spawn, Warrant
from services.witness.settings import load
from shared.model.commands import Command, parse_command
from shared.model.events import NudgeQueued
from tests.unit.test_witness_plan import POLICY, World, only

EAST = frozenset({"east"})
WEST = frozenset({"west"})


def command(subject: str, **body: Any) -> Command:
    return parse_command(subject, msgspec.json.encode(body))


def two_rigs() -> World:
    """Rigs east and west, a bead working on each."""
    w = World()
    w.rig("east")
    w.rig("west")
    w.bead("ea-1", "east")
    w.bead("we-1", "west")
    for spawn in [a for a in w.plan() if isinstance(a, Spawn)]:
        w.start(w.request(spawn))
    return w


def test_gt_witness_rigs_is_parsed_and_checked() -> None:
    assert scope.parse_rigs(None) is None
    assert scope.parse_rigs(" ") is None
    assert scope.parse_rigs("west, east,") == frozenset({"east", "west"})
    with pytest.raises(ValueError, match=r"GT_WITNESS_RIGS.*'Bad\.Rig'"):
        scope.parse_rigs("east,Bad.Rig")
    assert load({"GT_WITNESS_RIGS": "b,a"}).rigs == frozenset({"a", "b"})
    assert load({}).rigs is None


def test_each_scope_has_its_own_identity_and_distinct_scopes_never_share_one() -> None:
    assert scope.identity(None) == "witness"
    assert scope.identity(frozenset({"west", "east"})) == "witness-east_west"
    joined = scope.identity(frozenset({"a_b"}))
    split = scope.identity(frozenset({"a", "b"}))
    assert split == "witness-a_b"
    assert joined != split
    assert joined.startswith("witness-_")
    many = scope.identity(frozenset(f"rig-number-{i}" for i in range(10)))
    assert len(many) <= 64
    assert many.startswith("witness-_")
    # An identity is a subject token: ``gt.evt.service.<identity>``.
    for name in (split, joined, many):
        assert msgspec.json.decode(msgspec.json.encode(name)) == name
        assert "." not in name
        assert " " not in name


def test_a_witness_of_all_rigs_settles_every_command() -> None:
    w = two_rigs()
    assert scope.route(w.state, command("gt.cmd.session.finish", session="nobody"), None) == "mine"


def test_commands_go_to_the_scope_of_the_rig_they_concern() -> None:
    w = two_rigs()
    cases = [
        (command("gt.cmd.rig.add", name="east", repo="/r.git"), "mine", "elsewhere"),
        (command("gt.cmd.rig.add", name="north", repo="/r.git"), "elsewhere", "elsewhere"),
        (command("gt.cmd.session.finish", session="ea-1-1"), "mine", "elsewhere"),
        (command("gt.cmd.session.done_intent", session="we-1-1"), "elsewhere", "mine"),
        (command("gt.cmd.session.handoff", session="we-1-1"), "elsewhere", "mine"),
        (command("gt.cmd.nudge.send", target="ea-1-1", message="hi"), "mine", "elsewhere"),
        (command("gt.cmd.nudge.send", target="west/ace", message="hi"), "elsewhere", "mine"),
        (command("gt.cmd.session.recover_hook", bead="we-1", token=1), "elsewhere", "mine"),
    ]
    for cmd, east, west in cases:
        assert (scope.route(w.state, cmd, EAST), scope.route(w.state, cmd, WEST)) == (east, west), cmd


def test_commands_naming_nothing_known_are_unknown_to_every_scope() -> None:
    w = two_rigs()
    for cmd in (
        command("gt.cmd.session.finish", session="nobody-1"),
        command("gt.cmd.nudge.send", target="north/ace", message="hi"),
        command("gt.cmd.nudge.send", target="no such thing", message="hi"),
        command("gt.cmd.session.recover_hook", bead="hq-unknown", token=1),
    ):
        assert scope.route(w.state, cmd, EAST) == "unknown"
        assert scope.route(w.state, cmd, WEST) == "unknown"


def test_tmux_names_map_to_the_longest_rig_that_fits() -> None:
    rigs = ["demo", "demo-two", "east"]
    assert scope.rig_of_tmux_name("gt-demo-ace", rigs) == "demo"
    assert scope.rig_of_tmux_name("gt-demo-two-ace", rigs) == "demo-two"
    assert scope.rig_of_tmux_name("gt-north-ace", rigs) is None
    assert scope.rig_of_tmux_name("editor", rigs) is None


def scoped(rigs: frozenset[str] | None) -> Policy:
    return msgspec.structs.replace(POLICY, rigs=rigs)


def test_a_scoped_witness_plans_only_for_its_own_rigs() -> None:
    w = World()
    w.rig("east")
    w.rig("west")
    w.bead("ea-1", "east")
    w.bead("we-1", "west")
    everything = w.plan()
    assert sorted(a.bead for a in everything if isinstance(a, Spawn)) == ["ea-1", "we-1"]
    assert [a.bead for a in w.plan(policy=scoped(EAST)) if isinstance(a, Spawn)] == ["ea-1"]
    assert [a.bead for a in w.plan(policy=scoped(WEST)) if isinstance(a, Spawn)] == ["we-1"]
    assert w.plan(policy=scoped(frozenset({"north"}))) == []


def test_a_scoped_witness_judges_and_recovers_only_its_own_sessions() -> None:
    w = two_rigs()
    # Both tmux sessions are gone: each scope warrants its own session only.
    nothing = w.observe()
    east = only(w.plan(nothing, scoped(EAST)), Warrant)
    west = only(w.plan(nothing, scoped(WEST)), Warrant)
    assert (east.session, west.session) == ("ea-1-1", "we-1-1")
    assert {a.session for a in w.plan(nothing) if isinstance(a, Warrant)} == {"ea-1-1", "we-1-1"}


def test_nudges_and_orphans_belong_to_the_scope_of_their_rig() -> None:
    w = two_rigs()
    w.add(
        NudgeQueued(
            nudge_id="nd-1", rig="west", polecat="ace", session=None, message="hi", expires_at=w.clock
        )  # already expired: owed an ExpireNudge
    )
    now = int(w.clock.timestamp())
    orphans = [
        PaneSeen(name="gt-east-zed", pane_pid=7, dead=False, created=now - 999),
        PaneSeen(name="gt-west-zed", pane_pid=8, dead=False, created=now - 999),
        PaneSeen(name="gt-north-zed", pane_pid=9, dead=False, created=now - 999),
    ]
    live = [w.pane(s) for s in ("ea-1-1", "we-1-1")]
    obs = w.observe(*live, *orphans)

    def owed(rigs: frozenset[str] | None) -> list[str]:
        return sorted(_describe(a) for a in w.plan(obs, scoped(rigs)))

    assert owed(EAST) == ["kill-orphan gt-east-zed"]
    assert owed(WEST) == ["expire nd-1", "kill-orphan gt-west-zed"]
    # Only a witness of all rigs touches a tmux session of no known rig.
    assert owed(None) == [
        "expire nd-1",
        "kill-orphan gt-east-zed",
        "kill-orphan gt-north-zed",
        "kill-orphan gt-west-zed",
    ]


def _describe(action: Action) -> str:
    if isinstance(action, KillOrphan):
        return f"kill-orphan {action.tmux_name}"
    return f"expire {getattr(action, 'nudge', '?')}"
