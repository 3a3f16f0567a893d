"""The intake's pure parts, each on its own: the actor names of the model, the rate-limit admission step and the
failure counting that sets a command aside."""

from __future__ import annotations

from typing import Any, cast

from shared.bus.connection import Connection
from shared.core.errors import CommandError
from shared.model.commands import BeadCreate
from shared.model.commands.actors import is_service, may_act_for, reserved, sub_actors_of
from shared.service.intake import Delivery
from shared.service.intake.poison import Poison
from shared.service.intake.rate_limit import ClassLimits, Limit, RateLimiter, RateSettings, admit

MAX = 1024 * 1024


def delivery(subject: str = "gt.cmd.bead.create", body: bytes = b'{"title": "t"}', *, delivered: int = 1) -> Delivery:
    return Delivery(subject=subject, body=body, headers=None, stream_seq=7, delivered=delivered, max_bytes=MAX)


def fetched(delivered: int) -> Delivery:
    """A delivery the consumer handed over (it carries a message to ack), delivered ``delivered`` times."""
    out = delivery(delivered=delivered)
    out.msg = cast(Any, object())
    out.held = False
    return out


def test_the_services_and_their_scopes_are_services_and_nothing_else_is() -> None:
    assert all(is_service(name) for name in ("mayor", "witness", "refinery", "deacon", "witness-east"))
    assert not any(is_service(name) for name in ("witness-", "operator", "mayor-east", "polecat:demo/ace"))


def test_only_the_deacon_acts_for_someone_else_and_only_for_its_automations() -> None:
    assert may_act_for("deacon", "automation:nightly")
    assert not may_act_for("deacon", "automation:")
    assert not may_act_for("deacon", "operator")
    assert not may_act_for("witness-east", "automation:nightly")
    assert sub_actors_of("deacon") == ("automation:",)
    assert sub_actors_of("witness-east") == ()


def test_names_kept_for_services_automations_and_polecats_are_reserved_in_any_case() -> None:
    assert reserved(" Mayor ") == "a service's name"
    assert reserved("witness-east") == "a service's name"
    assert reserved("AUTOMATION:x") is not None
    assert reserved("polecat:demo/ace") is not None
    assert reserved("operator:ann") is None
    assert reserved("plugin:metrics") is None, "a plugin's label is an operator's (held to an agent's limits)"


def test_admission_charges_a_fetched_command_and_refuses_it_over_the_limit() -> None:
    limiter = RateLimiter(RateSettings(operator=ClassLimits(commands=Limit(rate=1, burst=1))))
    cmd = BeadCreate(title="t")
    first = fetched(1)
    assert admit(limiter, first, cmd, 0.0) is cmd
    refused = admit(limiter, fetched(1), cmd, 0.0)
    assert isinstance(refused, CommandError)
    assert refused.code == "rate_limited"
    assert admit(limiter, fetched(1), cmd, 0.0) is None, "past the refusals' own bucket: dropped"
    assert admit(None, fetched(1), cmd, 0.0) is cmd, "no limiter: nothing charged"


def test_a_command_a_dead_predecessor_held_is_not_charged_again() -> None:
    limiter = RateLimiter(RateSettings(operator=ClassLimits(commands=Limit(rate=1, burst=1))))
    cmd = BeadCreate(title="t")
    held = delivery()
    assert held.held
    assert [admit(limiter, held, cmd, 0.0) for _ in range(3)] == [cmd, cmd, cmd]


def poison(*, counts_deliveries: bool = True) -> Poison:
    return Poison(
        service="mayor",
        identity="mayor",
        nc=cast(Connection, None),
        stream="GT_CMD",
        evt_stream="GT_EVT",
        max_failures=3,
        counts_deliveries=counts_deliveries,
    )


def test_earlier_deliveries_count_as_crashes_unless_the_server_failed_them() -> None:
    tracker = poison()
    redelivered = fetched(4)
    assert tracker.crashes(redelivered) == 3
    tracker.count_infra_failure(redelivered)
    tracker.count_infra_failure(redelivered)
    assert tracker.crashes(redelivered) == 1
    tracker.forget(redelivered)
    assert tracker.crashes(redelivered) == 3


def test_deliveries_count_for_nothing_where_instances_pass_commands_around_or_no_consumer_delivered() -> None:
    assert poison(counts_deliveries=False).crashes(fetched(9)) == 0
    assert poison().crashes(delivery(delivered=9)) == 0, "read from the stream: its deliveries are unknown"


def test_a_set_aside_rejection_says_why_and_is_counted() -> None:
    tracker = poison()
    refusal = tracker.set_aside_error("it failed 3 times")
    assert refusal.code == "set_aside"
    assert "the mayor set this command aside: it failed 3 times" in refusal.message
    assert tracker.set_aside == 1
