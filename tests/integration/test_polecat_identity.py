"""Who a polecat session is, as the log, git and the agent itself see it: every command an agent sends carries
its polecat's actor (shown in full by `gt feed` and `gt bead history`), its commits carry its polecat's git
identity whatever its HOME holds, and `gt done` reports to its caller before the witness ends the session.

Real nats-server, mayor, witness and refinery, agents in real tmux, real git.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.refinery.settings import RefinerySettings
from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.host import git
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually
from tests.log_tools import read_all
from tests.witness_town import PolecatTown, polecat_town, run_gt


async def actors(pt: PolecatTown, aggregate: str, aggregate_id: str) -> list[tuple[str, str]]:
    """(type, actor) of every event of one aggregate, from the log."""
    found = []
    for _seq, _subject, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.{aggregate}.{aggregate_id}"):
        env = decode_envelope(data)
        found.append((env.type, env.actor))
    return found


async def test_an_agents_commands_carry_its_polecat_and_an_operators_stay_the_operators(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig(agent_command='gt mail send mayor --subject "starting" --body "on it" && gt-agent')
    operator_env = {**gt_env, "NATS_URL": pt.config.nats_url}
    created = await run_gt(operator_env, "bead", "create", "Sign your work", "--json")
    assert created.returncode == 0, created.stderr
    bead = json.loads(created.stdout)["data"]["result"]["id"]
    await pt.sling(bead)
    mr = await pt.wait_merge_requested(bead)
    [session] = await pt.wait_settled(bead)
    me = f"polecat:demo/{session.polecat}"

    on_bead = await actors(pt, "bead", bead)
    assert on_bead[0] == ("bead.created", "operator"), "an operator's command stays the operator's"
    # Claimed for the polecat by the witness as it started the pane (gt-agent's own claim then changes nothing).
    assert [actor for kind, actor in on_bead if kind == "bead.claimed"] == ["witness"]
    assert pt.mayor is not None
    assert pt.mayor.projection.state.beads[bead].assignee == f"demo/{session.polecat}"
    steps = [actor for kind, actor in await actors(pt, "mol", bead) if kind == "step.done"]
    assert steps == [me] * 6, "every `gt step done` of the agent is its polecat's"
    on_session = dict(await actors(pt, "session", session.id))
    assert on_session["session.done_intent"] == me
    assert on_session["session.ended"] == me, "`gt done` ends the session as its polecat"
    assert ("mr.submitted", me) in await actors(pt, "mr", mr["id"])
    inbox = await run_gt(operator_env, "mail", "inbox", "mayor", "--json")
    assert [m["metadata"]["from"] for m in json.loads(inbox.stdout)] == [me]

    # The operator's views show the actor in full, however long it is.
    feed = await run_gt(operator_env, "feed", "--since", "all", "--no-follow", "--actor", me)
    assert feed.returncode == 0, feed.stderr
    done_lines = [line for line in feed.stdout.splitlines() if ": step " in line and line.endswith(" done")]
    assert len(done_lines) == 6, feed.stdout
    assert all(f"  {me}  " in line for line in done_lines), feed.stdout
    story = await run_gt(operator_env, "bead", "history", bead)
    assert story.returncode == 0, story.stderr
    assert sum(f"  {me}  " in line for line in story.stdout.splitlines()) >= 8, story.stdout


async def test_gt_done_reports_to_its_caller_before_the_session_ends(pt: PolecatTown) -> None:
    # An agent that takes a moment to read what `gt done` said (as a real one does), then exits.
    marker, out = '"$GT_WORKTREE/../$GT_SESSION.rc"', '"$GT_WORKTREE/../$GT_SESSION.out"'
    await pt.add_rig(agent_command=f'gt done > {out} 2>&1; rc=$?; sleep 1; echo "rc=$rc" > {marker}')
    bead = await pt.new_bead("Tell me how it went")
    await pt.sling(bead)
    await pt.wait_merge_requested(bead)
    [session] = await pt.wait_settled(bead)
    assert session.end_reason == "done"
    said = Path(session.worktree).parent / f"{session.id}.rc"
    assert said.exists(), "the agent was killed before it could see `gt done`'s exit code"
    assert said.read_text().strip() == "rc=0"
    printed = said.with_suffix(".out").read_text()
    assert f"done: {session.branch} published at" in printed, printed
    await assert_eventually(lambda: pt.tmux.snapshot() == {}, message="the finished session's tmux is gone")


async def test_an_agent_that_stays_after_gt_done_sees_its_result_and_is_ended_after_a_grace(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    # Like an interactive agent: it reads `gt done`'s result and keeps running; the witness ends it afterwards.
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, done_exit_grace_s=10.0)
    async with polecat_town(town, nc, tmp_path, settings) as pt:
        marker = '"$GT_WORKTREE/../$GT_SESSION.rc"'
        await pt.add_rig(agent_command=f'gt done; rc=$?; sleep 1; echo "rc=$rc" > {marker}; exec sleep 600')
        bead = await pt.new_bead("Stay a while")
        await pt.sling(bead)
        await pt.wait_merge_requested(bead)
        [session] = await pt.wait_settled(bead)
        said = Path(session.worktree).parent / f"{session.id}.rc"
        assert said.exists(), "the agent was killed before it could see `gt done`'s exit code"
        assert said.read_text().strip() == "rc=0"
        await assert_eventually(lambda: pt.tmux.snapshot() == {}, message="the lingering agent was ended")


PLAIN_COMMIT = 'echo hello > "$GT_RIG.txt" && git add "$GT_RIG.txt" && git commit -q -m "a plain commit" && gt done'


async def test_a_session_commits_as_its_polecat_with_no_git_identity_anywhere(
    town: TownConfig, nc: Client, tmp_path: Path, gt_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A container or service user: an empty HOME, no system or global git configuration.
    home = tmp_path / "empty-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", "/dev/null")
    settings = WitnessSettings(
        min_orphan_age_s=60.0, kill_grace_s=1.0, agent_env=("GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_GLOBAL")
    )
    async with polecat_town(town, nc, tmp_path, settings) as pt:
        env = {**gt_env, "NATS_URL": pt.config.nats_url}
        for rig, options in (
            ("demo", []),
            ("other", ["--git-name", "Bot {polecat} of {rig}", "--git-email", "bots+{rig}.{polecat}@example.com"]),
        ):
            added = await run_gt(env, "rig", "add", rig, str(pt.origin), "--agent", PLAIN_COMMIT, *options)
            assert added.returncode == 0, added.stderr
        shown = json.loads((await run_gt(env, "rig", "show", "other", "--json")).stdout)
        assert (shown["git_name"], shown["git_email"]) == ("Bot {polecat} of {rig}", "bots+{rig}.{polecat}@example.com")
        identities = {}
        for rig in ("demo", "other"):
            bead = await pt.new_bead(f"Commit on {rig}")
            await pt.sling(bead, rig=rig)
            mr = await pt.wait_merge_requested(bead)
            [session] = await pt.wait_settled(bead)
            assert session.end_reason == "done"
            published = pt.config.gt_home / "rigs" / rig / "refinery" / "repo.git"  # imported from its bundle
            identities[rig] = git.git("log", "-1", "--format=%an <%ae>|%cn <%ce>", mr["head"], cwd=published).strip()
    assert identities["demo"] == "demo/ace <ace.demo@gastown.invalid>|demo/ace <ace.demo@gastown.invalid>"
    assert identities["other"] == (
        "Bot ace of other <bots+other.ace@example.com>|Bot ace of other <bots+other.ace@example.com>"
    )


async def test_rig_add_refuses_a_git_identity_template_git_cannot_use(pt: PolecatTown) -> None:
    for field, value, expected in (
        ("git_name", "Bot {name}", "{rig} and {polecat}"),
        ("git_email", "bot <x@example.com>", "< or >"),
        ("git_name", "two\nlines", "one line"),
    ):
        outcome = await pt.command("gt.cmd.rig.add", name="ghost", repo=str(pt.origin), **{field: value})
        assert outcome["type"] == "cmd.rejected", outcome
        assert outcome["code"] == "invalid", outcome
        assert field in outcome["message"], outcome["message"]
        assert expected in outcome["message"], outcome["message"]


async def test_a_branch_over_the_merge_queues_size_limit_is_refused_when_gt_done_submits_it(
    town: TownConfig, nc: Client, tmp_path: Path
) -> None:
    """G7 of the red team: a 300 MB file merged. A published branch that adds more than GT_MR_MAX_BYTES is refused
    ``too_large`` at its submission (`gt done` says so and exits non-zero); nothing is queued or merged."""
    refinery = RefinerySettings(max_bytes=100_000)
    async with polecat_town(town, nc, tmp_path, refinery=refinery) as pt:
        out, marker = '"$GT_WORKTREE/../$GT_SESSION.out"', '"$GT_WORKTREE/../$GT_SESSION.rc"'
        big = "head -c 400000 /dev/urandom > big.bin && git add big.bin && git commit -qm 'a big file'"
        await pt.add_rig(agent_command=f'{big} && gt done > {out} 2>&1; echo "rc=$?" > {marker}; exec sleep 600')
        before = git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
        bead = await pt.new_bead("Add a big file")
        await pt.sling(bead)

        def said() -> Path:
            sessions = pt.sessions_of(bead)
            assert sessions, "no session yet"
            path = Path(sessions[0].worktree).parent / f"{sessions[0].id}.rc"
            assert path.exists()
            return path

        rc = await assert_eventually(said, timeout=120)
        assert rc.read_text().strip() != "rc=0"
        printed = rc.with_suffix(".out").read_text()
        assert "too_large" in printed or "MB of new objects" in printed, printed
        assert "GT_MR_MAX_BYTES" in printed, printed
        assert pt.refinery is not None
        assert not [m for m in pt.refinery.projection.state.mrs.values() if m.bead == bead], "nothing was queued"
        assert git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip() == before
