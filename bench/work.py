"""(e) slinging 1,000 beads with the 6-step polecat-work formula, (f) stepping them through, and (g) replaying
the resulting log.

(e), (f): the mayor as its own process; all commands in flight at once; rate = commands / (first publish ->
    last outcome). Each sling cooks the formula and stores four events (bead.slung, molecule.attached,
    convoy.created, the outcome). Ceiling: raw ``publish_async`` of as many messages of the same size (the
    foundation's command ceiling).
(g): EventReader + the mayor's projection over the whole resulting log (creates, slings with molecules,
    step.done, molecule.completed, closes, outcomes) vs nats-py's ordered consumer with the two-step decode
    (the foundation's replay ceiling).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from bench import common as common
from bench.replay import _ceiling_replay, _projection_replay
from shared.bus.connection import Connection
from shared.core import subjects
from shared.model.commands import BeadClose, BeadCreate, BeadSling, StepDone
from shared.model.events import RigAdded, encode_event
from shared.service import heap as runtime

STEPS = ["load-context", "implement", "commit", "self-review", "run-tests", "submit"]
RIGS = [f"rig{i}" for i in range(4)]


async def _add_rigs(nc: Connection) -> None:
    """The rigs the beads are slung to, stored as the witness stores them (no witness runs here): the mayor
    refuses slings to rigs it does not know."""
    js = nc.jetstream()
    for rig in RIGS:
        event = RigAdded(rig=rig, repo=f"/bench/{rig}.git", prefix=rig, agent_command="gt-agent")
        await js.publish(
            subjects.event_subject("rig", rig),
            encode_event(event, event_id=f"bench-{rig}", ts=datetime.now(UTC), actor="witness"),
        )


async def _round(nc: Connection, beads: int) -> tuple[float, float, float, float]:
    """One round over fresh beads: (sling seconds, its ceiling, step seconds, its ceiling)."""
    _, _, outcomes = await common.run_commands(
        nc, [BeadCreate(title=f"Widget {i}", labels=["bench"]) for i in range(beads)]
    )
    ids = [o["result"]["id"] for o in outcomes]

    slings = [BeadSling(id=bead_id, rig=RIGS[i % len(RIGS)]) for i, bead_id in enumerate(ids)]
    sling_ceiling = await common.raw_publish_ceiling(nc, common.bodies_of(slings))
    sling_s, _, sling_outcomes = await common.run_commands(nc, slings)
    assert all(o["type"] == "cmd.accepted" for o in sling_outcomes), "a sling was rejected"

    # Step k of every bead before step k+1 of any: each step's needs are done when it arrives.
    steps = [StepDone(bead=bead_id, step=step) for step in STEPS for bead_id in ids]
    step_ceiling = await common.raw_publish_ceiling(nc, common.bodies_of(steps))
    steps_s = 0.0
    for k in range(len(STEPS)):
        elapsed, _, step_outcomes = await common.run_commands(nc, steps[k * beads : (k + 1) * beads])
        assert all(o["type"] == "cmd.accepted" for o in step_outcomes), "a step was rejected"
        steps_s += elapsed
    await common.run_commands(nc, [BeadClose(id=bead_id, reason="merged") for bead_id in ids])
    return sling_s, sling_ceiling, steps_s, step_ceiling


async def run(beads: int = 1_000, rounds: int = 2) -> list[common.Figure]:
    runtime.tune_gc()
    figures: list[common.Figure] = []
    with common.server() as srv:
        nc, town = await common.provisioned(srv.url)
        await _add_rigs(nc)
        mayor = common.start_service("mayor", srv.url)
        try:
            await common.wait_ready(nc, "mayor")
            results = [await _round(nc, beads) for _ in range(rounds)]
        finally:
            common.stop_service(mayor)
        sling_s, sling_ceiling = common.median_round([(r[0], r[1]) for r in results])
        steps_s, step_ceiling = common.median_round([(r[2], r[3]) for r in results])
        figures.append(
            common.Figure(
                name=f"(e) sling {beads:,} beads, cooking the 6-step polecat-work formula",
                value=beads / sling_s,
                unit="commands/s",
                ceiling=beads / sling_ceiling,
                ceiling_name="raw publish_async",
                notes=[
                    f"{sling_s:.2f}s; each sling stores 4 events (hook, molecule, auto-convoy, outcome)",
                    f"the median round of {rounds}",
                ],
            )
        )
        print(figures[-1].line(), flush=True)
        steps = beads * len(STEPS)
        figures.append(
            common.Figure(
                name=f"(f) step.done through {beads:,} molecules ({steps:,} commands)",
                value=steps / steps_s,
                unit="commands/s",
                ceiling=steps / step_ceiling,
                ceiling_name="raw publish_async",
                notes=[f"{steps_s:.2f}s in {len(STEPS)} waves of {beads:,}; the median round of {rounds}"],
            )
        )
        print(figures[-1].line(), flush=True)

        last = int((await nc.jetstream().stream_info(town.evt_stream)).state.last_seq)
        replays: list[common.Round] = []
        for _ in range(rounds):
            ceiling_s = await _ceiling_replay(nc, town, last)
            replays.append(((await _projection_replay(nc, town, last))[0], ceiling_s))
        measured_s, ceiling_s = common.median_round(replays)
        figures.append(
            common.Figure(
                name=f"(g) replay the work log ({last:,} events: molecules, steps, convoys) into the mayor",
                value=last / measured_s,
                unit="events/s",
                ceiling=last / ceiling_s,
                ceiling_name="ordered consumer + decode",
                target=">= 0.7",
                notes=[f"{measured_s:.2f}s vs {ceiling_s:.2f}s; the median round of {rounds}"],
            )
        )
        print(figures[-1].line(), flush=True)
        await nc.close()
    return figures


if __name__ == "__main__":
    started = time.perf_counter()
    asyncio.run(run())
    print(f"{time.perf_counter() - started:.1f}s")
