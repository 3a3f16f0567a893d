"""Crew workspaces' pure parts (issue 43, docs/crew.md): the witness's decisions and fold, what its plan owes a crew
member and a bead hooked to it, and a crew member's bundle taken by the refinery as a hand-submitted merge request."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gt.cli.crew import foreign_repository
from services.witness import decide as witness_decide
from services.witness.plan.actions import Clean, MakeCrewWorkspace, RemoveCrewWorkspace, Spawn
from services.witness.projection import new_projection
from services.witness.state import WitnessState
from shared.core.errors import CommandError
from shared.model import commands as cmds
from shared.model import done_flow
from shared.model.crew import crew_of_branch, crew_publisher, parse_crew_env
from shared.model.events import BeadClosed, BeadCreated, CrewReady, CrewWorkspaceRemoved, SessionEnded
from tests.memory_log import T0, Deciding
from tests.unit.test_refinery_plan import Queue
from tests.unit.test_witness_plan import World, only

WORKSPACE = "/town/rigs/demo/crew/ann"


class Town(World, Deciding):
    """The witness's projection, planned for (``World``) and deciding commands (``Deciding``) against one log."""

    def __init__(self) -> None:
        Deciding.__init__(self, new_projection(), witness_decide.decide, clock=T0)


def witness() -> Deciding:
    fed = Deciding(new_projection(), witness_decide.decide, clock=T0)
    fed.send("gt.cmd.rig.add", name="demo", repo="/repos/demo.git", facts=witness_decide.RepoFacts(None))
    return fed


def state_of(fed: Deciding) -> WitnessState:
    return fed.projection.state  # type: ignore[no-any-return]


def add(fed: Deciding, name: str = "ann") -> dict[str, object]:
    return fed.send("gt.cmd.crew.add", witness_decide.CrewFacts(f"/town/rigs/demo/crew/{name}"), rig="demo", name=name)


@pytest.mark.parametrize("name", ["Ann", "a", "ann-b", "crew/x", "1ab", "x" * 17, "ann b"])
def test_a_crew_name_is_a_short_lowercase_word(name: str) -> None:
    with pytest.raises(CommandError) as caught:
        cmds.CrewAdd(rig="demo", name=name).validate()
    assert caught.value.code == "invalid"


def test_a_member_is_added_once_in_a_rig_in_service_and_never_under_a_polecats_name() -> None:
    fed = witness()
    first = add(fed)
    assert (first["id"], first["status"], first["branch"], first["workspace"]) == (
        "demo-ann",
        "added",
        "crew/ann",
        WORKSPACE,
    )
    assert add(fed)["changed"] is False
    crew = state_of(fed).crews["demo-ann"]
    assert (crew.ready, crew.hooked, crew.status) == (False, None, "added")
    for pooled in ("ace", "bob", "p26", "p100"):
        assert "polecat's name" in str(fed.reject("gt.cmd.crew.add", rig="demo", name=pooled, facts=None))
    assert fed.reject("gt.cmd.crew.add", rig="nope", name="ann").code == "not_found"
    fed.send("gt.cmd.rig.remove", name="demo")
    assert fed.reject("gt.cmd.crew.add", rig="demo", name="zoe").code == "not_found"


def test_a_bead_is_hooked_to_one_member_one_at_a_time_and_only_before_polecats_work_it() -> None:
    fed = witness()
    add(fed)
    add(fed, "zoe")
    fed.add(BeadCreated(bead_id="demo-1", title="one"), BeadCreated(bead_id="demo-2", title="two"))
    assert fed.send("gt.cmd.crew.hook", rig="demo", name="ann", bead="demo-1")["hooked"] == "demo-1"
    assert fed.send("gt.cmd.crew.hook", rig="demo", name="ann", bead="demo-1")["changed"] is False
    assert fed.reject("gt.cmd.crew.hook", rig="demo", name="ann", bead="demo-2").code == "conflict"  # one at a time
    assert fed.reject("gt.cmd.crew.hook", rig="demo", name="zoe", bead="demo-1").code == "conflict"  # one member
    assert fed.reject("gt.cmd.crew.hook", rig="demo", name="zoe", bead="demo-9").code == "not_found"
    assert fed.reject("gt.cmd.crew.hook", rig="demo", name="max", bead="demo-2").code == "not_found"
    fed.add(BeadClosed(bead_id="demo-1", reason="done"))
    assert fed.send("gt.cmd.crew.hook", rig="demo", name="ann", bead="demo-2")["hooked"] == "demo-2"
    assert fed.reject("gt.cmd.crew.hook", rig="demo", name="zoe", bead="demo-1").code == "backward_transition"


