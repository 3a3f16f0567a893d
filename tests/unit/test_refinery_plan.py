"""The refinery's pure parts: queue order, claims and leases, batches, and the merge request commands.

States are built by folding real events through the refinery projection, and commands go through its decide
function, as the service does; the clock is the test's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import msgspec
import pytest

from services.refinery import plan
from services.refinery.decide import decide, legacy_mr_id, mr_id_for
from services.refinery.projection import new_projection
from services.refinery.settings import load
from services.refinery.state import MergeRequest, RefineryState
from shared.model.events import (
    BeadClosed,
    BeadCreated,
    BeadSlung,
    CommandAccepted,
    ConvoyCreated,
    LeaseAcquired,
    MergeRequestClaimed,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestSubmitted,
    RigAdded,
    SessionRequested,
)
from tests.memory_log import MemoryTown

POLICY = plan.Policy(lease_s=900)


class Queue(MemoryTown[RefineryState]):
    def __init__(self) -> None:
        super().__init__(new_projection(), decide, service="refinery")

    def rig(self, name: str = "demo") -> None:
        self.add(RigAdded(rig=name, repo=f"/repos/{name}.git", prefix=name[:2], agent_command="gt-agent"))

    def submit(self, bead: str, rig: str = "demo", *, priority: int = 2, head: str = "", target: str = "") -> str:
        if bead not in self.state.beads:
            self.add(BeadCreated(bead_id=bead, title=f"work on {bead}", priority=priority))
            self.add(BeadSlung(bead_id=bead, rig=rig))
        body: dict[str, Any] = {
            "bead": bead,
            "rig": rig,
            "branch": f"polecat/x/{bead}",
            "head": head or (bead.encode().hex() * 40)[:40],
            "priority": priority,
        }
        if target:
            body["target"] = target
        result = self.send("gt.cmd.mr.submit", body)
        return str(result["id"])

    def claim(self, mr_id: str, *, lease_s: float = 900, batch: list[str] | None = None) -> None:
        mr = self.state.mrs[mr_id]
        until = self.clock + timedelta(seconds=lease_s)
        self.add(
            MergeRequestClaimed(
                mr_id=mr_id, attempt=mr.attempts + 1, holder="r-1", lease_until=until, batch=batch or []
            )
        )

    def fail(self, mr_id: str) -> None:
        self.add(MergeRequestFailed(mr_id=mr_id, gate="test", exit_code=1, tail="boom"))

    def next(self, policy: plan.Policy = POLICY, busy: frozenset[str] = frozenset()) -> list[str]:
        return [mr.id for mr in plan.next_per_rig(self.state, self.clock, policy, busy)]

    def mr(self, mr_id: str) -> MergeRequest:
        return self.state.mrs[mr_id]


@pytest.fixture
def q() -> Queue:
    queue = Queue()
    queue.rig()
    return queue


# ---- order ---------------------------------------------------------------------------------------


def test_a_higher_priority_goes_first_and_equal_ones_by_age(q: Queue) -> None:
    low = q.submit("de-low", priority=3)
    q.tick(60)
    older = q.submit("de-older")
    q.tick(60)
    newer = q.submit("de-newer")
    q.tick(60)
    urgent = q.submit("de-urgent", priority=0)
    ranked = sorted(q.state.mrs.values(), key=lambda m: plan.score(q.state, m, q.clock, POLICY), reverse=True)
    assert [m.id for m in ranked] == [urgent, older, newer, low]
    assert q.next() == [urgent]


def test_failures_cost_50_each_up_to_300_and_an_old_convoy_raises_its_beads(q: Queue) -> None:
    mr = q.submit("de-a")
    base = plan.score(q.state, q.mr(mr), q.clock, POLICY)
    for n in range(1, 9):
        q.submit("de-a", head=f"{n:040d}")
        failed = mr_id_for("demo", "de-a", f"{n:040d}")
        q.fail(failed)
        penalty = base - plan.score(q.state, q.mr(mr), q.clock, POLICY)
        assert penalty == pytest.approx(min(50 * n, 300))
    fresh = q.submit("de-b")
    q.add(ConvoyCreated(convoy_id="cv-1", title="old convoy", beads=["de-b"]))
    q.tick(3600 * 5)
    # 5 hours queued (+5) and a convoy 5 hours old (+50), against a bead with no convoy.
    other = q.submit("de-c")
    gap = plan.score(q.state, q.mr(fresh), q.clock, POLICY) - plan.score(q.state, q.mr(other), q.clock, POLICY)
    assert gap == pytest.approx(55, abs=0.01)


def test_fifo_orders_by_queue_time_alone(q: Queue) -> None:
    first = q.submit("de-first", priority=4)
    q.tick(1)
    q.submit("de-second", priority=0)
    assert q.next(plan.Policy(fifo=True)) == [first]


# ---- claims ---------------------------------------------------------------------------------------


def test_a_claim_of_a_former_refinery_instance_is_claimable_at_once_by_the_active_one(q: Queue) -> None:
    a = q.submit("de-a")
    q.claim(a, lease_s=900)  # by r-1, which died: its claim would last 15 minutes
    b = q.submit("de-b")
    assert [m.id for m in plan.next_per_rig(q.state, q.clock, POLICY, frozenset(), "r-1")] == [], "r-1's own claim"
    assert q.next() == [], "without knowing who asks, the claim holds until its lease runs out"
    # The refinery asking now is another instance: only the active one acts, so r-1 stopped acting. It resumes
    # the queue where r-1 was: the merge request r-1 held first (its attempt costs it nothing here).
    ready = plan.ready_per_rig(q.state, q.clock, POLICY, frozenset(), "r-2")["demo"]
    assert [m.id for m in ready] == [a, b]
    assert [m.id for m in plan.next_batches(q.state, q.clock, plan.Policy(batch=4), frozenset(), "r-2").batches[0]] == [
        a,
        b,
    ]


def test_one_merge_request_per_rig_at_a_time_until_its_lease_runs_out(q: Queue) -> None:
    q.rig("other")
    a = q.submit("de-a")
    c = q.submit("ot-c", rig="other")
    assert q.next() == [a, c]
    q.claim(a, lease_s=60)
    b = q.submit("de-b")
    assert q.next() == [c], "the claimed rig waits while the lease lives"
    assert q.next(busy=frozenset({"other"})) == []
    q.tick(61)
    # An expired claim is claimable again (its holder crashed), before the others: the queue resumes where it was.
    assert q.next() == [a, c]
    assert [m.id for m in plan.ready_per_rig(q.state, q.clock, POLICY, frozenset())["demo"]] == [a, b]
    q.add(MergeRequestMerged(mr_id=b, merged_commit="f" * 40, target_before="e" * 40))
    assert q.next() == [a, c]


def test_a_closed_bead_or_an_unknown_rig_is_never_processed(q: Queue) -> None:
    a = q.submit("de-a")
    q.add(BeadClosed(bead_id="de-a", reason="done by hand"))
    assert q.next() == []
    assert [m.id for m in plan.stale(q.state)] == [a]


def test_merged_with_an_open_bead_is_owed_a_close_and_a_closed_conflict_bead_unblocks(q: Queue) -> None:
    a = q.submit("de-a")
    b = q.submit("de-b")
    q.claim(a)
    q.add(MergeRequestMerged(mr_id=a, merged_commit="f" * 40, target_before="e" * 40))
    assert [m.id for m in plan.beads_to_close(q.state)] == [a]
    q.claim(b)
    q.add(MergeRequestConflicted(mr_id=b, target_commit="e" * 40, conflict_command="conflict-b-1"))
    assert q.mr(b).status == "blocked"
    assert q.mr(b).blocked_by is None
    assert plan.unblocked(q.state) == []
    q.add(BeadCreated(bead_id="de-fix", title="Resolve merge conflicts", priority=1))
    q.add(CommandAccepted(command_id="conflict-b-1", command="bead.create", result={"id": "de-fix"}))
    assert q.mr(b).blocked_by == "de-fix"
    assert plan.unblocked(q.state) == []
    q.add(BeadClosed(bead_id="de-fix", reason="resolved"))
    assert [m.id for m in plan.unblocked(q.state)] == [b]


def test_a_conflict_goes_back_to_the_agent_until_the_cap_then_to_the_operator(q: Queue) -> None:
    policy = plan.Policy(lease_s=900, max_conflict_returns=2)
    heads = [str(n) * 40 for n in range(1, 4)]
    for n, head in enumerate(heads):  # three merge requests of one bead, each conflicting
        mr_id = q.submit("de-a", head=head)
        q.claim(mr_id)
        assert plan.send_conflict_back(q.state, q.mr(mr_id), policy) is False, "submitted by hand: no agent"
        with_session = msgspec.structs.replace(q.mr(mr_id), session="de-a-1")
        assert plan.send_conflict_back(q.state, with_session, policy) is (n < 2)
        q.add(MergeRequestConflicted(mr_id=mr_id, target_commit="e" * 40, conflict_command="", sent_back=n < 2))
        if n < 2:
            assert q.mr(mr_id).status == "conflicted"  # finished: the resolved branch comes as a new one
            assert q.mr(mr_id).ended_at is not None
        else:
            assert q.mr(mr_id).status == "blocked"
    assert q.state.beads["de-a"].conflicts_sent_back == 2
    assert plan.unblocked(q.state) == []


# ---- batches --------------------------------------------------------------------------------------


def test_a_batch_takes_up_to_k_best_first_and_only_one_target(q: Queue) -> None:
    ids = [q.submit(f"de-{n}") for n in range(5)]
    q.tick(1)
    urgent = q.submit("de-urgent", priority=0)
    release = q.submit("de-release", target="release")
    planned = plan.next_batches(q.state, q.clock, plan.Policy(batch=4), frozenset())
    assert [[m.id for m in b] for b in planned.batches] == [[urgent, *ids[:3]]]
    assert release not in [m.id for b in planned.batches for m in b]
    assert planned.wake_at is None


def test_a_short_batch_waits_for_more_until_its_oldest_waited_long_enough(q: Queue) -> None:
    policy = plan.Policy(batch=3, batch_wait_s=30)
    a = q.submit("de-a")
    q.tick(10)
    b = q.submit("de-b")
    planned = plan.next_batches(q.state, q.clock, policy, frozenset())
    assert planned.batches == []
    assert planned.wake_at == q.mr(a).queued_at + timedelta(seconds=30)
    q.tick(20)
    planned = plan.next_batches(q.state, q.clock, policy, frozenset())
    assert [[m.id for m in batch] for batch in planned.batches] == [[a, b]]
    c = q.submit("de-c")
    d = q.submit("de-d")
    q.claim(a, batch=[a, b])
    q.claim(b, batch=[a, b])
    assert q.mr(a).batch == [a, b]
    assert plan.next_batches(q.state, q.clock, policy, frozenset()).batches == [], "the rig is busy"
    q.add(MergeRequestMerged(mr_id=a, merged_commit="f" * 40, target_before="e" * 40, batch=[a, b]))
    q.add(MergeRequestMerged(mr_id=b, merged_commit="f" * 40, target_before="e" * 40, batch=[a, b]))
    e = q.submit("de-e")
    full = plan.next_batches(q.state, q.clock, policy, frozenset())
    assert [[m.id for m in batch] for batch in full.batches] == [[c, d, e]], "a full batch goes at once"


# ---- commands -------------------------------------------------------------------------------------


def test_the_same_commit_submitted_twice_is_one_merge_request_and_bad_submits_are_refused(q: Queue) -> None:
    first = q.submit("de-a")
    again = q.send(
        "gt.cmd.mr.submit", {"bead": "de-a", "rig": "demo", "branch": "polecat/x/de-a", "head": q.mr(first).head}
    )
    assert (again["id"], again["changed"]) == (first, False)
    assert q.reject_code("gt.cmd.mr.submit", {"bead": "de-a", "rig": "nope", "branch": "b", "head": "a" * 40}) == (
        "not_found"
    )
    assert q.reject_code("gt.cmd.mr.submit", {"bead": "de-zz", "rig": "demo", "branch": "b", "head": "a" * 40}) == (
        "not_found"
    )
    q.rig("other")
    assert q.reject_code("gt.cmd.mr.submit", {"bead": "de-a", "rig": "other", "branch": "b", "head": "b" * 40}) == (
        "invalid"
    )
    q.add(BeadClosed(bead_id="de-a", reason="gone"))
    assert q.reject_code("gt.cmd.mr.submit", {"bead": "de-a", "rig": "demo", "branch": "b", "head": "c" * 40}) == (
        "backward_transition"
    )


def test_two_beads_with_the_same_head_get_a_merge_request_each_the_later_waiting_for_the_earlier(q: Queue) -> None:
    head = "ab" * 20
    a = q.submit("de-a", head=head)
    q.tick(1)
    b = q.submit("de-b", head=head)
    assert a != b, "a merge request belongs to its bead"
    assert (q.mr(a).bead, q.mr(b).bead) == ("de-a", "de-b")
    again = q.send("gt.cmd.mr.submit", {"bead": "de-b", "rig": "demo", "branch": "polecat/x/de-b", "head": head})
    assert (again["id"], again["changed"]) == (b, False), "the same bead and head stay one merge request"
    other = q.submit("de-c")
    assert plan.waiting_behind(q.state) == {b: q.mr(a)}
    assert [m.id for m in plan.ready_per_rig(q.state, q.clock, POLICY, frozenset())["demo"]] == [a, other]
    batch = plan.next_batches(q.state, q.clock, plan.Policy(batch=4), frozenset())
    assert [[m.id for m in found] for found in batch.batches] == [[a, other]], "never in the same batch"
    q.claim(a)
    assert plan.waiting_behind(q.state) == {b: q.mr(a)}, "it waits while the earlier one is processed"
    q.add(MergeRequestMerged(mr_id=a, merged_commit="f" * 40, target_before="e" * 40))
    assert plan.waiting_behind(q.state) == {}
    assert [m.id for m in plan.ready_per_rig(q.state, q.clock, POLICY, frozenset())["demo"]] == [b, other]
    q.claim(b)
    q.add(MergeRequestMerged(mr_id=b, merged_commit="f" * 40, target_before="f" * 40, already=True))
    assert plan.close_reason(q.state, q.mr(a)) == f"merged in {a}"
    assert plan.close_reason(q.state, q.mr(b)) == (
        f"merged in {b}: its work was already on main; commit {head[:10]} landed with {a} (bead de-a)"
    )


def test_the_earlier_one_failing_or_its_bead_closing_lets_the_later_one_be_processed_on_its_own(q: Queue) -> None:
    head = "cd" * 20
    a = q.submit("de-a", head=head)
    q.tick(1)
    b = q.submit("de-b", head=head)
    q.claim(a)
    q.fail(a)
    assert q.next() == [b], "gated on its own: it merges or goes back to its own polecat"
    c = q.submit("de-c", head="ef" * 20)
    q.tick(1)
    d = q.submit("de-d", head="ef" * 20)
    q.add(BeadClosed(bead_id="de-c", reason="done by hand"))
    assert d not in plan.waiting_behind(q.state), "a stale one is rejected, not waited for"
    assert c in [m.id for m in plan.stale(q.state)]


def test_a_head_already_on_the_target_closes_its_bead_saying_so(q: Queue) -> None:
    a = q.submit("de-a")
    q.claim(a)
    q.add(MergeRequestMerged(mr_id=a, merged_commit="e" * 40, target_before="e" * 40, already=True))
    assert [m.id for m in plan.beads_to_close(q.state)] == [a]
    assert plan.close_reason(q.state, q.mr(a)) == f"merged in {a}: its work was already on main"


def test_a_merge_request_keyed_the_old_way_still_folds_and_answers_its_own_beads_resubmission(q: Queue) -> None:
    head = "12" * 20
    q.add(BeadCreated(bead_id="de-a", title="old"), BeadSlung(bead_id="de-a", rig="demo"))
    q.add(BeadCreated(bead_id="de-b", title="old too"), BeadSlung(bead_id="de-b", rig="demo"))
    old = legacy_mr_id("demo", head)
    q.add(MergeRequestSubmitted(mr_id=old, bead="de-a", rig="demo", branch="polecat/x/de-a", target="main", head=head))
    assert q.mr(old).bead == "de-a"
    body = {"rig": "demo", "branch": "polecat/x/b", "head": head}
    same = q.send("gt.cmd.mr.submit", {**body, "bead": "de-a"})
    assert (same["id"], same["changed"]) == (old, False)
    other = q.send("gt.cmd.mr.submit", {**body, "bead": "de-b"})
    assert other["changed"] is True
    assert other["id"] == mr_id_for("demo", "de-b", head) != old
    assert q.mr(other["id"]).bead == "de-b"


def resubmission_by_a_fresh_session(q: Queue, mr: str) -> dict[str, Any]:
    """A fresh session of bead de-a, holding its hook lease, about to submit the commit of merge request ``mr``
    again (as `gt done` does): the body of its ``mr.done``."""
    session = SessionRequested(
        session_id="de-a-2", rig="demo", polecat="x", bead="de-a", worktree="/w/x", branch="polecat/x/de-a",
        tmux_name="gt-demo-x", attempt=2,
    )  # fmt: skip
    q.add(session, LeaseAcquired(lease="hook-de-a", holder="de-a-2", token=2, ttl_s=600, expires_at=q.clock))
    return {
        "bead": "de-a", "rig": "demo", "branch": "polecat/x/de-a", "head": q.mr(mr).head, "session": "de-a-2",
        "fence": {"lease": "hook-de-a", "token": 2}, "bundle": "/gt/published/de-a-2/x.bundle",
    }  # fmt: skip


def test_a_bead_resubmitting_the_commit_that_failed_puts_its_merge_request_back_and_failures_add_up(
    q: Queue,
) -> None:
    a = q.submit("de-a")
    body = resubmission_by_a_fresh_session(q, a)
    q.claim(a)
    q.fail(a)
    assert plan.failures_of(q.state, "de-a") == 1
    again = q.send("gt.cmd.mr.submit", body)
    assert (again["id"], again["status"], again["changed"]) == (a, "queued", True)
    assert q.mr(a).reason == "resubmitted unchanged by session de-a-2 after its test gate failed"
    assert q.next() == [a]
    assert q.send("gt.cmd.mr.submit", body)["changed"] is False, "queued already"
    q.claim(a)
    q.fail(a)
    assert (q.mr(a).failures, plan.failures_of(q.state, "de-a")) == (2, 2), "each failed gate run counts"
    q.claim(a)
    q.add(MergeRequestFailed(mr_id=a, gate="test", exit_code=1, escalated=True))
    escalated = q.send("gt.cmd.mr.submit", body)
    assert (escalated["id"], escalated["status"], escalated["changed"]) == (a, "escalated", False), (
        "an escalated one waits for a person"
    )


def test_retry_puts_failed_blocked_and_rejected_back_and_refuses_merged(q: Queue) -> None:
    a = q.submit("de-a")
    assert q.send("gt.cmd.mr.retry", {"id": a}) == {"id": a, "status": "queued", "changed": False}
    q.claim(a)
    q.fail(a)
    before = q.mr(a).queued_at
    q.tick(5)
    assert q.send("gt.cmd.mr.retry", {"id": a})["changed"] is True
    assert (q.mr(a).status, q.mr(a).reason) == ("queued", "retried after failed")
    assert q.mr(a).queued_at > before, "it queues again from now"
    q.send("gt.cmd.mr.reject", {"id": a, "reason": "not wanted"})
    assert q.send("gt.cmd.mr.retry", {"id": a})["status"] == "queued"
    q.claim(a)
    q.add(MergeRequestMerged(mr_id=a, merged_commit="f" * 40, target_before="e" * 40))
    assert q.reject_code("gt.cmd.mr.retry", {"id": a}) == "backward_transition"
    assert q.reject_code("gt.cmd.mr.retry", {"id": "mr-nosuch"}) == "not_found"


def test_reject_takes_a_waiting_one_out_and_refuses_one_being_processed_or_merged(q: Queue) -> None:
    a = q.submit("de-a")
    b = q.submit("de-b")
    q.claim(b)
    assert q.reject_code("gt.cmd.mr.reject", {"id": b}) == "conflict"
    assert q.send("gt.cmd.mr.reject", {"id": a, "reason": "wrong approach"})["changed"] is True
    assert (q.mr(a).status, q.mr(a).reason) == ("rejected", "wrong approach")
    assert q.send("gt.cmd.mr.reject", {"id": a})["changed"] is False
    assert q.next() == []
    q.add(MergeRequestMerged(mr_id=b, merged_commit="f" * 40, target_before="e" * 40))
    assert q.reject_code("gt.cmd.mr.reject", {"id": b}) == "backward_transition"
    assert q.reject_code("gt.cmd.mr.reject", {"id": "mr-nosuch"}) == "not_found"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GT_MQ_BATCH": "0"}, "GT_MQ_BATCH must be a whole number of at least 1, got '0'"),
        ({"GT_MQ_BATCH": "two"}, "GT_MQ_BATCH must be a whole number"),
        ({"GT_MQ_BATCH_WAIT": "-1"}, "GT_MQ_BATCH_WAIT must be a number of at least 0"),
        ({"GT_MQ_ORDER": "random"}, "GT_MQ_ORDER must be score or fifo"),
        ({"GT_MQ_MAX_FAILURES": "1.5"}, "GT_MQ_MAX_FAILURES must be a whole number"),
    ],
)
def test_settings_that_cannot_work_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load(env)
    assert load({"GT_MQ_BATCH": "8", "GT_MQ_BATCH_WAIT": "2.5"}).batch == 8


def test_time_only_comes_from_the_caller(q: Queue) -> None:
    a = q.submit("de-a")
    later: datetime = q.clock + timedelta(hours=2)
    assert plan.score(q.state, q.mr(a), later, POLICY) - plan.score(q.state, q.mr(a), q.clock, POLICY) == (
        pytest.approx(2)
    )


def test_a_bead_resubmitting_the_commit_whose_conflict_was_sent_back_puts_its_merge_request_back(q: Queue) -> None:
    """The agent a conflict went back to ran `gt done` without resolving it (same head): its merge request goes
    back into the queue (it conflicts again and counts towards the cap), never left finished with the bead
    hooked and nothing queued."""
    a = q.submit("de-a")
    body = resubmission_by_a_fresh_session(q, a)
    q.claim(a)
    q.add(
        MergeRequestConflicted(mr_id=a, target_commit="e" * 40, conflict_command="", files=["calc.py"], sent_back=True)
    )
    assert q.mr(a).status == "conflicted"
    again = q.send("gt.cmd.mr.submit", body)
    assert (again["id"], again["status"], again["changed"]) == (a, "queued", True)
    assert q.mr(a).reason == "resubmitted unchanged by session de-a-2 after its merge conflicted"
    assert q.next() == [a]


# ---- the rig's queue paused and resumed ------------------------------------------------------------------


def _pause(q: Queue, mr_id: str, cause: str = "push_refused") -> None:
    event = plan.pause(q.state, "demo", cause, "main is checked out in /src/demo", mr_id, "git said no")
    assert event is not None
    q.add(event.payload)


def test_a_paused_queue_takes_nothing_until_one_resume_and_pauses_once() -> None:
    q = Queue()
    q.rig()
    q.rig("other")
    a, b = q.submit("de-a"), q.submit("de-b")
    c = q.submit("ot-c", rig="other")
    _pause(q, a)
    assert plan.pause(q.state, "demo", "push_refused", "again", b, "") is None, "paused already: one pause"
    assert q.next() == [c], "a paused rig's queue waits; the other rig goes on"
    assert [m.rig for m in plan.paused_queues(q.state)] == ["demo"]
    assert q.state.queues["demo"].pauses == 1
    assert q.send("gt.cmd.mq.resume", {"rig": "demo"})["changed"] is True
    assert q.next() == [a, c]
    assert q.send("gt.cmd.mq.resume", {"rig": "demo"})["changed"] is False, "not paused: nothing to resume"
    assert q.reject_code("gt.cmd.mq.resume", {"rig": "nowhere"}) == "not_found"
    assert q.reject_code("gt.cmd.mq.resume", {"rig": "Not A Rig!"}) == "invalid"
    assert b in q.state.mrs


def _target_failure(commit: str = "c" * 40) -> plan.TargetFailure:
    return plan.TargetFailure(gate="test", command="false", target="main", commit=commit, exit_code=1, tail="boom")


def test_a_gate_failing_on_the_target_twice_in_a_row_pauses_the_queue(q: Queue) -> None:
    a = q.submit("de-a")
    first = plan.target_failed(q.state, "demo", a, _target_failure(), POLICY)
    assert first is not None
    assert first.payload.TYPE == "mq.target_failed", "the first failure on the target is recorded, not a pause"
    q.add(first.payload)
    assert q.next() == [a], "the queue goes on after the first"
    second = plan.target_failed(q.state, "demo", a, _target_failure(), POLICY)
    assert second is not None
    assert second.payload.TYPE == "mq.paused"
    q.add(second.payload)
    queue = q.state.queues["demo"]
    assert (queue.paused, queue.cause) == (True, "gate_broken")
    assert "gt rig update demo --test" in queue.reason
    # How to resume is the views' and the escalation's to say (a reason that said it too printed it twice).
    assert "gt mq resume demo" in plan.escalation(q.state, queue).message
    assert q.next() == []
    q.send("gt.cmd.mq.resume", {"rig": "demo"})
    assert q.state.queues["demo"].target_failures == 0, "a resume starts the count again"


def test_a_merge_between_two_failures_on_the_target_breaks_the_row(q: Queue) -> None:
    a, b = q.submit("de-a"), q.submit("de-b")
    first = plan.target_failed(q.state, "demo", a, _target_failure(), POLICY)
    assert first is not None
    q.add(first.payload)
    q.add(MergeRequestMerged(mr_id=b, merged_commit="f" * 40, target_before="e" * 40))
    again = plan.target_failed(q.state, "demo", a, _target_failure(), POLICY)
    assert again is not None
    assert again.payload.TYPE == "mq.target_failed", "not in a row: a merge came between"
