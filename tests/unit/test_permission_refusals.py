"""Reading the server's permission refusals: which subject, which operation, spelled as sent."""

from __future__ import annotations

from shared.bus.permissions import PermissionWatch, parse_violation, restore_case
from shared.core.errors import PermissionDeniedError


def test_a_refused_publish_names_subject_user_and_operation() -> None:
    # As nats-py hands it to the error callback: the server's -ERR, lowercased.
    denied = parse_violation('nats: permissions violation for publish to "gt.evt.bead.hq-1a2b3c"', "operator")
    assert denied is not None
    assert (denied.subject, denied.user, denied.operation) == ("gt.evt.bead.hq-1a2b3c", "operator", "publish")
    assert str(denied) == "permission denied: NATS user operator may not publish to gt.evt.bead.hq-1a2b3c"


def test_refused_subscriptions_and_reply_subjects_are_read_too() -> None:
    sub = parse_violation('nats: permissions violation for subscription to "gt.q.mayor.>"', "agent")
    assert sub is not None
    assert (sub.subject, sub.operation) == ("gt.q.mayor.>", "subscribe")
    reply = parse_violation('nats: permissions violation for publish with reply of "_inbox.x.1"', "agent")
    assert reply is not None
    assert (reply.subject, reply.operation) == ("_inbox.x.1", "publish")


def test_other_errors_are_not_refusals() -> None:
    assert parse_violation("nats: 'stale connection'", "mayor") is None
    assert parse_violation("nats: maximum payload exceeded", "mayor") is None


def test_jetstream_subjects_get_their_capitals_back() -> None:
    assert restore_case("$js.api.stream.delete.gt_evt") == "$JS.API.STREAM.DELETE.GT_EVT"
    assert restore_case("$js.api.consumer.delete.gt_cmd.mayor-cmd") == "$JS.API.CONSUMER.DELETE.GT_CMD.mayor-cmd"
    assert restore_case("$kv.gt_leases.hook-hq-1a2b3c") == "$KV.GT_LEASES.hook-hq-1a2b3c"
    assert restore_case("$js.api.direct.get.kv_gt_plugins") == "$JS.API.DIRECT.GET.KV_GT_PLUGINS"
    assert restore_case("gt.cmd.rig.add") == "gt.cmd.rig.add"


def test_a_watch_finds_refusals_after_a_mark_by_subject_in_the_callers_spelling() -> None:
    watch = PermissionWatch("plugin")
    assert watch.record(RuntimeError("nats: 'stale connection'")) is None
    assert watch.record(RuntimeError('nats: permissions violation for publish to "gt.evt.x"')) is not None
    mark = len(watch.denied)
    assert watch.since(mark) is None
    watch.record(RuntimeError('nats: permissions violation for publish to "$js.api.stream.purge.gt_cmd"'))
    assert watch.since(0, "gt.cmd.bead.create") is None
    found = watch.since(mark, "$JS.API.STREAM.PURGE.GT_CMD")
    assert isinstance(found, PermissionDeniedError)
    assert (found.subject, found.user) == ("$JS.API.STREAM.PURGE.GT_CMD", "plugin")
    first = watch.since(0)
    assert first is not None
    assert first.subject == "gt.evt.x"
