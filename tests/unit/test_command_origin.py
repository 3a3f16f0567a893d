"""Who a command is from is decided by the subject it came on, never by its body (issue 20, point 4). Pure.

A polecat session's subject names its polecat; a service's subject (``gt.cmd.<aggregate>.<verb>.svc.<service>``)
names the service, whose body may name only what it acts for (the deacon's ``automation:<name>``); a plain subject
is an operator's, whose body may label the operator but never take a service's or an agent's name. The rate
limiter charges the class the subject says."""

from __future__ import annotations

import pytest

from shared.core import ids
from shared.core.errors import CommandError
from shared.core.subjects import ServiceOrigin, SessionOrigin
from shared.service.intake import Delivery, Sender, command_actor
from shared.service.intake.rate_limit import ClassLimits, Limit, RateLimiter, RateSettings

ACE = SessionOrigin("demo", "ace", "hq-a-1")
MAX = 1024 * 1024


def refused(out: Sender | CommandError) -> CommandError:
    assert isinstance(out, CommandError), out
    assert out.code == "unauthorized", out
    return out


@pytest.mark.parametrize("label", ["operator", "operator:ann", "supervisor", "chaos", "ann@example.com", "ops-bot"])
def test_a_plain_subject_is_an_operators_whose_body_labels_it(label: str) -> None:
    assert command_actor(label, None) == Sender(label, "operator")


def test_a_plugins_label_is_an_operators_held_to_an_agents_limits() -> None:
    """A plugin with a user that may send commands labels itself; its label is no identity (anyone who may publish
    the plain subjects may write it), and it only makes the sender more limited, never exempt."""
    assert command_actor("plugin:notifier", None) == Sender("plugin:notifier", "agent")


@pytest.mark.parametrize(
    ("label", "reserved_for"),
    [
        ("mayor", "a service's name"),
        ("Mayor", "a service's name"),
        (" mayor ", "a service's name"),
        ("witness", "a service's name"),
        ("witness-east", "a service's name"),
        ("refinery", "a service's name"),
        ("deacon", "a service's name"),
        ("polecat:demo/ace", "a polecat's name"),
        ("Polecat:demo/ace", "a polecat's name"),
        ("automation:nightly", "an automation's name"),
    ],
)
def test_a_plain_subject_may_not_name_a_service_or_an_agent(label: str, reserved_for: str) -> None:
    out = refused(command_actor(label, None))
    assert reserved_for in out.message
    assert "decided by the subject" in out.message, "the message says how the actor is decided"
    assert ".svc.<service>" in out.message


def test_a_session_subject_is_its_polecats_whatever_the_body_says() -> None:
    for body_actor in (None, "mayor", "operator:ann", "polecat:demo/bob", "automation:x"):
        assert command_actor(body_actor, ACE) == Sender("polecat:demo/ace", "agent")


def test_a_service_subject_is_the_services() -> None:
    for service in ("mayor", "witness", "witness-east", "witness-_3fa9", "refinery", "deacon"):
        assert command_actor(None, ServiceOrigin(service)) == Sender(service, "service")
        assert command_actor(service, ServiceOrigin(service)) == Sender(service, "service")


def test_only_the_deacon_names_a_sub_actor_its_automations() -> None:
    deacon = ServiceOrigin("deacon")
    assert command_actor("automation:nightly", deacon) == Sender("automation:nightly", "service")
    refused(command_actor("automation:", deacon))  # an automation has a name
    for other in ("mayor", "operator", "operator:ann", "polecat:demo/ace", "refinery"):
        out = refused(command_actor(other, deacon))
        assert "automation:<name>" in out.message
    for service in ("refinery", "witness", "mayor"):
        out = refused(command_actor("automation:nightly", ServiceOrigin(service)))
        assert "nobody else" in out.message
        refused(command_actor("mayor" if service != "mayor" else "deacon", ServiceOrigin(service)))


@pytest.mark.parametrize("token", ["bob", "operator", "witness-", "mayor-2", "supervisor", "automation:x"])
def test_a_service_subject_of_no_service_is_refused(token: str) -> None:
    assert "no service of the town" in refused(command_actor(None, ServiceOrigin(token))).message


def test_before_the_cutover_a_plain_subject_is_read_as_it_was_sent() -> None:
    """Commands stored before a town's upgrade (a service's own, sent on the plain subject then) keep their
    body's actor, so an upgrade refuses none of them."""
    assert command_actor("refinery", None, before_cutover=True) == Sender("refinery", "service")
    assert command_actor("automation:nightly", None, before_cutover=True) == Sender("automation:nightly", "service")
    assert command_actor("polecat:demo/ace", None, before_cutover=True) == Sender("polecat:demo/ace", "agent")
    assert command_actor(None, None, before_cutover=True) == Sender("operator", "operator")
    assert command_actor("mayor", ACE, before_cutover=True) == Sender("polecat:demo/ace", "agent")


