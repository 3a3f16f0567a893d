"""The merge queue's board as an operator reads it (`gt mq runners`, the line under `gt mq list`, the dashboard's
section), in a town with a real nats-server, a real refinery gating on runners and two real runner services.

Three merge requests are batched and gated speculatively on three prefixes; the gate waits for a file the test
makes, so while two jobs run (one per runner) and the third waits for a runner, the views show the runners at work,
each job's stack of merge requests with their beads, and the waiting job. Once the file is there the batch lands
with one push, and the views show the three merges in the last hour and the batch's gate time shared by the three
(gate minutes per merge), each runner's jobs, and the runner that was stopped as stopped.

A screenshot of the dashboard's section is saved in test-artifacts/ (or $GT_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from playwright.async_api import Page

from gt.embedded_nats import free_port
from services.refinery.settings import RefinerySettings
from services.runner.service import RunnerService
from services.runner.settings import RunnerSettings
from shared.core.config import TownConfig
from tests.helpers import assert_eventually
from tests.integration.test_dashboard import ARTIFACTS, DashboardProcess, page, text_of, wait_for  # noqa: F401 (page: fixture)
from tests.integration.test_gate_runners import gate_events, queue_branches
from tests.integration.test_refinery_batch import mr_events
from tests.witness_town import FAST, PolecatTown, polecat_town, run_gt


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """The file the rig's gate waits for."""
    return tmp_path / "release"


@pytest.fixture
async def two_runner_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    """A refinery gating three candidates at once on runners, and two runners: one job always waits."""
    settings = RefinerySettings(runners=3, batch=3, batch_wait_s=120, gate_timeout_s=120)
    async with polecat_town(town, nc, tmp_path, refinery=settings) as handle:
        for name in ("a", "b"):
            runner = RunnerService(
                town, FAST, runner=RunnerSettings(name=name, home=str(tmp_path / "runners" / name), heartbeat_s=0.5)
            )
            await handle.start(f"runner-{name}", runner)
        yield handle


@pytest.fixture
def dashboard(two_runner_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path) -> Iterator[DashboardProcess]:
    pt = two_runner_town
    env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home)}
    process = DashboardProcess(env, free_port(), tmp_path / "dashboard.log")
    process.start()
    try:
        yield process
    finally:
        process.kill()


async def board(env: dict[str, str], *args: str) -> dict[str, Any]:
    """`gt mq runners --json`: the board as the refinery answered it."""
    shown = await run_gt(env, "mq", "runners", "--json", *args)
    assert shown.returncode == 0, shown.stderr
    answer: dict[str, Any] = json.loads(shown.stdout)
    return answer


