"""The refinery's push to the target, told apart by why git refused it: a plain repository with the target
checked out (what most people have on a laptop), a hook that refuses, a target that keeps moving. Real git,
real nats-server; branches are pushed and submitted the way `gt done` does it."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from services.refinery.service import RefineryService
from services.refinery.settings import RefinerySettings
from services.refinery.state import MergeRequest
from shared.core.config import TownConfig
from shared.host import git
from shared.model.commands import ConvoyCreate
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually, gt_run
from tests.integration.test_refinery import STEPS, queue_paused
from tests.log_tools import events_of, read_all
from tests.witness_town import FAST, IDENTITY, TEST_COMMAND, PolecatTown, polecat_town

ENDED = ("merged", "failed", "escalated")
MAX_REQUEUES_SEEN = 6
"""More requeues than this of one merge request in one test is the loop this file guards against."""


@pytest.fixture
def refinery_settings() -> RefinerySettings:
    return RefinerySettings()


@pytest.fixture
async def pt(
    town: TownConfig, nc: Client, tmp_path: Path, refinery_settings: RefinerySettings
) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, refinery=refinery_settings) as handle:
        yield handle


def make_plain_repo(path: Path) -> Path:
    """An ordinary clone-like repository: a work tree, ``main`` checked out, one commit. Not bare."""
    path.mkdir(parents=True)
    git.git("init", "--quiet", "-b", "main", str(path))
    (path / "README.md").write_text("a project on a laptop\n")
    git.git("add", ".", cwd=path)
    git.git(*IDENTITY, "commit", "--quiet", "-m", "init", cwd=path)
    return path


def push_branch(repo: Path, branch: str, files: dict[str, str]) -> str:
    """Commit ``files`` on ``branch`` off main in a scratch clone and push it to ``repo``, as a polecat would."""
    clone = repo.parent / f"scratch-{uuid.uuid4().hex[:8]}"
    git.git("clone", "--quiet", "--branch", "main", str(repo), str(clone))
    try:
        git.git("checkout", "--quiet", "-b", branch, cwd=clone)
        for name, text in files.items():
            (clone / name).write_text(text)
        git.git("add", "-A", ".", cwd=clone)
        git.git(*IDENTITY, "commit", "--quiet", "-m", f"{branch}: {', '.join(files)}", cwd=clone)
        git.git("push", "--quiet", "origin", f"HEAD:refs/heads/{branch}", cwd=clone)
        return git.git("rev-parse", "HEAD", cwd=clone).strip()
    finally:
        git.force_remove(clone)


async def requeues(pt: PolecatTown, mr_id: str) -> list[dict[str, Any]]:
    return [data for kind, data in await events_of(pt.nc, f"gt.evt.mr.{mr_id}") if kind == "mr.requeued"]


async def ended(pt: PolecatTown, mr_id: str, timeout: float = 120) -> MergeRequest:
    """The merge request once it merged, failed or was escalated; fails at once when it loops instead."""

    async def done() -> MergeRequest:
        assert pt.refinery is not None
        mr = pt.refinery.projection.state.mrs.get(mr_id)
        seen = await requeues(pt, mr_id)
        if len(seen) > MAX_REQUEUES_SEEN:
            pytest.fail(f"merge request {mr_id} requeued {len(seen)} times (the loop): {seen[-1]['reason']!r}")
        assert mr is not None, "not applied yet"
        assert mr.status in ENDED, (mr.status, len(seen))
        return mr

    result: MergeRequest = await assert_eventually(done, timeout=timeout, interval=0.2)
    return result


async def escalations_about(pt: PolecatTown, bead: str) -> list[Any]:
    def found() -> list[Any]:
        assert pt.mayor is not None
        raised = [e for e in pt.mayor.projection.state.escalations.values() if e.bead == bead]
        assert raised, "no escalation about the bead"
        return raised

    result: list[Any] = await assert_eventually(found, timeout=30)
    return result


async def submit_change(pt: PolecatTown, rig: str, repo: Path, name: str) -> tuple[str, str]:
    """A bead of ``rig`` with a pushed branch adding ``name``, submitted; (bead, merge request id)."""
    bead = await pt.new_bead(f"Add {name}", prefix=rig)
    branch = f"polecat/p1/{bead}"
    head = push_branch(repo, branch, {name: f"{name} from a polecat\n"})
    return bead, await pt.submit(bead, branch, head, rig=rig)


async def test_a_plain_repository_with_main_checked_out_gets_the_merge_in_its_clean_checkout(
    pt: PolecatTown, tmp_path: Path, gt_env: dict[str, str]
) -> None:
    calc = make_plain_repo(tmp_path / "src" / "calc")
    # Added the way a user does it, from inside the checkout.
    added = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gt.cli.main", "rig", "add", "calc", ".", "--test", TEST_COMMAND],
        cwd=calc,
        env={**gt_env, "NATS_URL": pt.config.nats_url},
        capture_output=True,
        text=True,
        check=False,
    )
    assert added.returncode == 0, (added.stdout, added.stderr)
    assert f"rig calc: {calc} (main)" in added.stdout
    assert "is a checkout (not bare)" in added.stdout, added.stdout
    # A polecat (the reference agent) works a bead, pushes its branch into the checkout and submits it.
    bead = await pt.new_bead("Add a feature", prefix="calc")
    await pt.sling(bead, rig="calc")
    submitted = await pt.wait_merge_requested(bead)

    mr = await ended(pt, submitted["id"])
    assert mr.status == "merged", (mr.status, mr.gate, mr.tail)
    assert await requeues(pt, mr.id) == []
    # The checkout follows: main moved, and its work tree and index show the merged commit, nothing dirty.
    assert git.git("rev-parse", "HEAD", cwd=calc).strip() == mr.merged_commit
    assert git.git("rev-parse", "--abbrev-ref", "HEAD", cwd=calc).strip() == "main"
    work = sorted(p.name for p in (calc / ".gastown-work" / bead).iterdir())
    assert work == [f"{i:02d}-{step}.txt" for i, step in enumerate(STEPS, 1)]
    assert git.git("status", "--porcelain", cwd=calc).strip() == ""


async def gt(pt: PolecatTown, gt_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real `gt` CLI against the test's town."""
    return await asyncio.to_thread(gt_run, {**gt_env, "NATS_URL": pt.config.nats_url}, *args)


