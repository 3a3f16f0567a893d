"""Sling and molecules: hooking beads to rigs with cooked formulas, and checkpointing their steps.
Run against the pure model and against the real mayor."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import CommandError, QueryError
from tests.drivers import Driver, events_on

CREATE, CLOSE, CLAIM, SLING = "gt.cmd.bead.create", "gt.cmd.bead.close", "gt.cmd.bead.claim", "gt.cmd.bead.sling"
START, DONE = "gt.cmd.step.start", "gt.cmd.step.done"
POLECAT_STEPS = ["load-context", "implement", "commit", "self-review", "run-tests", "submit"]


async def bead(driver: Driver, title: str = "Fix the frobulator", **fields: Any) -> str:
    result = await driver.send(CREATE, {"title": title, **fields})
    bead_id: str = result["id"]
    return bead_id


async def code(driver: Driver, subject: str, body: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as info:
        await driver.send(subject, body)
    return info.value.code


async def slung(driver: Driver, **fields: Any) -> str:
    bead_id = await bead(driver)
    await driver.send(SLING, {"id": bead_id, "rig": "demo", **fields})
    return bead_id


class TestSling:
    async def test_sling_hooks_the_bead_attaches_polecat_work_and_an_auto_convoy(self, driver: Driver) -> None:
        bead_id = await bead(driver, "Fix the frobulator")
        result = await driver.send(SLING, {"id": bead_id, "rig": "demo"})
        assert (result["status"], result["rig"], result["formula"]) == ("hooked", "demo", "polecat-work")
        got = await driver.ask("get", id=bead_id)
        assert (got["status"], got["rig"], got["slings"]) == ("hooked", "demo", 1)
        assert got["convoys"] == [result["convoy"]]
        molecule = await driver.ask("molecule", bead=bead_id)
        assert [s["id"] for s in molecule["steps"]] == POLECAT_STEPS
        assert all(s["status"] == "pending" for s in molecule["steps"])
        assert molecule["steps"][0]["title"] == f"Load context for {bead_id}: Fix the frobulator"
        assert (molecule["current_step"], molecule["done"], molecule["total"]) == ("load-context", 0, 6)
        convoy = await driver.ask("convoy", id=result["convoy"])
        assert (convoy["title"], convoy["beads"], convoy["auto"], convoy["owned"]) == (
            "Work: Fix the frobulator",
            [bead_id],
            True,
            False,
        )

    async def test_sling_with_another_formula_and_vars(self, driver: Driver) -> None:
        bead_id = await bead(driver)
        result = await driver.send(
            SLING, {"id": bead_id, "rig": "demo", "formula": "code-review", "vars": {"change": "branch feat-x"}}
        )
        assert result["formula"] == "code-review"
        molecule = await driver.ask("molecule", bead=bead_id)
        assert molecule["steps"][0]["title"] == "Read branch feat-x"
        assert molecule["vars"] == {"change": "branch feat-x"}

    async def test_no_convoy_and_no_formula(self, driver: Driver) -> None:
        bead_id = await bead(driver)
        result = await driver.send(SLING, {"id": bead_id, "rig": "demo", "no_convoy": True, "no_formula": True})
        assert (result["convoy"], result["formula"]) == (None, None)
        assert (await driver.ask("get", id=bead_id))["convoys"] == []
        with pytest.raises(QueryError) as info:
            await driver.ask("molecule", bead=bead_id)
        assert info.value.code == "not_found"

    async def test_an_owned_auto_convoy(self, driver: Driver) -> None:
        bead_id = await bead(driver)
        convoy_id = (await driver.send(SLING, {"id": bead_id, "rig": "demo", "owned": True}))["convoy"]
        assert (await driver.ask("convoy", id=convoy_id))["owned"] is True

    async def test_slinging_a_closed_bead_is_a_backward_transition(self, driver: Driver) -> None:
        bead_id = await bead(driver)
        await driver.send(CLOSE, {"id": bead_id})
        assert await code(driver, SLING, {"id": bead_id, "rig": "demo"}) == "backward_transition"

    async def test_slinging_a_hooked_bead_again_is_a_conflict(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        assert await code(driver, SLING, {"id": bead_id, "rig": "other"}) == "conflict"
        assert (await driver.ask("get", id=bead_id))["rig"] == "demo"

    async def test_a_forced_re_sling_moves_the_hook_and_keeps_every_done_step(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        await driver.send(DONE, {"bead": bead_id, "step": "load-context"})
        await driver.send(START, {"bead": bead_id, "step": "implement"})
        await driver.send(CLAIM, {"id": bead_id, "assignee": "polecat:demo/ace"})
        result = await driver.send(SLING, {"id": bead_id, "rig": "demo", "force": True, "session": "demo-bob"})
        assert (result["status"], result["convoy"]) == ("in_progress", None)  # forward only: still in progress
        got = await driver.ask("get", id=bead_id)
        assert (got["hook_session"], got["slings"], got["status"], len(got["convoys"])) == (
            "demo-bob",
            2,
            "in_progress",
            1,
        )
        molecule = await driver.ask("molecule", bead=bead_id)
        assert [s["status"] for s in molecule["steps"][:2]] == ["done", "in_progress"]
        assert molecule["current_step"] == "implement"

    async def test_a_re_sling_cannot_swap_the_molecule(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        body = {"id": bead_id, "rig": "demo", "force": True, "formula": "code-review", "vars": {"change": "x"}}
        assert await code(driver, SLING, body) == "conflict"

    @pytest.mark.parametrize(
        ("body", "expected"),
        [
            ({"id": "hq-none", "rig": "demo"}, "not_found"),
            ({"rig": "demo"}, "invalid"),
            ({"id": "BAD ID", "rig": "demo"}, "invalid"),
            ({"id": "{bead}", "rig": "demo.x"}, "invalid"),
            ({"id": "{bead}", "rig": "demo", "formula": "no-such-formula"}, "invalid"),
            ({"id": "{bead}", "rig": "demo", "formula": "code-review"}, "invalid"),  # required var missing
            ({"id": "{bead}", "rig": "demo", "vars": {"colour": "red"}}, "invalid"),  # unknown var
            ({"id": "{bead}", "rig": "demo", "vars": {"bad name": "x"}}, "invalid"),
            ({"id": "{bead}", "rig": "demo", "no_formula": True, "formula": "polecat-work"}, "invalid"),
            ({"id": "{bead}", "rig": "demo", "force": "yes"}, "invalid"),
            ({"id": "{bead}", "rig": 5}, "invalid"),
        ],
    )
    async def test_bad_slings_are_rejected_with_the_right_code(
        self, driver: Driver, body: dict[str, Any], expected: str
    ) -> None:
        bead_id = await bead(driver)
        if body.get("id") == "{bead}":
            body = {**body, "id": bead_id}
        assert await code(driver, SLING, body) == expected
        assert (await driver.ask("get", id=bead_id))["status"] == "open"

    async def test_infrastructure_beads_are_not_slung(self, driver: Driver) -> None:
        message = await bead(driver, "a note", type="message")
        assert await code(driver, SLING, {"id": message, "rig": "demo"}) == "invalid"


class TestBlockers:
    """A bead is dispatched only once every bead it needs is closed (what `gt ready` says), unless forced."""

    async def test_a_bead_with_an_open_blocker_is_refused_naming_it_and_the_override(self, driver: Driver) -> None:
        blocker = await bead(driver, "Lay the foundation")
        hooked_blocker = await slung(driver)  # hooked is not closed: it still blocks
        blocked = await bead(driver, "Build the walls", needs=[blocker, hooked_blocker])
        with pytest.raises(CommandError) as info:
            await driver.send(SLING, {"id": blocked, "rig": "demo"})
        assert info.value.code == "blocked"
        assert f"{blocker} (open)" in str(info.value)
        assert f"{hooked_blocker} (hooked)" in str(info.value)
        assert "--force" in str(info.value)
        got = await driver.ask("get", id=blocked)
        assert (got["status"], got["rig"], got["slings"]) == ("open", None, 0)
        with pytest.raises(QueryError):
            await driver.ask("molecule", bead=blocked)

    async def test_once_every_blocker_is_closed_the_bead_is_slung_whatever_the_close_reason(
        self, driver: Driver
    ) -> None:
        merged, abandoned = await bead(driver), await bead(driver)
        blocked = await bead(driver, needs=[merged, abandoned])
        await driver.send(CLOSE, {"id": merged, "reason": "merged"})
        assert await code(driver, SLING, {"id": blocked, "rig": "demo"}) == "blocked"
        await driver.send(CLOSE, {"id": abandoned, "reason": "won't do"})  # closed is closed
        assert (await driver.send(SLING, {"id": blocked, "rig": "demo"}))["status"] == "hooked"

    async def test_force_slings_past_open_blockers_and_the_event_records_them(self, driver: Driver) -> None:
        blocker = await bead(driver)
        blocked = await bead(driver, needs=[blocker])
        result = await driver.send(SLING, {"id": blocked, "rig": "demo", "force": True})
        assert (result["status"], result["ignored_blockers"]) == ("hooked", [blocker])
        [slung_event] = [d for t, d in await events_on(driver, f"gt.evt.bead.{blocked}") if t == "bead.slung"]
        assert (slung_event["forced"], slung_event["ignored_blockers"]) == (True, [blocker])

    async def test_a_held_sling_waits_for_its_blockers_and_the_mayor_slings_it_once_they_close(
        self, driver: Driver
    ) -> None:
        blocker = await bead(driver)
        blocked = await bead(driver, needs=[blocker])
        held = await driver.send(SLING, {"id": blocked, "rig": "demo", "hold": True, "no_convoy": True})
        assert (held["status"], held["waiting_for"], held["formula"]) == ("held", [blocker], "polecat-work")
        again = await driver.send(SLING, {"id": blocked, "rig": "demo", "hold": True, "no_convoy": True})
        assert (again["status"], again["changed"]) == ("held", False)
        got = await driver.ask("get", id=blocked)
        assert (got["status"], got["hold"]["rig"], got["hold"]["blockers"]) == ("open", "demo", [blocker])
        assert [b["id"] for b in await driver.ask("ready")] == [blocker]
        await driver.advance(60)
        assert (await driver.ask("get", id=blocked))["status"] == "open"  # still waiting

        await driver.send(CLOSE, {"id": blocker})
        await driver.advance(0)
        got = await driver.ask("get", id=blocked)
        assert (got["status"], got["rig"], got["slings"], got.get("hold")) == ("hooked", "demo", 1, None)
        assert (await driver.ask("molecule", bead=blocked))["formula"] == "polecat-work"
        await driver.advance(60)
        slings = [d for t, d in await events_on(driver, f"gt.evt.bead.{blocked}") if t == "bead.slung"]
        assert len(slings) == 1
        assert (slings[0]["rig"], slings[0]["held_for"]) == ("demo", [blocker])

    async def test_unsling_of_a_held_bead_ends_its_hold_and_the_mayor_does_not_sling_it(self, driver: Driver) -> None:
        blocker = await bead(driver)
        blocked = await bead(driver, needs=[blocker])
        await driver.send(SLING, {"id": blocked, "rig": "demo", "hold": True, "no_convoy": True})
        released = await driver.send("gt.cmd.bead.unsling", {"id": blocked, "reason": "not this sprint"})
        assert (released["status"], released["changed"], released["was"]) == ("open", True, "held")
        assert (await driver.ask("get", id=blocked)).get("hold") is None
        await driver.send(CLOSE, {"id": blocker})
        await driver.advance(60)
        got = await driver.ask("get", id=blocked)
        assert (got["status"], got["slings"]) == ("open", 0), "its hold was given back: nobody slings it"
        assert await code(driver, "gt.cmd.bead.unsling", {"id": blocked}) == "conflict", "nothing left to give back"

    async def test_unsling_of_a_claimed_bead_clears_its_assignee(self, driver: Driver) -> None:
        claimed = await slung(driver)
        await driver.send(CLAIM, {"id": claimed, "assignee": "polecat:demo/bob"})
        assert (await driver.ask("get", id=claimed))["assignee"] == "polecat:demo/bob"
        released = await driver.send("gt.cmd.bead.unsling", {"id": claimed})
        assert (released["status"], released["was"]) == ("open", "in_progress")
        got = await driver.ask("get", id=claimed)
        assert (got["status"], got["rig"], got.get("assignee")) == ("open", None, None)
        # An assignee the operator gave a bead that was only hooked, never claimed, is theirs: it stays.
        assigned = await slung(driver)
        await driver.send("gt.cmd.bead.update", {"id": assigned, "assignee": "operator:ann"})
        await driver.send("gt.cmd.bead.unsling", {"id": assigned})
        assert (await driver.ask("get", id=assigned))["assignee"] == "operator:ann"

    async def test_a_held_bead_closed_or_slung_by_hand_is_no_longer_held(self, driver: Driver) -> None:
        blocker = await bead(driver)
        closed, forced = await bead(driver, needs=[blocker]), await bead(driver, needs=[blocker])
        for held in (closed, forced):
            await driver.send(SLING, {"id": held, "rig": "demo", "hold": True, "no_convoy": True})
        await driver.send(CLOSE, {"id": closed})
        await driver.send(SLING, {"id": forced, "rig": "web", "force": True})
        await driver.send(CLOSE, {"id": blocker})
        await driver.advance(0)
        assert (await driver.ask("get", id=closed))["status"] == "closed"
        got = await driver.ask("get", id=forced)
        assert (got["rig"], got["slings"], got.get("hold")) == ("web", 1, None)

    async def test_a_forced_re_sling_of_a_bead_forced_past_its_blocker_is_not_blocked(self, driver: Driver) -> None:
        blocker = await bead(driver)
        blocked = await bead(driver, needs=[blocker])
        await driver.send(SLING, {"id": blocked, "rig": "demo", "force": True})
        again = await driver.send(SLING, {"id": blocked, "rig": "demo", "force": True, "session": "demo-bob"})
        assert (again["status"], again.get("ignored_blockers", [])) == ("hooked", [])


class TestSteps:
    async def test_steps_move_forward_and_the_current_step_follows(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        started = await driver.send(START, {"bead": bead_id, "step": "load-context"})
        assert (started["status"], started["changed"]) == ("in_progress", True)
        done = await driver.send(DONE, {"bead": bead_id, "step": "load-context"})
        assert (done["status"], done["done"], done["total"], done["complete"]) == ("done", 1, 6, False)
        molecule = await driver.ask("molecule", bead=bead_id)
        assert molecule["current_step"] == "implement"
        assert molecule["steps"][0]["done_at"]

    async def test_a_step_may_be_done_without_being_started(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        assert (await driver.send(DONE, {"bead": bead_id, "step": "load-context"}))["changed"] is True

    async def test_completing_a_done_step_again_is_an_accepted_no_op(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        await driver.send(DONE, {"bead": bead_id, "step": "load-context"})
        again = await driver.send(DONE, {"bead": bead_id, "step": "load-context"})
        assert (again["status"], again["changed"]) == ("done", False)

    async def test_starting_a_started_step_is_a_no_op_and_a_done_step_is_never_redone(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        await driver.send(START, {"bead": bead_id, "step": "load-context"})
        assert (await driver.send(START, {"bead": bead_id, "step": "load-context"}))["changed"] is False
        await driver.send(DONE, {"bead": bead_id, "step": "load-context"})
        assert await code(driver, START, {"bead": bead_id, "step": "load-context"}) == "backward_transition"
        molecule = await driver.ask("molecule", bead=bead_id)
        assert molecule["steps"][0]["status"] == "done"

    async def test_a_step_whose_needs_are_not_done_is_refused(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        assert await code(driver, START, {"bead": bead_id, "step": "implement"}) == "invalid"
        assert await code(driver, DONE, {"bead": bead_id, "step": "submit"}) == "invalid"

    async def test_the_molecule_completes_when_every_step_is_done(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        for step in POLECAT_STEPS:
            result = await driver.send(DONE, {"bead": bead_id, "step": step})
        assert (result["done"], result["complete"]) == (6, True)
        molecule = await driver.ask("molecule", bead=bead_id)
        assert (molecule["complete"], molecule["current_step"]) == (True, None)
        assert molecule["completed_at"]

    async def test_steps_of_a_closed_bead_are_frozen(self, driver: Driver) -> None:
        bead_id = await slung(driver)
        await driver.send(CLOSE, {"id": bead_id})
        assert await code(driver, DONE, {"bead": bead_id, "step": "load-context"}) == "conflict"

    @pytest.mark.parametrize(
        ("subject", "body", "expected"),
        [
            (DONE, {"bead": "hq-none", "step": "x"}, "not_found"),
            (DONE, {"bead": "{bead}", "step": "no-such-step"}, "not_found"),
            (DONE, {"bead": "{plain}", "step": "x"}, "not_found"),  # a bead without a molecule
            (DONE, {"bead": "{bead}"}, "invalid"),
            (DONE, {"bead": "{bead}", "step": 3}, "invalid"),
            (START, {"bead": "{bead}", "step": "Load Context"}, "invalid"),
            (START, {"bead": "{bead}", "step": "load-context", "extra": 1}, "invalid"),
            ("gt.cmd.step.skip", {"bead": "{bead}", "step": "load-context"}, "unknown_command"),
        ],
    )
    async def test_bad_step_commands_are_rejected_with_the_right_code(
        self, driver: Driver, subject: str, body: dict[str, Any], expected: str
    ) -> None:
        bead_id = await slung(driver)
        plain = await bead(driver, "no molecule")
        body = {
            k: {"{bead}": bead_id, "{plain}": plain}.get(v, v) if isinstance(v, str) else v for k, v in body.items()
        }
        assert await code(driver, subject, body) == expected
