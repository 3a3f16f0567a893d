"""Convoys: beads tracked together, closing by themselves (or, when owned, by landing).
Run against the pure model and against the real mayor."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.core.errors import CommandError, QueryError
from shared.model.events import decode_envelope
from tests.drivers import Driver, MemoryDriver, NatsDriver
from tests.log_tools import read_all

CREATE, CLOSE = "gt.cmd.bead.create", "gt.cmd.bead.close"
NEW, ADD, LAND = "gt.cmd.convoy.create", "gt.cmd.convoy.add", "gt.cmd.convoy.land"


async def beads(driver: Driver, n: int, prefix: str = "hq") -> list[str]:
    return [(await driver.send(CREATE, {"title": f"b{i}", "prefix": prefix}))["id"] for i in range(n)]


async def convoy(driver: Driver, bead_ids: list[str], **fields: Any) -> str:
    result = await driver.send(NEW, {"title": "Sprint 7", "beads": bead_ids, **fields})
    convoy_id: str = result["id"]
    return convoy_id


async def code(driver: Driver, subject: str, body: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as info:
        await driver.send(subject, body)
    return info.value.code


async def status(driver: Driver, convoy_id: str) -> dict[str, Any]:
    found: dict[str, Any] = await driver.ask("convoy", id=convoy_id)
    return found


class TestProgressAndAutoClose:
    async def test_progress_counts_closed_of_total(self, driver: Driver) -> None:
        ids = await beads(driver, 3)
        result = await driver.send(NEW, {"title": "Sprint 7", "beads": ids})
        assert (result["closed"], result["total"], result["status"]) == (0, 3, "open")
        await driver.send(CLOSE, {"id": ids[0]})
        found = await status(driver, result["id"])
        assert (found["closed"], found["total"], found["status"]) == (1, 3, "open")
        assert [b["id"] for b in found["bead_details"]] == ids

    async def test_a_convoy_closes_when_its_last_bead_closes(self, driver: Driver) -> None:
        ids = await beads(driver, 2)
        convoy_id = await convoy(driver, ids)
        await driver.send(CLOSE, {"id": ids[0]})
        await driver.send(CLOSE, {"id": ids[1]})
        if driver.kind == "nats":
            await driver.advance(0)  # let the mayor reconcile on what it applied
        found = await status(driver, convoy_id)
        assert (found["status"], found["closed"], found["landed"]) == ("closed", 2, False)
        assert await driver.ask("convoys") == []
        assert [c["id"] for c in await driver.ask("convoys", include_closed=True)] == [convoy_id]

    async def test_an_empty_convoy_never_closes_by_itself(self, driver: Driver) -> None:
        convoy_id = await convoy(driver, [])
        await driver.advance(60)
        assert (await status(driver, convoy_id))["status"] == "open"

    async def test_adding_beads_and_adding_them_again_is_a_no_op(self, driver: Driver) -> None:
        first, second = await beads(driver, 2)
        convoy_id = await convoy(driver, [first])
        added = await driver.send(ADD, {"id": convoy_id, "beads": [second, first]})
        assert (added["changed"], added["total"]) == (True, 2)
        again = await driver.send(ADD, {"id": convoy_id, "beads": [second]})
        assert again["changed"] is False
        assert (await status(driver, convoy_id))["beads"] == [first, second]
        assert (await driver.ask("get", id=second))["convoys"] == [convoy_id]

    async def test_a_closed_convoy_takes_no_more_beads(self, driver: Driver) -> None:
        first, later = await beads(driver, 2)
        convoy_id = await convoy(driver, [first])
        await driver.send(CLOSE, {"id": first})
        await driver.advance(0)
        assert (await status(driver, convoy_id))["status"] == "closed"
        assert await code(driver, ADD, {"id": convoy_id, "beads": [later]}) == "backward_transition"

    async def test_cross_rig_convoys_track_beads_of_any_rig(self, driver: Driver) -> None:
        gt_beads = await beads(driver, 2, prefix="gt")
        web_beads = await beads(driver, 2, prefix="web")
        convoy_id = await convoy(driver, [*gt_beads, *web_beads])
        for bead_id in [*gt_beads, *web_beads]:
            await driver.send(CLOSE, {"id": bead_id})
        await driver.advance(0)
        assert (await status(driver, convoy_id))["status"] == "closed"

    async def test_a_bead_in_two_convoys_closes_both(self, driver: Driver) -> None:
        shared_bead, other = await beads(driver, 2)
        both = await convoy(driver, [shared_bead])
        pair = await convoy(driver, [shared_bead, other])
        await driver.send(CLOSE, {"id": shared_bead})
        await driver.advance(0)
        assert (await status(driver, both))["status"] == "closed"
        assert (await status(driver, pair))["status"] == "open"


class TestOwned:
    async def test_an_owned_convoy_waits_for_land(self, driver: Driver) -> None:
        ids = await beads(driver, 2)
        convoy_id = await convoy(driver, ids, owned=True)
        for bead_id in ids:
            await driver.send(CLOSE, {"id": bead_id})
        await driver.advance(3600)
        assert (await status(driver, convoy_id))["status"] == "open"
        landed = await driver.send(LAND, {"id": convoy_id})
        assert (landed["status"], landed["changed"]) == ("closed", True)
        found = await status(driver, convoy_id)
        assert (found["status"], found["landed"], found["forced"]) == ("closed", True, False)
        assert (await driver.send(LAND, {"id": convoy_id}))["changed"] is False  # idempotent

    async def test_landing_with_open_beads_is_refused_unless_forced(self, driver: Driver) -> None:
        ids = await beads(driver, 2)
        convoy_id = await convoy(driver, ids, owned=True)
        await driver.send(CLOSE, {"id": ids[0]})
        assert await code(driver, LAND, {"id": convoy_id}) == "conflict"
        forced = await driver.send(LAND, {"id": convoy_id, "force": True})
        assert forced["status"] == "closed"
        assert (await status(driver, convoy_id))["forced"] is True

    async def test_only_owned_convoys_are_landed(self, driver: Driver) -> None:
        convoy_id = await convoy(driver, await beads(driver, 1))
        assert await code(driver, LAND, {"id": convoy_id}) == "invalid"


class TestDispatchInWaves:
    """A convoy slung with ``hold`` (what `gt convoy sling` sends) dispatches its beads as their blockers close."""

    async def test_blocked_beads_are_held_and_slung_wave_by_wave_and_status_says_which(self, driver: Driver) -> None:
        [outside] = await beads(driver, 1)  # a blocker the convoy does not track still blocks
        first = (await driver.send(CREATE, {"title": "first"}))["id"]
        second = (await driver.send(CREATE, {"title": "second", "needs": [first]}))["id"]
        third = (await driver.send(CREATE, {"title": "third", "needs": [second]}))["id"]
        external = (await driver.send(CREATE, {"title": "external", "needs": [outside]}))["id"]
        convoy_id = await convoy(driver, [first, second, third, external])
        outcomes = {}
        for bead_id in (first, second, third, external):
            sling = {"id": bead_id, "rig": "demo", "hold": True, "no_convoy": True}
            outcomes[bead_id] = (await driver.send("gt.cmd.bead.sling", sling))["status"]
        assert outcomes == {first: "hooked", second: "held", third: "held", external: "held"}

        def dispatch(found: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
            return {b["id"]: (b["wave"], b["status"], b["held_for"], b["waiting_for"]) for b in found["bead_details"]}

        found = await status(driver, convoy_id)
        assert dispatch(found) == {
            first: (1, "hooked", None, []),
            second: (2, "open", "demo", [first]),
            third: (3, "open", "demo", [second]),
            external: (1, "open", "demo", [outside]),
        }
        assert found["held"] == 3

        await driver.send(CLOSE, {"id": first})
        await driver.advance(0)
        found = await status(driver, convoy_id)
        assert dispatch(found)[second] == (2, "hooked", None, [])
        assert dispatch(found)[third] == (3, "open", "demo", [second])

        await driver.send(CLOSE, {"id": outside, "reason": "won't do"})
        await driver.send(CLOSE, {"id": second})
        await driver.advance(0)
        found = await status(driver, convoy_id)
        assert {b["id"]: b["status"] for b in found["bead_details"]} == {
            first: "closed",
            second: "closed",
            third: "hooked",
            external: "hooked",
        }
        assert found["held"] == 0


class TestBadInput:
    @pytest.mark.parametrize(
        ("subject", "body", "expected"),
        [
            (NEW, {"beads": []}, "invalid"),
            (NEW, {"title": " ", "beads": []}, "invalid"),
            (NEW, {"title": "t", "beads": "hq-1"}, "invalid"),
            (NEW, {"title": "t", "beads": ["hq-none"]}, "not_found"),
            (NEW, {"title": "t", "beads": ["hq.1"]}, "invalid"),
            (NEW, {"title": "t", "owned": "yes"}, "invalid"),
            (ADD, {"id": "cv-none", "beads": ["{bead}"]}, "not_found"),
            (ADD, {"id": "{convoy}", "beads": []}, "invalid"),
            (ADD, {"id": "{convoy}", "beads": ["hq-none"]}, "not_found"),
            (LAND, {"id": "cv-none"}, "not_found"),
            (LAND, {}, "invalid"),
            ("gt.cmd.convoy.explode", {"id": "{convoy}"}, "unknown_command"),
        ],
    )
    async def test_bad_convoy_commands(self, driver: Driver, subject: str, body: dict[str, Any], expected: str) -> None:
        [bead_id] = await beads(driver, 1)
        convoy_id = await convoy(driver, [bead_id])
        swap = {"{bead}": bead_id, "{convoy}": convoy_id}
        fixed = {
            k: swap.get(v, v) if isinstance(v, str) else [swap.get(x, x) for x in v] if isinstance(v, list) else v
            for k, v in body.items()
        }
        assert await code(driver, subject, fixed) == expected

    async def test_unknown_convoy_query(self, driver: Driver) -> None:
        with pytest.raises(QueryError) as info:
            await driver.ask("convoy", id="cv-none")
        assert info.value.code == "not_found"


async def convoy_closed_events(driver: Driver, convoy_id: str) -> int:
    """How many ``convoy.closed`` events the log holds for the convoy."""
    if isinstance(driver, MemoryDriver):
        messages = [data for _, subject, data in driver.town.log.messages if subject == f"gt.evt.convoy.{convoy_id}"]
    else:
        assert isinstance(driver, NatsDriver)
        messages = [data for _, _, data in await read_all(driver.nc, "GT_EVT", f"gt.evt.convoy.{convoy_id}")]
    return sum(1 for data in messages if decode_envelope(data).type == "convoy.closed")


async def test_two_beads_closing_at_once_close_their_convoy_exactly_once(driver: Driver) -> None:
    for _ in range(5):
        ids = await beads(driver, 2)
        convoy_id = await convoy(driver, ids)
        await asyncio.gather(*(driver.send(CLOSE, {"id": bead_id}) for bead_id in ids))
        await driver.advance(0)
        await driver.advance(0)
        assert (await status(driver, convoy_id))["status"] == "closed"
        assert await convoy_closed_events(driver, convoy_id) == 1