async def test_a_dirty_checkout_pauses_the_rigs_queue_once_and_one_command_merges_all_ten(
    pt: PolecatTown, tmp_path: Path, gt_env: dict[str, str], refinery_settings: RefinerySettings
) -> None:
    """The trial's case: a plain checkout with main checked out and an uncommitted edit, ten merge requests
    queued. The first push is refused for the checkout's sake, not the change's: the rig's queue pauses with one
    escalation, no other gate runs, every view says so; once the edit is put away, `gt mq resume` lands all ten,
    each once, and the escalation closes by itself."""
    calc = make_plain_repo(tmp_path / "src" / "calc")
    runs = tmp_path / "gate-runs"
    await pt.ok("gt.cmd.rig.add", name="calc", repo=str(calc), test_command=f"echo run >> {runs}; {TEST_COMMAND}")
    (calc / "README.md").write_text("someone is editing this on main\n")
    changes = [await submit_change(pt, "calc", calc, f"feature-{n}.txt") for n in range(10)]
    beads, ids = [bead for bead, _ in changes], [mr_id for _, mr_id in changes]
    convoy = (await pt.send(ConvoyCreate(title="Ten features", beads=beads)))["id"]
    assert pt.refinery is not None
    refinery = pt.refinery

    queue = await queue_paused(refinery, "calc", ids)
    assert queue.cause == "push_refused"
    assert "Working directory has unstaged changes" in queue.detail

    def one_escalation() -> list[Any]:
        assert pt.mayor is not None
        raised = [e for e in pt.mayor.projection.state.escalations.values() if e.source == "refinery/calc"]
        assert raised, "no escalation yet"
        return raised

    [raised] = await assert_eventually(one_escalation, timeout=30)
    assert "paused" in raised.message
    assert "gt mq resume calc" in raised.message
    assert "checked out" in raised.message
    # Every view says the queue is paused and why (each CLI call also lets patrols pass while it is paused).
    listed = await gt(pt, gt_env, "mq", "list", "--rig", "calc")
    assert listed.returncode == 0, listed.stderr
    assert "merge queue of rig calc PAUSED" in listed.stdout
    assert "`gt mq resume calc`" in listed.stdout
    status = await gt(pt, gt_env, "status", "--color", "never")
    assert "paused: main is the branch checked out" in status.stdout, status.stdout
    shown = await gt(pt, gt_env, "convoy", "status", convoy)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("merge queue of calc paused (`gt mq resume calc`)") == 10, shown.stdout
    # Nothing else was gated, nothing failed or was escalated one by one: all ten wait in the queue.
    assert runs.read_text().splitlines() == ["run"], "gates ran while the queue was paused"
    assert [refinery.projection.state.mrs[i].status for i in ids] == ["queued"] * 10
    assert len(one_escalation()) == 1
    # The pause is in the log: a restarted refinery keeps it, gates nothing, and escalates it no second time.
    await pt.stop("refinery")
    pt.refinery = refinery = RefineryService(pt.config, FAST, refinery=refinery_settings)
    await pt.start("refinery", refinery)
    assert refinery.projection.state.queues["calc"].paused
    again_listed = await gt(pt, gt_env, "mq", "list", "--rig", "calc")
    assert "merge queue of rig calc PAUSED" in again_listed.stdout
    assert runs.read_text().splitlines() == ["run"], "the restarted refinery gated a paused rig's merge request"
    assert len(one_escalation()) == 1, "the pause was escalated again after the restart"
    assert (calc / "README.md").read_text() == "someone is editing this on main\n", "the user's edit is untouched"

    git.git("checkout", "--", "README.md", cwd=calc)  # the user puts the edit away, as the escalation says
    resumed = await gt(pt, gt_env, "mq", "resume", "calc")
    assert resumed.returncode == 0, resumed.stderr
    assert "merge queue of rig calc: resumed" in resumed.stdout

    def all_merged() -> bool:
        mrs = refinery.projection.state.mrs
        assert all(mrs[i].status == "merged" for i in ids), [(mrs[i].status, mrs[i].reason[:200]) for i in ids]
        return True

    await assert_eventually(all_merged, timeout=180, interval=0.2)
    for mr_id in ids:
        merges = [kind for kind, _ in await events_of(pt.nc, f"gt.evt.mr.{mr_id}") if kind == "mr.merged"]
        assert merges == ["mr.merged"], f"{mr_id} merged {len(merges)} times"
    tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=calc).split()
    assert sorted(n for n in tree if n.startswith("feature-")) == [f"feature-{n}.txt" for n in range(10)]
    assert len(runs.read_text().splitlines()) == 11, "each merge request was gated once after the resume"

    def closed() -> Any:
        assert pt.mayor is not None
        escalation = pt.mayor.projection.state.escalations[raised.id]
        assert escalation.status == "closed", "still open"
        return escalation

    await assert_eventually(closed, timeout=60)
    assert len(one_escalation()) == 1, "one escalation for the pause, none per merge request"
    again = await gt(pt, gt_env, "mq", "resume", "calc")
    assert "not paused" in again.stdout, again.stdout