def test_removal_is_refused_while_work_is_hooked_open_or_unsaved_and_the_workspace_goes_after_it() -> None:
    w = fed = Town()
    w.rig()
    add(fed)
    assert only(w.plan(), MakeCrewWorkspace) == MakeCrewWorkspace(crew="demo-ann", rig="demo")
    fed.add(CrewReady(rig="demo", name="ann"))
    assert not [a for a in w.plan() if isinstance(a, MakeCrewWorkspace)]
    fed.add(BeadCreated(bead_id="demo-1", title="one"))
    fed.send("gt.cmd.crew.hook", rig="demo", name="ann", bead="demo-1")
    clean = witness_decide.CrewFacts(WORKSPACE)
    assert "hooked" in str(fed.reject("gt.cmd.crew.remove", clean, rig="demo", name="ann"))
    w.bead("demo-1")
    session = w.running("demo-1")
    fed.add(BeadClosed(bead_id="demo-1", reason="merged"))
    assert "works in" in str(fed.reject("gt.cmd.crew.remove", clean, rig="demo", name="ann"))
    w.add(SessionEnded(session_id=session, reason="done"))
    unsaved = witness_decide.CrewFacts(WORKSPACE, "uncommitted changes")
    refused = fed.reject("gt.cmd.crew.remove", unsaved, rig="demo", name="ann")
    assert (refused.code, "uncommitted changes" in str(refused)) == ("conflict", True)
    assert fed.send("gt.cmd.crew.remove", clean, rig="demo", name="ann")["status"] == "removed"
    assert fed.send("gt.cmd.crew.remove", clean, rig="demo", name="ann")["changed"] is False
    assert only(w.plan(), RemoveCrewWorkspace) == RemoveCrewWorkspace(crew="demo-ann", rig="demo")
    # Work found in it when it was to go: kept, and not tried again until it is added again (and used as it is).
    fed.add(CrewWorkspaceRemoved(rig="demo", name="ann", removed=False, detail="kept: uncommitted changes"))
    assert not [a for a in w.plan() if isinstance(a, RemoveCrewWorkspace)]
    again = add(fed)
    assert (again["status"], again["workspace"]) == ("added", WORKSPACE)
    # Looked at again before it is used (``ensure_worktree`` leaves a workspace on its branch as it is).
    assert only(w.plan(), MakeCrewWorkspace) == MakeCrewWorkspace(crew="demo-ann", rig="demo")
    fed.add(CrewReady(rig="demo", name="ann"))
    fed.send("gt.cmd.crew.remove", clean, rig="demo", name="ann")
    fed.add(CrewWorkspaceRemoved(rig="demo", name="ann", removed=True, detail="removed"))
    assert not [a for a in w.plan() if isinstance(a, RemoveCrewWorkspace | MakeCrewWorkspace)]
    # Gone: its name is free, and added again it is a member anew (its events go on on the same subject).
    anew = add(fed)
    crew = state_of(fed).crews["demo-ann"]
    assert (anew["changed"], crew.status, crew.ready, crew.hooked, crew.gone) == (True, "added", False, None, False)


def test_a_hooked_beads_sessions_run_as_the_member_in_its_workspace_which_outlives_them() -> None:
    w = fed = Town()
    w.rig(max_polecats=1)
    add(fed)
    fed.add(BeadCreated(bead_id="demo-1", title="one"))
    fed.send("gt.cmd.crew.hook", rig="demo", name="ann", bead="demo-1")
    w.bead("demo-1")
    assert not [a for a in w.plan() if isinstance(a, Spawn)], "not before its workspace is made"
    fed.add(CrewReady(rig="demo", name="ann"))
    w.bead("demo-2")  # a polecat's bead: the member takes no polecat place of the rig's
    spawns = [a for a in w.plan() if isinstance(a, Spawn)]
    assert sorted((s.bead, s.polecat) for s in spawns) == [("demo-1", "ann"), ("demo-2", "ace")]
    crew_spawn = next(s for s in spawns if s.bead == "demo-1")
    assert (crew_spawn.polecat, crew_spawn.worktree, crew_spawn.branch, crew_spawn.tmux_name) == (
        "ann",
        WORKSPACE,
        "crew/ann",
        "gt-demo-ann",
    )
    session = w.request(crew_spawn)
    w.start(session)
    w.end(session, "zombie", cleaned=False)
    planned = w.plan()
    assert Clean(session=session, remove_worktree=False, detail="kept: a crew member's workspace") in planned
    again = next(a for a in planned if isinstance(a, Spawn) and a.bead == "demo-1")
    assert (again.session, again.worktree, again.branch, again.resling) == ("demo-1-2", WORKSPACE, "crew/ann", True)
    w.add(BeadClosed(bead_id="demo-1", reason="merged"))
    w.end(session, "done", cleaned=False)
    assert all(not (isinstance(a, Clean) and a.remove_worktree) for a in w.plan())


def test_a_crew_members_bundle_names_it_and_its_merge_request_is_a_hand_submit() -> None:
    assert (crew_of_branch("crew/ann"), crew_of_branch("polecat/ace/x"), crew_of_branch("crew/Ann")) == (
        "ann",
        None,
        None,
    )
    assert parse_crew_env("demo/ann") == ("demo", "ann")
    assert parse_crew_env("demo") is None
    assert done_flow.publisher(None, "crew/ann") == crew_publisher("ann") == "crew-ann"
    assert done_flow.publisher("demo-1-2", "crew/ann") == "demo-1-2"
    assert done_flow.publisher(None, "feature/x") == ""
    q = Queue()
    q.rig()
    q.add(BeadCreated(bead_id="de-a", title="crew/ann: Add ann1"))
    bundle = f"/town/rigs/demo/published/crew-ann/{'a' * 40}.bundle"
    body = {"bead": "de-a", "rig": "demo", "branch": "crew/ann", "head": "a" * 40, "bundle": bundle}
    accepted = q.send("gt.cmd.mr.submit", body)
    assert accepted["status"] == "queued"
    assert q.state.mrs[str(accepted["id"])].bundle == bundle
    other = {**body, "branch": "feature/x", "head": "b" * 40}
    assert q.reject_code("gt.cmd.mr.submit", other) == "invalid"


def test_a_person_is_not_put_to_work_in_a_repository_an_agent_owns(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    mine = os.geteuid()
    assert foreign_repository(tmp_path, mine) is None
    refusal = foreign_repository(tmp_path, mine + 1)
    assert refusal is not None
    assert f"belongs to user {mine}" in refusal
    assert "git config and hooks would run as you" in refusal
    assert foreign_repository(tmp_path / "nothing", mine + 1) is None
