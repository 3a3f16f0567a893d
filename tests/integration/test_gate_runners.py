"""Gate runners (``gt-runner``) and speculative gating: real nats-server, real git, real gates, runners as real
processes where they are killed.

- With R runners, the prefixes of a batch are gated at once, one job each, on different runners; the green ones
  land with one push, a red one's culprit is taken out and what stood behind it gated again.
- A runner killed with SIGKILL mid-gate: its job is taken by another runner once its heartbeats stop, run once
  more, answered once; main moves once.
- The refinery killed with SIGKILL while three speculative jobs run: the refinery started again adopts them (no job
  is asked again or run twice), and nothing is merged twice.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from services.refinery.settings import RefinerySettings
from services.runner.service import RunnerService
from services.runner.settings import RunnerSettings
from shared.core.config import TownConfig
from shared.host import git
from shared.model.commands import MergeRequestRetry
from tests.chaos.test_refinery_chaos import refinery_env, replayed
from tests.helpers import assert_eventually
from tests.log_tools import read_all
from tests.service_process import ServiceProcess
from tests.witness_town import FAST, PolecatTown, polecat_town

FAILS_ON_MARKERS = "! ls FAIL_* >/dev/null 2>&1"


async def gate_events(nc: Client) -> list[tuple[str, dict[str, Any]]]:
    """Every gate job event in the log, in order: (type, payload)."""
    out = []
    for _, _, data in await read_all(nc, "GT_EVT", "gt.evt.gate.>"):
        envelope = json.loads(data)
        out.append((envelope["type"], envelope["data"]))
    return out


def main_log(origin: Path) -> list[str]:
    return git.git("log", "--format=%s", "refs/heads/main", cwd=origin).splitlines()


async def queue_branches(pt: PolecatTown, count: int, failing: set[int]) -> list[str]:
    ids = []
    for n in range(1, count + 1):
        bead = await pt.new_bead(f"Change {n}", prefix="demo")
        files = {f"work-{n}.txt": f"change {n}\n", **({f"FAIL_{n}": "red\n"} if n in failing else {})}
        branch = f"polecat/p{n}/{bead}"
        ids.append(await pt.submit(bead, branch, pt.push_branch(branch, files)))
    return ids


@pytest.fixture
async def spec_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    settings = RefinerySettings(runners=4, batch=4, batch_wait_s=120, gate_timeout_s=60)
    async with polecat_town(town, nc, tmp_path, refinery=settings) as handle:
        for name in ("a", "b", "c", "d"):
            runner = RunnerService(
                town, FAST, runner=RunnerSettings(name=name, home=str(tmp_path / "runners" / name), heartbeat_s=0.5)
            )
            await handle.start(f"runner-{name}", runner)
        yield handle


async def test_runners_gate_every_prefix_at_once_and_land_the_green_ones_in_one_push(
    spec_town: PolecatTown, nc: Client
) -> None:
    pt = spec_town
    await pt.add_rig(test_command=FAILS_ON_MARKERS)
    ids = await queue_branches(pt, 4, failing={2})

    def settled() -> dict[str, Any]:
        assert pt.refinery is not None
        mrs = pt.refinery.projection.state.mrs
        statuses = {i: mrs[i].status for i in ids if i in mrs}
        assert len(statuses) == 4, statuses
        assert all(s in ("merged", "failed") for s in statuses.values()), statuses
        return statuses

    statuses = await assert_eventually(settled, timeout=120, interval=0.1)
    assert [statuses[i] for i in ids] == ["merged", "failed", "merged", "merged"]
    assert pt.refinery is not None
    mrs = pt.refinery.projection.state.mrs
    assert {mrs[i].merged_commit for i in (ids[0], ids[2], ids[3])} == {
        git.git("rev-parse", "refs/heads/main", cwd=pt.origin).strip()
    }, "the green ones landed with one push"

    events = await gate_events(nc)
    requested = [data for kind, data in events if kind == "gate.requested"]
    # Round one: the four prefixes at once; #2 red, #1 green: the test gate on the target (green); round two: #3
    # and #4 stacked again on #1, both prefixes at once.
    first_round = requested[:4]
    assert [len(r["stack"]) for r in first_round] == [1, 2, 3, 4]
    assert len(requested) == 4 + 1 + 2, [r.get("stack", []) for r in requested]
    assert "stack" not in requested[4], "the target's tip itself"
    assert [len(r["stack"]) for r in requested[5:]] == [1, 2]
    started = [data for kind, data in events if kind == "gate.started"]
    first_runners = {s["runner"] for s in started if s["job_id"] in {r["job_id"] for r in first_round}}
    assert len(first_runners) >= 2, "the first round's jobs ran on more than one runner"
    finished = [data for kind, data in events if kind == "gate.finished"]
    assert len({f["job_id"] for f in finished}) == len(finished), "one answer per job"
    refs = git.git("for-each-ref", "--format=%(refname)", "refs/gt/gate/", cwd=pt.origin).split()
    assert refs == [], "every job's ref is gone once its batch is done"


def runner_env(pt: PolecatTown, gt_env: dict[str, str], name: str) -> dict[str, str]:
    return {
        **gt_env,
        "NATS_URL": pt.config.nats_url,
        "GT_HOME": str(pt.config.gt_home),
        "GT_RUNNER_NAME": name,
        "GT_RUNNER_HEARTBEAT": "0.5",
        "GT_RUNNER_STALE": "3",
    }


@pytest.fixture
async def bare_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, with_refinery=False) as handle:
        yield handle


async def test_a_runner_killed_mid_gate_has_its_job_run_once_more_elsewhere_and_answered_once(
    bare_town: PolecatTown, nc: Client, gt_env: dict[str, str], tmp_path: Path
) -> None:
    pt = bare_town
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    gate = f'touch "{evidence}/ran-$$"; sleep 3'
    procs = [
        ServiceProcess("refinery", refinery_env(pt, gt_env, "", tmp_path / "x", GT_MQ_RUNNERS="2", GT_MQ_LEASE="900"),
                       tmp_path / "refinery.log"),
        *(ServiceProcess("runner", runner_env(pt, gt_env, n), tmp_path / f"runner-{n}.log") for n in ("a", "b")),
    ]  # fmt: skip
    runners = {f"runner-{n}": proc for n, proc in zip(("a", "b"), procs[1:], strict=True)}
    for proc in procs:
        proc.start()
    try:
        await pt.add_rig(test_command=gate)
        (mr_id,) = await queue_branches(pt, 1, failing=set())

        async def taken() -> dict[str, Any]:
            started = [d for k, d in await gate_events(nc) if k == "gate.started"]
            assert started, "no runner took the job yet"
            assert list(evidence.glob("ran-*")), "no gate runs yet"
            return started[0]

        first: dict[str, Any] = await assert_eventually(taken, timeout=120, interval=0.1)
        runners[first["runner"]].kill()

        async def merged() -> bool:
            state = await replayed(nc)
            assert state.mrs[mr_id].status == "merged", state.mrs[mr_id].status
            return True

        done: bool = await assert_eventually(merged, timeout=120, interval=0.2)
        assert done
        events = await gate_events(nc)
        assert len([k for k, _ in events if k == "gate.requested"]) == 1
        started = [d for k, d in events if k == "gate.started"]
        assert [s["attempt"] for s in started] == [1, 2], "taken again once, by the other runner"
        assert started[1]["runner"] != first["runner"]
        finished = [d for k, d in events if k == "gate.finished"]
        assert len(finished) == 1
        assert finished[0]["attempt"] == 2
        assert finished[0]["passed"]
        assert len(list(evidence.glob("ran-*"))) == 2, "the gate ran twice: once cut short, once to the end"
        assert main_log(pt.origin).count("Change 1") <= 1
        assert len([line for line in main_log(pt.origin) if "work-1" in line or "Change 1" in line]) <= 1
        tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()
        assert "work-1.txt" in tree
    finally:
        for proc in procs:
            proc.stop()


async def test_a_refinery_killed_while_three_speculative_jobs_run_adopts_them_and_merges_nothing_twice(
    bare_town: PolecatTown, nc: Client, gt_env: dict[str, str], tmp_path: Path
) -> None:
    pt = bare_town
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    release = tmp_path / "release"
    gate = f'touch "{evidence}/ran-$$"; while [ ! -e "{release}" ]; do sleep 0.1; done'
    env = refinery_env(
        pt, gt_env, "", tmp_path / "x", GT_MQ_RUNNERS="3", GT_MQ_BATCH_WAIT="60", GT_MQ_LEASE="2",
        GT_MQ_MERGE_LEASE_TTL="2",
    )  # fmt: skip
    refinery = ServiceProcess("refinery", env, tmp_path / "refinery.log")
    runners = [ServiceProcess("runner", runner_env(pt, gt_env, n), tmp_path / f"runner-{n}.log") for n in "abc"]
    for proc in (refinery, *runners):
        proc.start()
    try:
        await pt.add_rig(test_command=gate)
        ids = await queue_branches(pt, 3, failing=set())

        async def three_running() -> bool:
            started = [d for k, d in await gate_events(nc) if k == "gate.started"]
            assert len(started) == 3
            assert len(list(evidence.glob("ran-*"))) == 3
            return True

        running: bool = await assert_eventually(three_running, timeout=120, interval=0.1)
        assert running
        refinery.kill()
        refinery.start()
        await asyncio.sleep(3)  # the new refinery takes the rig over (its lease lapsed) and adopts the jobs
        release.touch()

        async def merged() -> bool:
            state = await replayed(nc)
            assert [state.mrs[i].status for i in ids] == ["merged"] * 3
            return True

        done: bool = await assert_eventually(merged, timeout=120, interval=0.2)
        assert done
        events = await gate_events(nc)
        assert len([k for k, _ in events if k == "gate.requested"]) == 3, "no job asked for again"
        assert [d["attempt"] for k, d in events if k == "gate.started"] == [1, 1, 1], "none run again"
        assert len(list(evidence.glob("ran-*"))) == 3
        assert refinery.logged("gate_job_adopted"), "the refinery started again adopted the jobs"
        state = await replayed(nc)
        assert len({state.mrs[i].merged_commit for i in ids}) == 1, "one push"
        tree = git.git("ls-tree", "--name-only", "refs/heads/main", cwd=pt.origin).split()
        assert {"work-1.txt", "work-2.txt", "work-3.txt"} <= set(tree)
        subjects = main_log(pt.origin)
        assert len(subjects) == len(set(subjects)), f"a commit landed twice: {subjects}"
        refs = git.git("for-each-ref", "--format=%(refname)", "refs/gt/gate/", cwd=pt.origin).split()
        assert refs == [], "the adopted jobs' refs are gone once their batch is done"
    finally:
        for proc in (refinery, *runners):
            proc.stop()
    assert os.path.exists(release)


@pytest.fixture
async def retry_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    settings = RefinerySettings(runners=2, batch=1, gate_timeout_s=60, retry_red=True)
    async with polecat_town(town, nc, tmp_path, refinery=settings) as handle:
        for name in ("a", "b"):
            home = str(tmp_path / "runners" / name)
            await handle.start(f"runner-{name}", RunnerService(town, FAST, runner=RunnerSettings(name=name, home=home)))
        yield handle


async def test_a_gate_that_fails_once_is_run_again_and_recorded_flaky_not_blamed(
    retry_town: PolecatTown, nc: Client, tmp_path: Path
) -> None:
    pt = retry_town
    seen = tmp_path / "seen"
    # Red the first time it runs anywhere, green ever after: a flaky test.
    await pt.add_rig(test_command=f'if [ -e "{seen}" ]; then exit 0; fi; touch "{seen}"; exit 1')
    ids = await queue_branches(pt, 2, failing=set())

    def merged() -> list[str]:
        assert pt.refinery is not None
        mrs = pt.refinery.projection.state.mrs
        statuses = [mrs[i].status if i in mrs else "unknown" for i in ids]
        assert statuses == ["merged", "merged"], statuses
        return statuses

    await assert_eventually(merged, timeout=120, interval=0.1)
    flaky = {}
    for _, _, data in await read_all(nc, "GT_EVT", "gt.evt.mr.>"):
        envelope = json.loads(data)
        if envelope["type"] == "mr.merged":
            flaky[envelope["data"]["mr_id"]] = envelope["data"].get("flaky", [])
    assert flaky == {ids[0]: ["test"], ids[1]: []}, "the first failed once, passed again: flaky, not blamed"
    requested = [d for k, d in await gate_events(nc) if k == "gate.requested"]
    assert [r["stack"] for r in requested] == [[ids[0]], [ids[0]], [ids[1]]], "the red one gated again, once"


async def test_a_merge_request_retried_after_its_gate_failed_is_gated_afresh_not_answered_from_before(
    retry_town: PolecatTown, nc: Client, tmp_path: Path
) -> None:
    pt = retry_town
    fixed = tmp_path / "fixed"
    # Red on the change until something outside it is fixed; green on the target all along.
    await pt.add_rig(test_command=f'! test -e work-1.txt || test -e "{fixed}"')
    (mr_id,) = await queue_branches(pt, 1, failing=set())

    def status() -> str:
        assert pt.refinery is not None
        mr = pt.refinery.projection.state.mrs.get(mr_id)
        assert mr is not None
        assert mr.status in ("failed", "merged"), mr.status
        return mr.status

    assert await assert_eventually(status, timeout=120, interval=0.1) == "failed"
    requested = [d for k, d in await gate_events(nc) if k == "gate.requested" and d.get("stack") == [mr_id]]
    assert len(requested) == 2, "red, then once more (GT_MQ_RETRY_RED): red again"
    fixed.touch()  # what failed it is fixed outside the change (a flaky service, a tool installed)
    await pt.send(MergeRequestRetry(id=mr_id))
    assert await assert_eventually(status, timeout=120, interval=0.1) == "merged"
    requested = [d for k, d in await gate_events(nc) if k == "gate.requested" and d.get("stack") == [mr_id]]
    assert len(requested) == 3, "the retry asked for a new job on the same commit, no answer of before taken"
    assert requested[0]["commit"] == requested[2]["commit"]


async def test_a_red_candidate_on_a_tip_this_refinery_landed_is_not_checked_on_the_target_again(
    retry_town: PolecatTown, nc: Client
) -> None:
    pt = retry_town
    await pt.add_rig(test_command=FAILS_ON_MARKERS)
    (green,) = await queue_branches(pt, 1, failing=set())

    def status_of(mr_id: str) -> str:
        assert pt.refinery is not None
        mr = pt.refinery.projection.state.mrs.get(mr_id)
        assert mr is not None
        assert mr.status in ("failed", "merged"), mr.status
        return mr.status

    assert await assert_eventually(lambda: status_of(green), timeout=120, interval=0.1) == "merged"
    bead = await pt.new_bead("Change red", prefix="demo")
    branch = f"polecat/red/{bead}"
    red = await pt.submit(bead, branch, pt.push_branch(branch, {"red.txt": "x\n", "FAIL_red": "red\n"}))
    assert await assert_eventually(lambda: status_of(red), timeout=120, interval=0.1) == "failed"
    requested = [d for k, d in await gate_events(nc) if k == "gate.requested"]
    on_target = [r for r in requested if not r.get("stack")]
    assert on_target == [], "the target's tip is the candidate landed before: its gates passed on it already"
    assert [r["stack"] for r in requested] == [[green], [red], [red]], "red, gated once more (GT_MQ_RETRY_RED)"