async def test_a_push_the_target_refuses_fails_the_merge_with_gits_message_and_escalates_without_requeues(
    pt: PolecatTown,
) -> None:
    # The repository refuses by its own settings (config, which its receive-pack honours); a pre-receive hook it
    # has does not run in the refinery's push into a repository on this machine (an agent could have planted it).
    await pt.add_rig()
    before = git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
    bead = await pt.new_bead("Refused by the target", prefix="demo")
    head = pt.push_branch("polecat/p1/frozen", {"frozen.txt": "not landing\n"})
    # From now on (the branch above came in by a plain push).
    git.git("config", "receive.maxInputSize", "1", cwd=pt.origin)
    hook = pt.origin / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'policy: main is frozen for the release' >&2\nexit 1\n")
    hook.chmod(0o755)
    mr_id = await pt.submit(bead, "polecat/p1/frozen", head)

    mr = await ended(pt, mr_id)
    assert mr.status == "escalated", (mr.status, mr.tail)
    assert (mr.gate, mr.exit_code) == ("push", 1)
    assert "pack exceeds maximum allowed size" in mr.tail
    assert "pre-receive hook declined" not in mr.tail, "the hook did not run"
    assert await requeues(pt, mr_id) == []
    raised = await escalations_about(pt, bead)
    assert mr_id in raised[0].message
    assert "pack exceeds maximum allowed size" in raised[0].message
    assert git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip() == before


