"""The gate runners' user ``runner`` in account RUNNERS (ops/nats/accounts.conf), on a real nats-server with the shipped
accounts file.

- Runners do their whole work as that user with nothing refused: they follow the gate jobs, take them, beat, answer
  them, keep their activity keys and heartbeats; the refinery merges on their word; the supervisor's way of asking one
  runner (``gt health runner-<name>``, as the operator and as the runner user itself) is answered by that runner.
- The user can append gate job events and nothing else of the town: a forged ``mr.merged`` or ``bead.closed`` on its
  own subject, a command as the refinery, another scope's activity key or heartbeat, deleting or purging the log,
  making a consumer, joining the mayor's queries: refused by NATS at once. No reply or deliver subject it sets makes
  JetStream publish its bytes in the town (its account has no JetStream; what it asks of GT is answered on a reply
  the server made). And an ``mr.merged`` or ``bead.closed`` it stores on its own subject ``gt.evt.gate.<id>`` (which
  NATS lets it write) is no merge and no close: every projection folds an event only from its own aggregate's
  subjects.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest
import structlog

from services.refinery.service import RefineryService
from services.refinery.settings import RefinerySettings
from services.runner.service import RunnerService
from services.runner.settings import RunnerSettings
from shared.bus.connection import close_quietly
from shared.bus.kv import Bucket
from shared.model import heartbeats
from shared.model.events import BeadClosed, MergeRequestMerged, encode_event
from tests.helpers import assert_eventually
from tests.integration.test_gate_runners import FAILS_ON_MARKERS, gate_events
from tests.integration.test_plugin_account import allowed, refused, town_state
from tests.secured_town import SecuredTown, services_as_themselves
from tests.witness_town import FAST, PolecatTown

RUNNERS = ("a", "b")


@pytest.fixture
async def runner_town(st: SecuredTown, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    """The mayor, the witness (rigs), a refinery whose gates run on two runners, and the two runners, each service as
    its own user."""
    async with services_as_themselves(st, tmp_path, "mayor", "witness") as town:
        settings = RefinerySettings(runners=2, batch=2, gate_timeout_s=60)
        town.refinery = RefineryService(st.config("refinery"), FAST, refinery=settings)
        await town.start("refinery", town.refinery)
        for name in RUNNERS:
            home = str(tmp_path / "runners" / name)
            runner = RunnerService(
                st.config("runner"), FAST, runner=RunnerSettings(name=name, home=home, heartbeat_s=0.5)
            )
            await town.start(f"runner-{name}", runner)
        yield town


async def test_runners_gate_the_queue_as_the_runner_user_with_nothing_refused(
    st: SecuredTown, runner_town: PolecatTown
) -> None:
    town = runner_town
    await town.add_rig(test_command=FAILS_ON_MARKERS)
    beads = [await town.new_bead(f"Change {n}") for n in (1, 2)]
    heads = [
        town.push_branch(
            f"polecat/p{n}/{bead}", {f"work-{n}.txt": f"change {n}\n", **({"FAIL_2": "red\n"} if n == 2 else {})}
        )
        for n, bead in zip((1, 2), beads, strict=True)
    ]
    ids = [
        await town.submit(bead, f"polecat/p{n}/{bead}", head)
        for n, bead, head in zip((1, 2), beads, heads, strict=True)
    ]

    def settled() -> list[str]:
        assert town.refinery is not None
        mrs = town.refinery.projection.state.mrs
        statuses = [mrs[i].status if i in mrs else "-" for i in ids]
        assert all(s in ("merged", "failed") for s in statuses), statuses
        return statuses

    assert await assert_eventually(settled, timeout=120, interval=0.1) == ["merged", "failed"]
    events = await gate_events(town.nc)
    runners = {data["runner"] for kind, data in events if kind == "gate.started"}
    assert runners, events
    assert runners <= {f"runner-{name}" for name in RUNNERS}, runners
    finished = [data for kind, data in events if kind == "gate.finished"]
    assert finished, events
    assert all(not f.get("error") for f in finished), finished

    # Each runner is asked on its own: by the operator (the supervisor's readiness, `gt health`), through the import
    # of its queries, and by the runner user itself (its container's health check).
    for name in RUNNERS:
        for user in ("operator", "runner"):
            health = await st.gt(user, "health", f"runner-{name}", "--json")
            assert health.returncode == 0, health.stdout + health.stderr
            answer = json.loads(health.stdout)
            assert (answer["identity"], answer["caught_up"]) == (f"runner-{name}", True), answer
    # Their liveness, in GT_SERVICES under their own keys (`runner.<name>.<instance>`), read by the deacon's way.
    mayor = await st.connect("mayor")
    try:
        keys = await Bucket(mayor, "GT_SERVICES").entries()
        active = await Bucket(mayor, "GT_ACTIVE").entries()
    finally:
        await close_quietly(mayor)
    beats = [heartbeats.decode(entry.value) for key, entry in keys.items() if key.startswith("runner.")]
    assert {beat.service for beat in beats if beat is not None} == {f"runner-{name}" for name in RUNNERS}
    assert {f"runner.{name}" for name in RUNNERS} <= set(active), sorted(active)
    assert st.violations() == [], "the runners and the refinery did all of that with nothing refused"


def forged(payload: Any, event_id: str) -> bytes:
    return encode_event(payload, event_id=event_id, ts=datetime.now(UTC), actor="refinery")


async def test_the_runner_user_appends_gate_events_only_and_cannot_make_jetstream_publish_into_the_town(
    st: SecuredTown, tmp_path: Path
) -> None:
    async with services_as_themselves(st, tmp_path, "mayor") as town:
        created = await st.gt("operator", "bead", "create", "The victim")
        assert created.returncode == 0, created.stderr
        bead = created.stdout.strip()
        mayor = await st.connect("mayor")
        runner = await st.connect("runner")
        try:
            before = await town_state(mayor)
            closed = forged(BeadClosed(bead_id=bead, reason="forged by a runner"), "ev-runner-close")
            merged = forged(
                MergeRequestMerged(mr_id="mr-victim", merged_commit="0" * 40, target_before="1" * 40), "ev-merge"
            )
            # Its own heartbeat key holds a forged close: the bytes a trampoline would carry into the log.
            beat_key = "$KV.GT_SERVICES.runner.x.attacker"
            await allowed(runner, runner.request(beat_key, closed, timeout=5))
            js = runner.jetstream()
            targets = (
                f"gt.evt.bead.{bead}",
                "gt.evt.mr.mr-victim",
                "gt.cmd.bead.close.svc.refinery",
                "$JS.API.STREAM.DELETE.GT_EVT",
                "$JS.API.STREAM.PURGE.GT_CMD",
                "$KV.GT_ACTIVE.mayor",
            )
            for target in targets:
                # A direct get of what it wrote, with the reply set to the town's subject: answered in RUNNERS.
                own = "$JS.API.DIRECT.GET.GT_EVT"
                await allowed(runner, runner.publish(own, json.dumps({"seq": 1, "batch": 5}).encode(), reply=target))
                await allowed(runner, runner.publish("$JS.API.STREAM.MSG.GET.GT_EVT", b'{"seq": 1}', reply=target))
                await allowed(runner, runner.publish(beat_key, closed, reply=target))
                await allowed(runner, runner.publish("$JS.API.STREAM.INFO.GT_EVT", b"", reply=target))
            # Straight at the town: refused at once.
            push = {"stream_name": "GT_EVT", "config": {"deliver_subject": f"gt.evt.bead.{bead}", "ack_policy": "none"}}
            for subject, body in (
                (f"gt.evt.bead.{bead}", closed),
                ("gt.evt.mr.mr-victim", merged),
                ("gt.cmd.bead.close.svc.refinery", json.dumps({"id": bead, "reason": "x", "cmd_id": "r1"}).encode()),
                ("gt.cmd.bead.create", b'{"title": "from a runner"}'),
                ("$JS.API.STREAM.DELETE.GT_EVT", b""),
                ("$JS.API.STREAM.PURGE.GT_EVT", b""),
                ("$JS.API.STREAM.DELETE.KV_GT_ACTIVE", b""),
                ("$JS.API.CONSUMER.CREATE.GT_EVT", json.dumps(push).encode()),
                ("$JS.API.CONSUMER.CREATE.KV_GT_SERVICES", json.dumps(push).encode()),
                ("$KV.GT_ACTIVE.mayor", b"{}"),
                ("$KV.GT_SERVICES.mayor.1-x", b"{}"),
                ("$JS.API.DIRECT.GET.KV_GT_ACTIVE.$KV.GT_ACTIVE.mayor", b""),
                ("$JS.API.STREAM.PURGE.OBJ_GT_SNAP", b""),
                ("gt.q.mayor.status", b"{}"),
            ):
                await refused(runner, runner.publish(subject, body), subject)
            await refused(runner, js.publish("gt.evt.mr.mr-victim", merged, timeout=5), "gt.evt.mr.mr-victim")
            await refused(runner, runner.subscribe("gt.q.mayor.>", queue="mayor-q"), "gt.q.mayor.>")
            await runner.flush()
            await asyncio.sleep(1.0)  # what a trampoline would have done has been done by now
            after = await town_state(mayor)
            assert after == before, "nothing forged, deleted, purged or taken over"
            with pytest.raises(nats.js.errors.NotFoundError):
                await mayor.jetstream().get_last_msg("GT_EVT", "gt.evt.mr.mr-victim")
            last = await mayor.jetstream().get_last_msg("GT_EVT", f"gt.evt.bead.{bead}")
            assert b"forged by a runner" not in (last.data or b""), "the bead's last event is its own creation"

            # What NATS lets it write, a gate job's subject, carrying another aggregate's event: stored, and no
            # projection takes it for a close or a merge.
            seq_close = (await js.publish("gt.evt.gate.forged-close", closed, timeout=5)).seq
            seq_merge = (await js.publish("gt.evt.gate.forged-merge", merged, timeout=5)).seq
            assert seq_merge > seq_close > before.evt[2]
            shown = await st.gt("operator", "bead", "show", bead, "--json")
            assert shown.returncode == 0, shown.stderr
            assert json.loads(shown.stdout)["status"] == "open", "a close on a gate's subject closes nothing"
            assert town.mayor is not None
            assert town.mayor.projection.last_seq >= seq_merge
            assert town.mayor.projection.state.beads[bead].status == "open"
        finally:
            await close_quietly(runner)
            await close_quietly(mayor)
    lines = st.violations()
    for subject in ("gt.evt.mr.mr-victim", "$JS.API.STREAM.DELETE.GT_EVT", "$KV.GT_ACTIVE.mayor", "gt.q.mayor.>"):
        assert any('"RUNNERS/user:runner"' in line and subject in line for line in lines), (subject, lines)


async def test_a_runner_started_before_the_town_is_provisioned_waits_for_it_and_then_serves(
    st: SecuredTown, tmp_path: Path
) -> None:
    # The runner user may make no stream: a runner that comes up first (its container before the services') waits,
    # saying so at info while the town forms, and serves once a service has provisioned the town.
    runner = RunnerService(
        st.config("runner"), FAST, runner=RunnerSettings(name="early", home=str(tmp_path / "early"), heartbeat_s=0.5)
    )
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(runner.run(), name="runner-early")
        try:
            await assert_eventually(
                lambda: any(e["event"] == "town_not_provisioned_yet" for e in logs), timeout=30, interval=0.05
            )
            assert not runner.ready.is_set()
            async with services_as_themselves(st, tmp_path, "mayor"):
                await assert_eventually(runner.ready.is_set, timeout=30, interval=0.05)
                health = await st.gt("operator", "health", "runner-early")
                assert health.returncode == 0, health.stdout + health.stderr
        finally:
            await runner.shutdown()
            await asyncio.wait_for(task, 30)
    waited = [e for e in logs if e["event"] == "town_not_provisioned_yet"]
    assert waited[0]["missing"] == ["GT_EVT", "KV_GT_ACTIVE", "KV_GT_SERVICES"], waited[0]
    assert waited[0]["log_level"] == "info", "a town still forming is no warning"
    assert st.violations() == [], "waiting asked nothing the runner user may not ask"
