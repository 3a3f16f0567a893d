"""The town chaos run, short variants for every test run: 60 beads in 6 convoys, the whole town as processes,
agents failing at the default rates, a service killed with SIGKILL every few seconds, NATS restarted once;
and 12 beads on three clustered NATS nodes, one of them also killed alone. The long run (1,000 beads) is
``python -m tests.chaos.town``; see docs/chaos.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.town import ChaosSettings, run_chaos

# Soak runs (minutes each, and a failed one is run again): `./dev soak`, not `./dev test` (docs/chaos.md).
pytestmark = [pytest.mark.chaos, pytest.mark.soak]


@pytest.mark.timeout(1200)
async def test_sixty_beads_survive_agent_faults_service_kills_and_a_nats_restart(tmp_path: Path) -> None:
    settings = ChaosSettings(beads=60, convoy_size=10, deadline_s=900)
    report = await run_chaos(settings, tmp_path / "town")
    print(report.render())
    assert report.ok, report.render()
    # The chaos happened: services were killed, NATS restarted, agents failed (about 20 faults are drawn for 60
    # beads; which kinds depends on the bead ids) and the witness warranted dead or hung ones.
    assert sum(report.kills.values()) >= 3, report.render()
    assert report.nats_restarts == 1
    assert sum(report.faults.values()) >= 5, report.render()
    assert report.warrants >= 1, report.render()


@pytest.mark.timeout(1200)
async def test_twelve_beads_survive_the_same_on_a_three_node_cluster_that_loses_its_leader(tmp_path: Path) -> None:
    """The cluster topology: streams with three replicas; the whole cluster is restarted once, and later the
    node leading GT_EVT is killed alone, comes back and catches up with the log."""
    settings = ChaosSettings(beads=12, convoy_size=6, cluster=True, mq_batch=4, deadline_s=900)
    report = await run_chaos(settings, tmp_path / "town")
    print(report.render())
    assert report.ok, report.render()
    assert report.nats_restarts == 1
    assert len(report.node_kills) == 1, report.render()
    assert sum(report.kills.values()) >= 3, report.render()
