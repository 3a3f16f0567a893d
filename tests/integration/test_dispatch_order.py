"""Dispatch follows dependencies, as an operator sees it through `gt` with a real server and mayor: a blocked
bead is refused by `gt sling` (unless forced, and the log says so), `gt convoy sling` holds the blocked beads
and the mayor slings each once its blockers close, exactly once, across a mayor restart."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.aio.client import Client

from services.mayor.service import MayorService
from shared.core.config import TownConfig
from shared.model.events import decode_envelope
from tests.helpers import assert_eventually
from tests.integration.test_cli import Gt
from tests.integration.test_mayor_service import run_mayor
from tests.log_tools import read_all


@pytest.fixture
def gt(gt_env: dict[str, str], town: TownConfig) -> Gt:
    return Gt(gt_env, town)


@pytest.fixture
async def mayor(town: TownConfig) -> AsyncIterator[MayorService]:
    async with run_mayor(town) as service:
        yield service


async def new_bead(gt: Gt, title: str, *needs: str) -> str:
    args = ["bead", "create", title]
    for need in needs:
        args += ["--needs", need]
    run = await gt(*args)
    assert run.code == 0, run.err
    return run.out.strip()


async def slings_of(nc: Client, bead_id: str) -> list[dict[str, Any]]:
    """The ``bead.slung`` events the log holds for the bead."""
    found = []
    for _, _, data in await read_all(nc, "GT_EVT", f"gt.evt.bead.{bead_id}"):
        env = decode_envelope(data)
        if env.type == "bead.slung":
            found.append(json.loads(bytes(env.data)))
    return found


async def test_gt_sling_refuses_a_blocked_bead_and_force_overrides_on_the_record(gt: Gt, mayor: MayorService) -> None:
    blocker = await new_bead(gt, "Lay the foundation")
    blocked = await new_bead(gt, "Build the walls", blocker)

    refused = await gt("sling", blocked, "demo")
    assert refused.code == 1
    assert "blocked" in refused.err
    assert f"{blocker} (open)" in refused.err
    assert "--force" in refused.err
    assert "open" in (await gt("bead", "show", blocked)).out

    forced = await gt("sling", blocked, "demo", "--force")
    assert forced.code == 0, forced.err
    assert forced.out.startswith(f"{blocked}: hooked on demo")
    assert f"forced past open blockers: {blocker}" in forced.out
    history = await gt("bead", "history", blocked)
    assert history.code == 0, history.err
    assert "slung to rig demo" in history.out
    assert f"forced past open blocker {blocker}" in history.out


async def test_gt_convoy_sling_holds_blocked_beads_and_slings_them_as_their_blockers_close(
    gt: Gt, mayor: MayorService, nc: Client
) -> None:
    outside = await new_bead(gt, "Outside the convoy")
    first = await new_bead(gt, "First")
    second = await new_bead(gt, "Second", first)
    elsewhere = await new_bead(gt, "Needs the outside", outside)
    convoy = (await gt("convoy", "create", "Sprint", first, second, elsewhere, "--json")).json()["data"]["result"]["id"]

    run = await gt("convoy", "sling", convoy, "demo")
    assert run.code == 0, run.out + run.err
    lines = run.out.strip().splitlines()
    assert lines[0] == f"{convoy}: 1 slung to demo, 2 held until their blockers close, 0 not open (left as they were)"
    assert f"  {second}: held: waiting for {first}" in lines
    assert f"  {elsewhere}: held: waiting for {outside}" in lines
    assert await slings_of(nc, second) == []

    shown = await gt("convoy", "status", convoy)
    assert shown.code == 0, shown.err
    rows = {line.split()[1]: line for line in shown.out.splitlines() if line.strip().split()[:1] in (["1"], ["2"])}
    assert rows[first].split()[:3] == ["1", first, "hooked"]
    assert rows[second].split()[:2] == ["2", second]
    assert f"held: waiting for {first}" in rows[second]
    assert "demo" in rows[second].split()
    assert f"held: waiting for {outside}" in rows[elsewhere]
    assert "2 held" in shown.out

    again = await gt("convoy", "sling", convoy, "demo")  # the held ones stay held, nothing is slung twice
    assert again.code == 0, again.out
    assert again.out.startswith(f"{convoy}: 0 slung to demo, 2 held until their blockers close, 1 not open")

    assert (await gt("bead", "close", first)).code == 0
    await _wait_hooked(gt, second)
    assert (await _bead(gt, elsewhere))["status"] == "open"
    shown = await gt("convoy", "status", convoy)
    assert "1 held" in shown.out
    history = await gt("bead", "history", second)
    assert f"slung to rig demo (held until {first} closed)" in history.out

    assert (await gt("bead", "close", outside, "--reason", "won't do")).code == 0
    await _wait_hooked(gt, elsewhere)
    assert [len(await slings_of(nc, b)) for b in (first, second, elsewhere)] == [1, 1, 1]


async def _bead(gt: Gt, bead_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await gt("bead", "show", bead_id, "--json")).json()
    return found


async def _wait_hooked(gt: Gt, bead_id: str) -> None:
    async def hooked() -> bool:
        return bool((await _bead(gt, bead_id))["status"] == "hooked")

    done: bool = await assert_eventually(hooked, timeout=60, message=f"{bead_id} was not slung")
    assert done


async def test_a_mayor_stopped_between_the_blocker_closing_and_the_sling_slings_it_after_restart_once(
    gt: Gt, town: TownConfig, nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with run_mayor(town) as before:
        blocker = await new_bead(gt, "Blocker")
        held = await new_bead(gt, "Held", blocker)
        convoy = (await gt("convoy", "create", "Sprint", held, "--json")).json()["data"]["result"]["id"]
        assert (await gt("convoy", "sling", convoy, "demo")).code == 0

        async def stopped_before_the_sling() -> None:
            """This mayor dies right after the blocker's close: it never reconciles again."""

        monkeypatch.setattr(before, "reconcile", stopped_before_the_sling)
        assert (await gt("bead", "close", blocker)).code == 0
        assert (await _bead(gt, held))["status"] == "open"
    assert await slings_of(nc, held) == []

    async with run_mayor(town):
        await _wait_hooked(gt, held)
    async with run_mayor(town) as again:
        assert again.reader is not None
        await again.reconcile()  # one more look, on the state rebuilt from the log: nothing owed
        assert (await _bead(gt, held))["slings"] == 1
    [slung] = await slings_of(nc, held)
    assert (slung["rig"], slung["held_for"]) == ("demo", [blocker])