async def test_the_board_shows_runners_at_work_their_stacks_the_waiting_job_then_the_merges_and_gate_minutes(
    two_runner_town: PolecatTown,
    nc: Client,
    gt_env: dict[str, str],
    release: Path,
    dashboard: DashboardProcess,
    page: Page,  # noqa: F811 (the fixture imported above)
) -> None:
    pt = two_runner_town
    env = {**gt_env, "NATS_URL": pt.config.nats_url}
    await pt.add_rig(test_command=f'while [ ! -e "{release}" ]; do sleep 0.1; done')
    ids = await queue_branches(pt, 3, failing=set())
    assert pt.refinery is not None
    beads = {mr: pt.refinery.projection.state.mrs[mr].bead for mr in ids}

    # While the gates wait: both runners run a job, each in its test gate; the third job waits for a runner.
    async def at_work() -> dict[str, Any]:
        shown = await board(env)
        runners = {r["name"]: r for r in shown["runners"]}
        assert set(runners) == {"runner-a", "runner-b"}, runners
        at_gate = [r["state"] == "up" and r["alive"] and r["job"] and r["gate"] == "test" for r in runners.values()]
        assert all(at_gate), runners
        assert len(shown["running"]) == 2, shown["running"]
        assert all(j["gate"] == "test" for j in shown["running"]), shown["running"]
        assert len(shown["waiting"]) == 1, shown["waiting"]
        return shown

    working: dict[str, Any] = await assert_eventually(at_work, timeout=120, interval=0.3)
    assert working["runners_used"] == 3
    jobs = working["running"] + working["waiting"]
    # The three prefixes of the batch, each carrying its merge requests in stack order, with their beads.
    assert sorted(len(j["stack"]) for j in jobs) == [1, 2, 3]
    for job in jobs:
        stacked = [mr["id"] for mr in job["stack"]]
        assert stacked == ids[: len(stacked)], job
        assert [mr["bead"] for mr in job["stack"]] == [beads[mr] for mr in stacked]
        assert job["rig"] == "demo"
    runners = {r["name"]: r for r in working["runners"]}
    assert {r["job"] for r in runners.values()} == {j["id"] for j in working["running"]}, "each runs one of them"
    for job in working["running"]:
        assert job["runner"] in runners
        assert runners[job["runner"]]["job"] == job["id"]
        assert job["attempt"] == 1
        assert job["running_s"] is not None
    assert working["waiting"][0]["runner"] == ""
    assert working["merges"]["last_hour"]["merged"] == 0

    text = await run_gt(env, "mq", "runners")
    assert text.returncode == 0, text.stderr
    for job in working["running"]:
        row = next(line for line in text.stdout.splitlines() if line.startswith(job["id"]))
        stack = ", ".join(f"{mr['id']} ({mr['bead']})" for mr in job["stack"])
        assert stack in row, text.stdout
        assert job["runner"] in row
    for name in runners:
        row = next(line for line in text.stdout.splitlines() if line.startswith(name))
        assert row.split()[1] == "up", text.stdout
    waiting_row = text.stdout.split("gate jobs waiting for a runner:")[1].splitlines()[2]
    assert waiting_row.startswith(working["waiting"][0]["id"]), text.stdout
    listed = await run_gt(env, "mq", "list")
    assert listed.returncode == 0, listed.stderr
    assert "runners: 2 of 2 up; gate jobs: 2 running, 1 waiting" in listed.stdout, listed.stdout

    # The dashboard's section shows the same: the runners at work and each job's stack.
    await assert_eventually(dashboard.healthy, timeout=60, message="the dashboard did not start")
    await page.goto(dashboard.at("/"))

    async def runners_on_the_page() -> bool:
        shown = await page.locator("[data-testid=runner]").evaluate_all(
            "es => es.map(e => [e.dataset.runner, e.dataset.state, e.dataset.job, e.dataset.gate])"
        )
        return sorted(shown) == sorted([n, "up", r["job"], "test"] for n, r in runners.items())

    await wait_for(runners_on_the_page, timeout=60)
    for job in jobs:
        stacked = await text_of(page, f"[data-testid=stacked-mr][data-job='{job['id']}']")
        assert [line.split()[0] for line in stacked] == [mr["id"] for mr in job["stack"]]
    statuses = await page.locator("[data-testid=gate-job]").evaluate_all("es => es.map(e => e.dataset.status)")
    assert sorted(statuses) == ["requested", "running", "running"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.locator("[data-testid=gates]").screenshot(path=str(ARTIFACTS / "dashboard-gates.png"))

    # The gates end: the batch lands with one push; runner-b is then stopped cleanly.
    release.touch()

    def merged() -> bool:
        assert pt.refinery is not None
        statuses = [pt.refinery.projection.state.mrs[i].status for i in ids]
        assert statuses == ["merged"] * 3, statuses
        return True

    await assert_eventually(merged, timeout=120, interval=0.2)
    await pt.stop("runner-b")
    events = await gate_events(nc)
    finished = [data for kind, data in events if kind == "gate.finished"]
    assert len(finished) == 3, "the three prefixes, each answered once"
    # Every merge request of the batch carries the batch's gate time.
    merged_events = [data for mr in ids for kind, data in await mr_events(pt, mr) if kind == "mr.merged"]
    (batch_seconds,) = {e["gate_seconds"] for e in merged_events}
    assert batch_seconds == pytest.approx(sum(r["seconds"] for f in finished for r in f["results"]), abs=0.01)

    async def merges_shown() -> dict[str, Any]:
        shown = await board(env)
        runners = {r["name"]: r for r in shown["runners"]}
        assert runners["runner-b"]["state"] == "stopped", runners["runner-b"]
        assert shown["running"] == [], shown
        assert shown["waiting"] == [], shown
        return shown

    after: dict[str, Any] = await assert_eventually(merges_shown, timeout=60, interval=0.3)
    hour = after["merges"]["last_hour"]
    assert (hour["hours"], hour["merged"], hour["batches"], hour["per_hour"]) == (1, 3, 1, 3.0)
    assert hour["gate_seconds"] == pytest.approx(batch_seconds, abs=0.001)
    assert hour["gate_minutes_per_merge"] == pytest.approx(batch_seconds / 60 / 3, abs=0.001)
    day = after["merges"]["last_day"]
    assert (day["merged"], day["batches"]) == (3, 1)
    assert day["per_hour"] == round(3 / 24, 2)
    assert [(f["rig"], f["last_hour"]["merged"]) for f in after["rigs"]] == [("demo", 3)]
    runners = {r["name"]: r for r in after["runners"]}
    assert runners["runner-a"]["alive"]
    assert not runners["runner-b"]["alive"]
    ran = {name: sum(1 for f in finished if f["runner"] == name) for name in runners}
    assert {name: r["jobs_run"] for name, r in runners.items()} == ran
    assert all(r["jobs_passed"] == r["jobs_run"] and r["job"] == "" for r in runners.values())
    of_rig = await board(env, "--rig", "demo")
    assert of_rig["merges"]["rig"] == "demo"
    assert of_rig["merges"]["last_hour"]["merged"] == 3
    refused = await run_gt(env, "mq", "runners", "--rig", "nosuch")
    assert refused.returncode != 0
    assert "no rig 'nosuch'" in refused.stderr, refused.stderr
    unknown = await run_gt(env, "mq", "list", "--rig", "nosuch")
    assert unknown.returncode == 0, unknown.stderr
    assert unknown.stdout.strip() == "the merge queue is empty", "as it always was: no board line for no rig"

    listed = await run_gt(env, "mq", "list")
    assert listed.returncode == 0, listed.stderr
    summary = listed.stdout.strip().splitlines()[-1]
    assert summary.startswith("runners: 1 of 2 up; gate jobs: 0 running, 0 waiting; merged: 3 in the last hour"), (
        listed.stdout
    )
    assert f"{day['gate_minutes_per_merge']:.2f} gate min per merge" in summary

    async def figures_on_the_page() -> bool:
        shown = await page.locator("[data-testid=merges-hour]").evaluate_all(
            "es => es.map(e => [e.dataset.merged, e.dataset.gateMinutes])"
        )
        states = await page.locator("[data-testid=runner]").evaluate_all("es => es.map(e => e.dataset.state)")
        if not shown or shown[0][0] != "3" or "stopped" not in states:
            return False
        assert float(shown[0][1]) == pytest.approx(hour["gate_minutes_per_merge"]), shown
        return True

    await wait_for(figures_on_the_page, timeout=60)
