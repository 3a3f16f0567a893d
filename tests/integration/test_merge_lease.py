"""The refinery merges a rig only while it holds the rig's merge lease: real git, real gates, the real log.

A refinery whose lease expired and passed on while its gates ran (the deacon expired it, another refinery took
it) pushes nothing and records nothing; the merge request is claimed again under the next token and lands once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.aio.client import Client

from services.refinery.settings import RefinerySettings
from shared.bus.append import Appender
from shared.core.config import TownConfig
from shared.core.ids import merge_lease_name
from shared.host import git
from shared.model.decision import NewEvent
from shared.model.events import Event, LeaseAcquired, LeaseExpired
from shared.service.intake import to_pending
from tests.helpers import assert_eventually
from tests.integration.test_refinery_batch import main_head, main_tree, mr_events, settled
from tests.log_tools import events_of
from tests.witness_town import PolecatTown, polecat_town


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    async with polecat_town(town, nc, tmp_path, refinery=RefinerySettings(merge_lease_ttl_s=1.0)) as handle:
        yield handle


async def append(pt: PolecatTown, event: Event, actor: str) -> None:
    appender = Appender(pt.nc, pt.config.evt_stream)
    new = NewEvent(payload=event, expected_seq=None)
    pending = to_pending(new, ts=datetime.now(UTC), actor=actor, causation_id=None, correlation_id=None)
    await appender.append([pending])


async def test_a_refinery_that_lost_the_merge_lease_during_its_gates_pushes_nothing(
    pt: PolecatTown, tmp_path: Path
) -> None:
    started, go = tmp_path / "gate-started", tmp_path / "gate-go"
    # The gate waits for the test: the lease passes on while it runs.
    gate = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done"
    await pt.add_rig(test_command=gate)
    bead = await pt.new_bead("Land once, under the live lease", prefix="demo")
    head = pt.push_branch("polecat/m/lease", {"leased.txt": "mine\n"})
    before = main_head(pt)
    mr_id = await pt.submit(bead, "polecat/m/lease", head)
    try:
        await assert_eventually(started.exists, timeout=60)
        assert pt.refinery is not None
        refinery = pt.refinery
        lease = merge_lease_name("demo")
        held = refinery.projection.state.merge_leases[lease]
        assert (held.holder, held.token, held.status) == (refinery.holder, 1, "held")

        # What the deacon and a second refinery would write: the first one's token expires, another takes token 2.
        now = datetime.now(UTC)
        await append(pt, LeaseExpired(lease=lease, holder=refinery.holder, token=1, last_renewed=now), "deacon")
        other = LeaseAcquired(
            lease=lease, holder="refinery-other", token=2, ttl_s=60, expires_at=now + timedelta(seconds=60)
        )
        await append(pt, other, "refinery")
    finally:
        go.touch()  # never leave the gate (and the refinery's shutdown) waiting
    await assert_eventually(lambda: refinery.fenced == 1, timeout=60)
    # The fenced batch wrote no outcome: what follows its claim is the claim under the next token, if anything.
    so_far = [kind for kind, _ in await mr_events(pt, mr_id)]
    assert so_far == ["mr.submitted", "mr.claimed", "mr.claimed", "mr.merged"][: len(so_far)], so_far

    # The other holder is not the active refinery (only this one holds the activity key), so it is a former
    # instance: the lease is taken over at once with token 3, and the merge request claimed again under it.
    mrs = await settled(pt, [mr_id])
    assert mrs[mr_id].status == "merged"
    events = await mr_events(pt, mr_id)
    assert [kind for kind, _ in events] == ["mr.submitted", "mr.claimed", "mr.claimed", "mr.merged"]
    assert not events[-1][1].get("already"), "the fenced batch had pushed it: the second found it merged already"
    assert main_tree(pt) == ["README.md", "leased.txt"]
    subjects = git.git("log", "--format=%s", f"{before}..refs/heads/main", cwd=pt.origin).splitlines()
    assert len(subjects) == 1, "landed exactly once"
    await assert_eventually(lambda: refinery.projection.state.merge_leases[lease].status == "released", timeout=30)
    history = [(kind, data["holder"], data["token"]) for kind, data in await events_of(pt.nc, f"gt.evt.lease.{lease}")]
    assert history == [
        ("lease.acquired", refinery.holder, 1),
        ("lease.expired", refinery.holder, 1),
        ("lease.acquired", "refinery-other", 2),
        ("lease.acquired", refinery.holder, 3),
        ("lease.released", refinery.holder, 3),
    ]


async def test_the_merge_lease_of_a_dead_refinery_is_taken_over_at_once_without_a_deacon(pt: PolecatTown) -> None:
    """A refinery that died holding the lease (no deacon running to expire it) does not block the rig, not even
    for the lease's TTL: the next active refinery takes it over at once with the next token."""
    lease = merge_lease_name("demo")
    now = datetime.now(UTC)
    dead = LeaseAcquired(lease=lease, holder="refinery-dead", token=1, ttl_s=3600, expires_at=now)
    await append(pt, dead, "refinery")
    await pt.add_rig(test_command="true")
    bead = await pt.new_bead("Not blocked by the dead", prefix="demo")
    head = pt.push_branch("polecat/m/dead", {"alive.txt": "yes\n"})
    mr_id = await pt.submit(bead, "polecat/m/dead", head)
    mrs = await settled(pt, [mr_id])
    assert mrs[mr_id].status == "merged"
    history = [(kind, data["holder"], data["token"]) for kind, data in await events_of(pt.nc, f"gt.evt.lease.{lease}")]
    assert pt.refinery is not None
    assert history[:2] == [("lease.acquired", "refinery-dead", 1), ("lease.acquired", pt.refinery.holder, 2)]