def delivery(subject: str, body: bytes, *, seq: int = 10, origin_from: int = 1) -> Delivery:
    return Delivery(
        subject=subject, body=body, headers=None, stream_seq=seq, delivered=1, max_bytes=MAX, origin_from=origin_from
    )


def test_a_delivery_names_its_sender_from_its_subject() -> None:
    forged = delivery("gt.cmd.bead.create", b'{"title": "t", "actor": "mayor"}')
    assert forged.refusal is not None
    assert forged.refusal.code == "unauthorized"
    assert (forged.actor, forged.actor_class) == ("operator", "operator"), "charged as an operator"
    assert forged.command_subject == "gt.cmd.bead.create"

    stored_before = delivery("gt.cmd.bead.create", b'{"title": "t", "actor": "mayor"}', seq=10, origin_from=11)
    assert stored_before.refusal is None
    assert (stored_before.actor, stored_before.actor_class) == ("mayor", "service")

    labelled = delivery("gt.cmd.bead.create", b'{"title": "t", "actor": "operator:ann"}')
    assert (labelled.refusal, labelled.actor, labelled.actor_class) == (None, "operator:ann", "operator")

    by_service = delivery("gt.cmd.bead.close.svc.refinery", b'{"id": "hq-1"}')
    assert (by_service.refusal, by_service.actor, by_service.actor_class) == (None, "refinery", "service")
    assert (by_service.command_subject, by_service.name) == ("gt.cmd.bead.close", "bead.close")

    automation = delivery("gt.cmd.bead.create.svc.deacon", b'{"title": "t", "actor": "automation:nightly"}')
    assert (automation.refusal, automation.actor, automation.actor_class) == (None, "automation:nightly", "service")

    by_session = delivery("gt.cmd.mail.send.demo.ace.hq-a-1", b'{"to": "mayor", "body": "b", "actor": "deacon"}')
    assert (by_session.refusal, by_session.actor, by_session.actor_class) == (None, "polecat:demo/ace", "agent")


def test_the_limiter_charges_the_class_the_subject_says_not_the_name() -> None:
    small = RateSettings(
        agent=ClassLimits(commands=Limit(rate=1, burst=2)), operator=ClassLimits(commands=Limit(rate=1, burst=3))
    )
    limiter = RateLimiter(small)
    # An operator's command naming a service (refused, charged as the operator) or labelled like one: limited.
    assert [limiter.check("mayor", 10, 0.0, cls="operator").admit for _ in range(4)] == [True, True, True, False]
    assert [limiter.check("operator:ann", 10, 0.0, cls="operator").admit for _ in range(4)] == [True, True, True, False]
    # The same names on a service's subject: not limited.
    assert all(limiter.check("mayor", 10, 0.0, cls="service").admit for _ in range(100))
    assert all(limiter.check("automation:nightly", 10, 0.0, cls="service").admit for _ in range(100))
    # A session: its polecat's agent limits.
    assert [limiter.check("polecat:demo/ace", 10, 0.0, cls="agent").admit for _ in range(3)] == [True, True, False]


def test_a_sessions_command_is_settled_under_its_own_namespace() -> None:
    """Whatever id a session chooses, its command's outcome is in the session's namespace: never the id of a
    service's (``close-<mr>``), the operator's or another session's command."""
    body = b'{"to": "operator", "subject": "s", "body": "b", "cmd_id": "close-mr-abc"}'
    squat = delivery("gt.cmd.mail.send.demo.p1.s-1", body)
    assert squat.command_id == "s-1~close-mr-abc"
    from_header = Delivery(
        subject="gt.cmd.mail.send.demo.p1.s-1",
        body=body,
        headers={"Nats-Msg-Id": "finish-s-2"},
        stream_seq=3,
        delivered=1,
        max_bytes=MAX,
    )
    assert from_header.command_id == "s-1~finish-s-2"
    assert delivery("gt.cmd.bead.close.svc.refinery", body).command_id == "close-mr-abc"
    assert delivery("gt.cmd.mail.send", body).command_id == "close-mr-abc"
    # No id anyone chooses is a scoped one: an id with the separator becomes a digest.
    chosen = delivery("gt.cmd.mail.send", b'{"cmd_id": "s-1~close-mr-abc"}')
    assert chosen.command_id != "s-1~close-mr-abc"
    assert ids.SESSION_SCOPE not in chosen.command_id
