"""Molecule gates end to end: a formula step that waits on a timer, a CI check or an operator's approval, in a town of
real parts (nats-server, the mayor or the deacon as a real process, the witness and the refinery, ``gt-agent`` in real
tmux, real git). The bead's first session works up to the gate and ends there (the bead stays hooked, no death); the
service that opens the gate is killed with SIGKILL while it is pending and started again; the gate opens once, a
fresh session works the rest and the bead merges."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from services.mayor.service import MayorService
from services.witness.settings import WitnessSettings
from shared.core.config import TownConfig
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually, gt_run
from tests.log_tools import read_all
from tests.service_process import ServiceProcess
from tests.witness_town import FAST, PolecatTown, polecat_town

STEPS = ("prepare", "gated", "finish")


def formula(wait: str) -> str:
    return (
        'formula = "gated"\n'
        '[[steps]]\nid = "prepare"\ntitle = "Prepare {{bead}}"\n'
        f'[[steps]]\nid = "gated"\ntitle = "After the gate"\nneeds = ["prepare"]\nwait = {wait}\n'
        '[[steps]]\nid = "finish"\ntitle = "Finish"\nneeds = ["gated"]\n'
    )


@pytest.fixture
async def gate_town(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    """The town without its mayor (each test runs the service it kills as a process)."""
    settings = WitnessSettings(min_orphan_age_s=60.0, kill_grace_s=1.0, respawn_backoff_s=0.0)
    async with polecat_town(town, nc, tmp_path, settings, with_mayor=False) as handle:
        yield handle


def service(name: str, gt_env: dict[str, str], town: TownConfig, tmp_path: Path, **extra: str) -> ServiceProcess:
    env = {**gt_env, "NATS_URL": town.nats_url, "GT_HOME": str(town.gt_home), **extra}
    return ServiceProcess(name, env, tmp_path / f"{name}.log")


async def log_events(nc: Client) -> list[tuple[str, dict[str, Any]]]:
    return [
        (env.type, {"actor": env.actor, **msgspec.json.decode(env.data)})
        for _seq, _subject, data in await read_all(nc, "GT_EVT")
        if (env := decode_envelope(data))
    ]


async def slung_to_the_gate(pt: PolecatTown, wait: str) -> str:
    """A bead slung with the gated formula; once its first session worked ``prepare`` and ended at the gate."""
    (pt.config.gt_home / "formulas").mkdir(parents=True, exist_ok=True)
    (pt.config.gt_home / "formulas" / "gated.formula.toml").write_text(formula(wait))
    await pt.add_rig(stall_after_s=600.0)
    bead = await pt.new_bead("Gated work")
    await pt.sling(bead, formula="gated")

    def ended_at_the_gate() -> bool:
        sessions = pt.sessions_of(bead)
        assert len(sessions) == 1, [(s.id, s.status, s.end_reason) for s in sessions]
        assert sessions[0].end_reason == "gate_wait", (sessions[0].status, sessions[0].warrant_reason)
        return True

    await assert_eventually(ended_at_the_gate, timeout=90)
    return bead


async def merged_after_the_gate(pt: PolecatTown, bead: str, by: str) -> None:
    """The gate opened once (by ``by``), a second session did the rest, the bead merged; every step done once."""

    async def closed() -> bool:
        events = await log_events(pt.nc)
        assert any(kind == "bead.closed" and data["bead_id"] == bead for kind, data in events), "not merged yet"
        return True

    merged: bool = await assert_eventually(closed, timeout=120)
    assert merged
    events = await log_events(pt.nc)
    opened = [data for kind, data in events if kind == "step.gate_opened" and data["bead_id"] == bead]
    assert [(o["step"], o["by"]) for o in opened] == [("gated", by)]
    done = Counter(data["step"] for kind, data in events if kind == "step.done" and data["bead_id"] == bead)
    assert done == Counter(STEPS)
    sessions = pt.sessions_of(bead)
    assert [s.end_reason for s in sessions] == ["gate_wait", "done"], pt.endings(sessions)
    assert all(s.attempt == n for n, s in enumerate(sessions, start=1))


async def test_a_timer_gate_opens_once_after_its_mayor_was_killed_while_it_waited(
    gate_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    pt = gate_town
    mayor = service("mayor", gt_env, pt.config, tmp_path).start()
    try:
        bead = await slung_to_the_gate(pt, '{ timer = "6s" }')
        listed = gt_run({**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home)}, "gate", "list")
        assert listed.returncode == 0, listed.stderr
        assert "a timer of 6s" in listed.stdout, listed.stdout
        assert "waiting, opens" in listed.stdout, listed.stdout
        mayor.signal(signal.SIGKILL)
        await assert_eventually(lambda: mayor.returncode() is not None, timeout=10)
        mayor.start()
        await merged_after_the_gate(pt, bead, "timer")
    finally:
        mayor.stop()


async def test_a_ci_gate_opens_once_when_its_check_passes_after_its_deacon_was_killed_while_it_waited(
    gate_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    pt = gate_town
    await pt.start("mayor", MayorService(pt.config, FAST))
    green = pt.config.gt_home / "ci-green"
    deacon = service("deacon", gt_env, pt.config, tmp_path, GT_GATE_POLL="0.3", GT_WATCHED_SERVICES="").start()
    try:
        bead = await slung_to_the_gate(pt, '{ ci = "test -e \\"$GT_HOME/ci-green\\" && echo all green" }')

        def checked_and_failed() -> bool:
            failed = deacon.logged("gate_check_failed")
            assert failed, "no check ran yet"
            assert failed[-1]["bead"] == bead
            return True

        await assert_eventually(checked_and_failed, timeout=30)
        deacon.signal(signal.SIGKILL)
        await assert_eventually(lambda: deacon.returncode() is not None, timeout=10)
        green.write_text("")
        deacon.start()
        await merged_after_the_gate(pt, bead, "ci")
        events = await log_events(pt.nc)
        [opened] = [data for kind, data in events if kind == "step.gate_opened"]
        assert (opened["actor"], opened["detail"]) == ("deacon", "all green")
    finally:
        deacon.stop()


async def test_a_human_gate_opens_once_when_an_operator_approves_it_after_its_mayor_was_killed(
    gate_town: PolecatTown, gt_env: dict[str, str], tmp_path: Path
) -> None:
    pt = gate_town
    mayor = service("mayor", gt_env, pt.config, tmp_path).start()
    env = {**gt_env, "NATS_URL": pt.config.nats_url, "GT_HOME": str(pt.config.gt_home)}
    try:
        bead = await slung_to_the_gate(pt, '{ human = "Ship {{bead}}?" }')
        listed = gt_run(env, "gate", "list", "--bead", bead)
        assert f"an operator's approval (Ship {bead}?)" in listed.stdout, listed.stdout
        status = gt_run(env, "mol", "status", bead)
        assert f"gt gate approve {bead} gated" in status.stdout, status.stdout
        mayor.signal(signal.SIGKILL)
        await assert_eventually(lambda: mayor.returncode() is not None, timeout=10)
        mayor.start()
        # Approved once the mayor is back (before, the command waits in GT_CMD and `gt` says the mayor is down).
        await assert_eventually(lambda: len(mayor.logged("service_ready")) == 2, timeout=60)
        approved = gt_run(env, "gate", "approve", bead, "gated", "--note", "ship it", "--actor", "operator:ann")
        assert approved.returncode == 0, approved.stderr
        assert "opened" in approved.stdout, approved.stdout
        await merged_after_the_gate(pt, bead, "operator")
        again = gt_run(env, "gate", "approve", bead, "gated")
        assert again.returncode != 0 or "was open already" in again.stdout, (again.stdout, again.stderr)
        events = await log_events(pt.nc)
        [opened] = [data for kind, data in events if kind == "step.gate_opened"]
        assert (opened["actor"], opened["detail"]) == ("operator:ann", "ship it")
        # What the second session's `gt prime` showed of the gate, from the molecule as the mayor keeps it.
        shown = gt_run(env, "mol", "status", bead, "--json")
        [gated] = [s for s in msgspec.json.decode(shown.stdout)["steps"] if s["id"] == "gated"]
        assert (gated["gate_opened_by"], gated["gate_opener"], gated["gate_detail"]) == (
            "operator",
            "operator:ann",
            "ship it",
        )
    finally:
        mayor.stop()