@pytest.mark.parametrize(
    "refinery_settings", [RefinerySettings(push_retries=2, push_backoff_s=0.5, push_backoff_max_s=1.0)]
)
async def test_a_target_that_moves_at_every_attempt_is_retried_with_backoff_then_escalated(
    pt: PolecatTown, tmp_path: Path
) -> None:
    # Someone pushes to main during every gate run: each fast-forward is refused as non-fast-forward.
    mover = tmp_path / "mover"
    git.git("clone", "--quiet", str(pt.origin), str(mover))
    gate = (
        f"cd {mover} && date +%s%N > moved-$$.txt && git add -A && "
        f"git {shlex.join(IDENTITY)} commit -qm moved && git push -q origin HEAD:main"
    )
    await pt.add_rig(test_command=f"({gate}) >/dev/null 2>&1; true")
    bead = await pt.new_bead("Never lands", prefix="demo")
    head = pt.push_branch("polecat/p1/busy", {"busy.txt": "mine\n"})
    mr_id = await pt.submit(bead, "polecat/p1/busy", head)

    mr = await ended(pt, mr_id)
    assert mr.status == "escalated", (mr.status, mr.tail)
    assert mr.gate == "push"
    assert "non-fast-forward" in mr.tail or "fetch first" in mr.tail
    seen = await requeues(pt, mr_id)
    assert [r["retries"] for r in seen] == [1, 2], "two retries, then the cap"
    assert all(r["reason"] == "the target moved during the merge" for r in seen)
    # Each requeue asks for a wait (its exact length is the plan's, tested in tests/unit/test_push_refusals.py),
    # and the next claim comes no earlier than that.
    stored = [decode_envelope(data) for _, _, data in await read_all(pt.nc, "GT_EVT", f"gt.evt.mr.{mr_id}")]
    waits = [
        (datetime.fromisoformat(r["not_before"]) - env.ts).total_seconds()
        for env, r in ((e, msgspec.json.decode(e.data)) for e in stored if e.type == "mr.requeued")
    ]
    assert len(waits) == 2
    assert 0 < waits[0] <= 0.5
    assert 0 < waits[1] <= 1.0
    claims = [e.ts for e in stored if e.type == "mr.claimed"]
    assert len(claims) == 3
    for claim, requeued in zip(claims[1:], seen, strict=True):
        assert claim >= datetime.fromisoformat(requeued["not_before"])
    raised = await escalations_about(pt, bead)
    assert "moved" in raised[0].message


def vanishing_gate(pt: PolecatTown, tmp_path: Path) -> tuple[str, Path]:
    """A test gate that moves the rig's repository away the first time it runs (the repository becomes
    unreachable between the fetch and the push); (the gate, where the repository went)."""
    away = pt.origin.with_name("origin.away")
    flag = tmp_path / "vanished-once"
    return f"if [ ! -e {flag} ]; then touch {flag} && mv {pt.origin} {away}; fi; true", away


@pytest.mark.parametrize("refinery_settings", [RefinerySettings(push_backoff_s=3.0)])
async def test_an_unreachable_repository_is_retried_after_a_backoff_and_the_merge_lands_when_it_is_back(
    pt: PolecatTown, tmp_path: Path
) -> None:
    gate, away = vanishing_gate(pt, tmp_path)
    await pt.add_rig(test_command=gate)
    bead = await pt.new_bead("Land once it is back", prefix="demo")
    head = pt.push_branch("polecat/p1/back", {"back.txt": "mine\n"})
    mr_id = await pt.submit(bead, "polecat/p1/back", head)

    async def requeued() -> dict[str, Any]:
        seen = await requeues(pt, mr_id)
        assert seen, "not requeued yet"
        return seen[0]

    first: dict[str, Any] = await assert_eventually(requeued, timeout=120, interval=0.1)
    away.rename(pt.origin)
    assert first["reason"].startswith("the repository could not be reached"), first["reason"]
    assert "does not appear to be a git repository" in first["reason"]
    assert first["retries"] == 1
    mr = await ended(pt, mr_id)
    assert mr.status == "merged", (mr.status, mr.gate, mr.tail)
    assert len(await requeues(pt, mr_id)) <= 3, "once, or again if the repository came back late"
    assert "back.txt" in git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()


