"""Issue 20, point 2: only the session holding a bead's hook lease submits the bead's work, for its own branch,
into the rig's base branch; a branch submitted by hand is never a protected one; no name reaches git as an
option. Real nats-server, git and tmux (the agent NATS user's attack is in test_permissions.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from shared.core.ids import hook_lease_name
from shared.host import git
from tests.helpers import assert_eventually
from tests.integration.test_witness import started_session
from tests.log_tools import events_of
from tests.witness_town import PolecatTown

HEAD = "ab" * 20


def ref(origin: Path, branch: str) -> str:
    return git.git("rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", cwd=origin, check=False).strip()


async def submitted_mrs(nc: Client) -> list[dict[str, Any]]:
    return [data for kind, data in await events_of(nc, "gt.evt.mr.>") if kind == "mr.submitted"]


async def test_a_hand_submitted_merge_request_never_takes_a_protected_branch(pt: PolecatTown) -> None:
    await pt.add_rig()
    bead = await pt.new_bead("Merge a release branch by hand", prefix="demo")
    release = pt.push_branch("release", {"RELEASE.txt": "kept\n"})
    for branch, said in (("release", "protected"), ("main", "is the target"), ("release/1.0", "protected")):
        outcome = await pt.command("gt.cmd.mr.submit", bead=bead, rig="demo", branch=branch, head=release)
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "invalid"), outcome
        assert said in outcome["message"]
    assert await submitted_mrs(pt.nc) == []
    assert ref(pt.origin, "release") == release


@pytest.mark.parametrize(
    ("field", "name"),
    [
        ("branch", "--upload-pack=touch /tmp/gastown-pwned"),
        ("branch", "-x"),
        ("target", "--delete"),
        ("branch", "a/../../b"),
    ],
)
async def test_a_name_git_would_take_for_an_option_is_refused(pt: PolecatTown, field: str, name: str) -> None:
    await pt.add_rig()
    bead = await pt.new_bead("Inject an option", prefix="demo")
    body = {"bead": bead, "rig": "demo", "branch": "polecat/ace/x", "head": HEAD, field: name}
    outcome = await pt.command("gt.cmd.mr.submit", **body)
    assert (outcome["type"], outcome["code"]) == ("cmd.rejected", "invalid"), outcome
    assert f"`{field}`" in outcome["message"]
    rig = await pt.command("gt.cmd.rig.add", name="evil", repo=str(pt.origin), base_branch="-x")
    assert (rig["type"], rig["code"]) == ("cmd.rejected", "invalid"), rig
    assert await submitted_mrs(pt.nc) == []


async def test_only_the_hook_holder_submits_its_own_branch_into_the_base_branch(pt: PolecatTown) -> None:
    await pt.add_rig(agent_command="sleep 600")
    bead = await pt.new_bead("Worked by one session", prefix="demo")
    await pt.sling(bead)
    session_id, _, _ = await started_session(pt, bead, 1)
    session = pt.sessions_of(bead)[0]
    assert session.lease_token is not None
    head = pt.push_branch(session.branch, {"WORK.txt": "done\n"})
    fence = {"lease": hook_lease_name(bead), "token": session.lease_token}
    mine = {"bead": bead, "rig": "demo", "branch": session.branch, "head": head, "session": session_id, "fence": fence}
    release = pt.push_branch("release", {"RELEASE.txt": "kept\n"})
    for change, code, said in (
        ({"fence": None}, "unauthorized", "hook lease as its `fence`"),
        ({"session": "demo-other-1"}, "unauthorized", f"held by {session_id}"),
        ({"fence": {**fence, "token": session.lease_token + 1}}, "conflict", "fenced"),
        ({"branch": "release", "head": release}, "unauthorized", f"its own branch {session.branch}"),
        ({"target": "release"}, "unauthorized", "base branch main"),
        # A plain subject is an operator's: naming a polecat there is refused before the refinery decides.
        ({"session": None, "actor": f"polecat:demo/{session.polecat}"}, "unauthorized", "a polecat's name"),
    ):
        body = {k: v for k, v in {**mine, **change}.items() if v is not None}
        # Without a session only the operator's subject takes it (the agents' requires one): as a polecat, refused.
        outcome = await pt.command("gt.cmd.mr.done" if "session" in body else "gt.cmd.mr.submit", **body)
        assert (outcome["type"], outcome["code"]) == ("cmd.rejected", code), (change, outcome)
        assert said in outcome["message"], (change, outcome)
    # By hand, while a session works the bead: that session submits it, nobody else.
    by_hand = await pt.command("gt.cmd.mr.submit", bead=bead, rig="demo", branch=session.branch, head=head)
    assert (by_hand["type"], by_hand["code"]) == ("cmd.rejected", "conflict"), by_hand
    assert await submitted_mrs(pt.nc) == []

    # Its commits come from the bundle it published, never from what the refinery's clone happens to hold.
    unpublished = await pt.command("gt.cmd.mr.done", **mine)
    assert (unpublished["type"], unpublished["code"]) == ("cmd.rejected", "invalid"), unpublished
    assert "bundle" in unpublished["message"]
    # Only from where `gt done` publishes (the session's own folder, the head's name): a bundle anywhere else is
    # never opened by the refinery.
    elsewhere = pt.config.gt_home / "elsewhere" / f"{head}.bundle"
    elsewhere.parent.mkdir(parents=True)
    git.git("bundle", "create", "--quiet", str(elsewhere), f"refs/heads/{session.branch}", "^main", cwd=pt.origin)
    refused = await pt.command("gt.cmd.mr.done", **mine, bundle=str(elsewhere))
    assert (refused["type"], refused["code"]) == ("cmd.rejected", "invalid"), refused
    assert "the session's own" in refused["message"], refused
    bundle = pt.config.gt_home / "rigs" / "demo" / "published" / session_id / f"{head}.bundle"
    bundle.parent.mkdir(parents=True)
    git.git("bundle", "create", "--quiet", str(bundle), f"refs/heads/{session.branch}", "^main", cwd=pt.origin)
    accepted = await pt.ok("gt.cmd.mr.done", **mine, bundle=str(bundle))
    assert accepted["changed"] is True
    await assert_eventually(lambda: ref(pt.origin, session.branch) == "", timeout=120, message="merged, then deleted")
    assert "WORK.txt" in git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()
    assert ref(pt.origin, "release") == release, "only the polecat's own branch is deleted after its merge"
