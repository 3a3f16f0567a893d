"""Mail (messages are beads of type message) and escalations, against the pure model and the real mayor."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import CommandError
from tests.drivers import Driver

SEND, READ, REPLY, ARCHIVE = (f"gt.cmd.mail.{v}" for v in ("send", "read", "reply", "archive"))
RAISE, ACK, CLOSE_ESC = "gt.cmd.escalation.raise", "gt.cmd.escalation.ack", "gt.cmd.escalation.close"
HOURS = 3600.0


async def code(driver: Driver, subject: str, body: dict[str, Any]) -> str:
    with pytest.raises(CommandError) as info:
        await driver.send(subject, body)
    return info.value.code


async def send(driver: Driver, to: str, body: str, *, actor: str = "operator:ann", **fields: Any) -> dict[str, Any]:
    return await driver.send(SEND, {"to": to, "body": body, **fields}, actor=actor)


class TestMail:
    async def test_a_sent_message_is_a_bead_in_the_recipients_inbox(self, driver: Driver) -> None:
        sent = await send(driver, "mayor", "Please look at hq-1\nIt broke overnight.", subject="Broken build")
        [message] = await driver.ask("inbox", to="mayor")
        assert message["id"] == sent["id"]
        assert (message["type"], message["title"], message["assignee"]) == ("message", "Broken build", "mayor")
        assert message["description"] == "Please look at hq-1\nIt broke overnight."
        assert message["metadata"]["from"] == "operator:ann"
        assert message["metadata"]["thread"] == sent["thread"] == sent["id"]
        assert await driver.ask("inbox", to="operator:ann") == []

    async def test_the_subject_defaults_to_the_first_line_of_the_body(self, driver: Driver) -> None:
        await send(driver, "mayor", "x" * 100 + "\nsecond line")
        [message] = await driver.ask("inbox", to="mayor")
        assert message["title"] == "x" * 80

    async def test_read_keeps_the_message_but_drops_it_from_the_unread_inbox(self, driver: Driver) -> None:
        message_id = (await send(driver, "mayor", "hello"))["id"]
        assert (await driver.send(READ, {"id": message_id}))["changed"] is True
        assert (await driver.send(READ, {"id": message_id}))["changed"] is False
        assert await driver.ask("inbox", to="mayor") == []
        [still_there] = await driver.ask("inbox", to="mayor", include_read=True)
        assert "read" in still_there["labels"]
        assert still_there["status"] == "open"

    async def test_reading_someone_elses_mail_leaves_it_unread_for_them(self, driver: Driver) -> None:
        message_id = (await send(driver, "operator:bob", "for bob only"))["id"]
        read = await driver.send(READ, {"id": message_id}, actor="operator:ann")
        assert (read["changed"], read["left_unread_for"]) == (False, "operator:bob")
        [unread] = await driver.ask("inbox", to="operator:bob")
        assert "read" not in unread["labels"]
        assert (await driver.send(READ, {"id": message_id}, actor="operator:bob"))["changed"] is True
        assert await driver.ask("inbox", to="operator:bob") == []

    async def test_reply_goes_to_the_sender_in_the_same_thread(self, driver: Driver) -> None:
        first = await send(driver, "mayor", "question", subject="Deploy?")
        reply = await driver.send(REPLY, {"id": first["id"], "body": "yes, after noon"}, actor="mayor")
        assert (reply["to"], reply["thread"]) == ("operator:ann", first["thread"])
        [answer] = await driver.ask("inbox", to="operator:ann")
        assert (answer["title"], answer["metadata"]["reply_to"]) == ("Re: Deploy?", first["id"])
        thread = await driver.ask("thread", thread=first["thread"])
        assert [m["id"] for m in thread] == [first["id"], reply["id"]]

    async def test_a_message_sent_into_an_existing_thread_joins_it(self, driver: Driver) -> None:
        first = await send(driver, "mayor", "one")
        await send(driver, "mayor", "two", thread=first["thread"])
        assert len(await driver.ask("thread", thread=first["thread"])) == 2

    async def test_archive_closes_it_and_archiving_again_changes_nothing(self, driver: Driver) -> None:
        message_id = (await send(driver, "mayor", "done with this"))["id"]
        assert (await driver.send(ARCHIVE, {"id": message_id}))["changed"] is True
        assert (await driver.send(ARCHIVE, {"id": message_id}))["changed"] is False
        assert await driver.ask("inbox", to="mayor", include_read=True) == []
        assert (await driver.ask("get", id=message_id))["close_reason"] == "archived"

    async def test_an_empty_inbox_is_empty(self, driver: Driver) -> None:
        assert await driver.ask("inbox", to="nobody") == []

    async def test_messages_are_not_work(self, driver: Driver) -> None:
        await send(driver, "mayor", "hi")
        assert await driver.ask("ready") == []

    @pytest.mark.parametrize(
        ("subject", "body", "expected"),
        [
            (SEND, {"to": "mayor"}, "invalid"),
            (SEND, {"to": "mayor", "body": " "}, "invalid"),
            (SEND, {"to": "", "body": "x"}, "invalid"),
            (SEND, {"to": "mayor", "body": "x", "thread": "bad thread"}, "invalid"),
            (SEND, {"to": "mayor", "body": "x", "priority": 9}, "invalid"),
            (READ, {"id": "hq-none"}, "not_found"),
            (READ, {"id": "{task}"}, "invalid"),  # not a message
            (REPLY, {"id": "{message}"}, "invalid"),
            (REPLY, {"id": "hq-none", "body": "x"}, "not_found"),
            (ARCHIVE, {"id": "{task}"}, "invalid"),
            (ARCHIVE, {"id": 7}, "invalid"),
        ],
    )
    async def test_bad_mail_commands(self, driver: Driver, subject: str, body: dict[str, Any], expected: str) -> None:
        task = (await driver.send("gt.cmd.bead.create", {"title": "a task"}))["id"]
        message = (await send(driver, "mayor", "hi"))["id"]
        fixed = {
            k: {"{task}": task, "{message}": message}.get(v, v) if isinstance(v, str) else v for k, v in body.items()
        }
        assert await code(driver, subject, fixed) == expected


class TestEscalations:
    async def test_raise_lists_the_most_severe_first(self, driver: Driver) -> None:
        low = await driver.send(RAISE, {"severity": "low", "message": "disk at 80%"})
        critical = await driver.send(RAISE, {"severity": "critical", "message": "main is red", "source": "refinery"})
        listed = await driver.ask("escalations")
        assert [e["id"] for e in listed] == [critical["id"], low["id"]]
        assert (listed[0]["source"], listed[1]["source"]) == ("refinery", "operator")

    async def test_ack_then_close(self, driver: Driver) -> None:
        raised = await driver.send(RAISE, {"severity": "high", "message": "stuck polecat"})
        acked = await driver.send(ACK, {"id": raised["id"]}, actor="operator:max")
        assert (acked["status"], acked["changed"]) == ("acked", True)
        assert (await driver.send(ACK, {"id": raised["id"]}))["changed"] is False
        [listed] = await driver.ask("escalations")
        assert (listed["status"], listed["acked_by"]) == ("acked", "operator:max")
        closed = await driver.send(CLOSE_ESC, {"id": raised["id"], "reason": "restarted"})
        assert closed["status"] == "closed"
        assert (await driver.send(CLOSE_ESC, {"id": raised["id"]}))["changed"] is False
        assert await driver.ask("escalations") == []
        assert await code(driver, ACK, {"id": raised["id"]}) == "backward_transition"

    async def test_an_unacknowledged_escalation_goes_up_a_severity_at_most_twice(self, driver: Driver) -> None:
        raised = await driver.send(RAISE, {"severity": "low", "message": "slow queue"})
        await driver.advance(3 * HOURS)
        assert [e["severity"] for e in await driver.ask("escalations")] == ["low"]
        await driver.advance(1.5 * HOURS)
        [once] = await driver.ask("escalations")
        assert (once["severity"], once["reescalations"], once["original_severity"]) == ("medium", 1, "low")
        await driver.advance(4.5 * HOURS)
        [twice] = await driver.ask("escalations")
        assert (twice["severity"], twice["reescalations"]) == ("high", 2)
        await driver.advance(48 * HOURS)
        [capped] = await driver.ask("escalations")
        assert (capped["severity"], capped["reescalations"]) == ("high", 2)
        assert capped["id"] == raised["id"]

    async def test_an_acknowledged_or_critical_escalation_stays_where_it_is(self, driver: Driver) -> None:
        acked = await driver.send(RAISE, {"severity": "medium", "message": "a"})
        await driver.send(ACK, {"id": acked["id"]})
        await driver.send(RAISE, {"severity": "critical", "message": "b"})
        await driver.advance(10 * HOURS)
        assert sorted((e["severity"], e["reescalations"]) for e in await driver.ask("escalations")) == [
            ("critical", 0),
            ("medium", 0),
        ]

    async def test_one_that_names_its_bead_as_what_resolves_it_closes_when_the_bead_closes(
        self, driver: Driver
    ) -> None:
        bead = (await driver.send("gt.cmd.bead.create", {"title": "flaky"}))["id"]
        resolving = await driver.send(
            RAISE, {"severity": "high", "message": "died 4 times", "bead": bead, "resolved_when": [f"bead:{bead}"]}
        )
        own = await driver.send(RAISE, {"severity": "medium", "message": "look at it", "bead": bead})
        await driver.send("gt.cmd.bead.close", {"id": bead, "reason": "fixed by hand"})
        await driver.advance(0)
        assert [e["id"] for e in await driver.ask("escalations")] == [own["id"]], "an operator's own stays open"
        closed = {e["id"]: e for e in await driver.ask("escalations", include_closed=True)}[resolving["id"]]
        assert (closed["status"], closed["closed_by"]) == ("closed", "mayor")
        assert closed["close_reason"] == f"resolved: bead {bead} closed: fixed by hand"
        await driver.advance(10 * HOURS)
        assert [(e["id"], e["reescalations"]) for e in await driver.ask("escalations")] == [(own["id"], 1)]

    async def test_an_escalation_about_a_bead(self, driver: Driver) -> None:
        bead = (await driver.send("gt.cmd.bead.create", {"title": "flaky"}))["id"]
        raised = await driver.send(RAISE, {"severity": "medium", "message": "flaky tests", "bead": bead})
        assert (await driver.ask("escalations"))[0]["bead"] == bead
        assert raised["severity"] == "medium"

    @pytest.mark.parametrize(
        ("subject", "body", "expected"),
        [
            (RAISE, {"severity": "urgent", "message": "x"}, "invalid"),
            (RAISE, {"severity": "low"}, "invalid"),
            (RAISE, {"severity": "low", "message": " "}, "invalid"),
            (RAISE, {"severity": "low", "message": "x", "bead": "hq-none"}, "not_found"),
            (RAISE, {"severity": 3, "message": "x"}, "invalid"),
            (RAISE, {"severity": "low", "message": "x", "resolved_when": ["ticket:T-1"]}, "invalid"),
            (RAISE, {"severity": "low", "message": "x", "resolved_when": "bead:hq-1"}, "invalid"),
            (ACK, {"id": "esc-none"}, "not_found"),
            (CLOSE_ESC, {"id": "esc-none"}, "not_found"),
            (CLOSE_ESC, {"id": "esc none"}, "invalid"),
        ],
    )
    async def test_bad_escalation_commands(
        self, driver: Driver, subject: str, body: dict[str, Any], expected: str
    ) -> None:
        assert await code(driver, subject, body) == expected