@pytest.mark.parametrize("refinery_settings", [RefinerySettings(push_retries=1, push_backoff_s=0.2)])
async def test_a_repository_that_stays_unreachable_is_escalated_after_the_retries_not_looped(
    pt: PolecatTown, tmp_path: Path
) -> None:
    gate, _ = vanishing_gate(pt, tmp_path)
    await pt.add_rig(test_command=gate)
    bead = await pt.new_bead("Its repository is gone", prefix="demo")
    head = pt.push_branch("polecat/p1/gone", {"gone.txt": "mine\n"})
    mr_id = await pt.submit(bead, "polecat/p1/gone", head)

    # The push finds it gone (retried once); the next attempt's fetch fails too: the cap is reached.
    mr = await ended(pt, mr_id)
    assert mr.status == "escalated", (mr.status, mr.tail)
    assert "does not appear to be a git repository" in mr.tail
    assert [r["retries"] for r in await requeues(pt, mr_id)] == [1]
    raised = await escalations_about(pt, bead)
    assert "given up after 2 attempts in a row" in raised[0].message


def test_gt_rig_add_refuses_an_empty_repository_argument(gt_env: dict[str, str], tmp_path: Path) -> None:
    # Run from a directory that is a git repository: an empty argument must not mean "here".
    here = make_plain_repo(tmp_path / "cwd")
    env = {**gt_env, "NATS_URL": "nats://127.0.0.1:1"}  # never reached: refused before connecting
    for repo in ("", "   "):
        done = subprocess.run(
            [sys.executable, "-m", "gt.cli.main", "rig", "add", "x", repo],
            cwd=here,
            env={**env, "PWD": str(here)},
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode == 2, (repo, done.returncode, done.stdout, done.stderr)
        assert "repository argument is empty" in done.stderr, done.stderr


async def test_gt_mq_retry_rig_puts_every_escalated_merge_request_of_the_rig_back_in_one_command(
    pt: PolecatTown, gt_env: dict[str, str]
) -> None:
    await pt.add_rig()
    ids = []
    heads = []
    for n in (1, 2):
        bead = await pt.new_bead(f"Refused {n}", prefix="demo")
        heads.append((bead, f"polecat/p{n}/{bead}", pt.push_branch(f"polecat/p{n}/{bead}", {f"r{n}.txt": "x\n"})))
    git.git("config", "receive.maxInputSize", "1", cwd=pt.origin)  # every push refused, a reason git names
    for bead, branch, head in heads:
        ids.append(await pt.submit(bead, branch, head))
    for mr_id in ids:
        assert (await ended(pt, mr_id)).status == "escalated"

    assert (await gt(pt, gt_env, "mq", "retry")).returncode == 2, "neither an id nor --rig/--all"
    both = await gt(pt, gt_env, "mq", "retry", ids[0], "--rig", "demo")
    assert both.returncode == 2
    assert both.stderr.count("\n") == 1, both.stderr
    git.git("config", "--unset", "receive.maxInputSize", cwd=pt.origin)
    retried = await gt(pt, gt_env, "mq", "retry", "--rig", "demo")
    assert retried.returncode == 0, retried.stderr
    assert sorted(retried.stdout.splitlines()) == sorted(f"{mr_id}: queued" for mr_id in ids)
    assert pt.refinery is not None
    refinery = pt.refinery

    def merged() -> bool:
        assert [refinery.projection.state.mrs[i].status for i in ids] == ["merged", "merged"]
        return True

    await assert_eventually(merged, timeout=120, interval=0.1)
    none_left = await gt(pt, gt_env, "mq", "retry", "--all")
    assert none_left.stdout.strip() == "no escalated merge request: nothing to retry"
