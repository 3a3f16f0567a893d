"""What a merge request's outcome settles (``services/refinery/plan/settle.py``): the events, the follow-up
commands and their order, one test per kind of outcome; the order the settler carries them out in; and what every
reconcile owes besides (``plan/owed.py``, ``plan/pauses.py``, the claims of ``plan/queue.py``).

States are built by folding real events through the refinery projection (``Queue``, as in
``test_refinery_plan.py``); a settlement's events are folded back to check where they leave the merge request.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from gt.cli.merge_queue import paused_lines
from services.refinery import plan
from services.refinery.effects import merger
from services.refinery.effects.settling import Settler
from services.refinery.plan import refusals
from shared.bus.commands import StoredCommand
from shared.model import events as ev
from shared.model.commands import BeadClose, BeadCreate, Command, EscalationRaise
from shared.model.decision import NewEvent
from shared.model.queries.refinery import PausedQueue
from tests.unit.test_refinery_plan import Queue

POLICY = plan.Policy(lease_s=900, max_failures=3, max_conflict_returns=1, push_retries=2, push_backoff_s=2.0)
RESULT = plan.BatchResult(gates_run=3, gate_seconds=1.23456)
TEST_FAILED = plan.GateResult(gate="test", exit_code=1, seconds=0.5, tail="1 failed", log_path="/logs/test.log")
GIT_SAID = plan.GateResult(gate="push", exit_code=1, seconds=0.1, tail="remote: no", log_path="")


@pytest.fixture
def q() -> Queue:
    queue = Queue()
    queue.rig()
    return queue


def claimed(q: Queue, bead: str, head: str = "") -> str:
    mr_id = q.submit(bead, head=head)
    q.claim(mr_id)
    return mr_id


def settle(q: Queue, mr_id: str, outcome: plan.Outcome, result: plan.BatchResult = RESULT) -> plan.Settlement:
    return plan.settle(q.state, q.mr(mr_id), outcome, result, POLICY, q.clock)


def fold(q: Queue, settlement: plan.Settlement) -> None:
    for new in settlement.events:
        q.add(new.payload)


def events(settlement: plan.Settlement) -> list[str]:
    return [new.payload.TYPE for new in settlement.events]


# ---- merged --------------------------------------------------------------------------------------------------


def test_a_merge_is_recorded_then_its_bead_closed_then_its_branch_deleted(q: Queue) -> None:
    a = claimed(q, "de-a")
    version = q.mr(a).version
    outcome = plan.Outcome(kind="merged", target_before="e" * 40, merged_commit="f" * 40)
    settled = settle(q, a, outcome, msgspec.structs.replace(RESULT, merged=[a]))
    [new] = settled.events
    assert new.expected_seq == version, "it expects the merge request as it was claimed"
    assert new.payload == ev.MergeRequestMerged(
        mr_id=a, merged_commit="f" * 40, target_before="e" * 40, gates_run=3, gate_seconds=1.235, batch=[]
    )
    assert settled.commands == [], "nothing is sent before the merge is in the log"
    assert settled.close == BeadClose(id="de-a", reason=f"merged in {a}", cmd_id=f"close-{a}")
    assert (settled.delete_branch, settled.publish_branch, settled.counted) == (True, False, "merged")
    assert [line.event for line in settled.logs] == ["mr_merged"]
    fold(q, settled)
    assert q.mr(a).status == "merged"
    assert plan.beads_to_close(q.state) == [q.mr(a)], "until the close lands, every reconcile owes it"
    assert plan.bead_close(q.state, q.mr(a)) == settled.close, "and owes the same command, under the same id"


def test_a_batch_records_what_landed_together(q: Queue) -> None:
    a, b = claimed(q, "de-a"), claimed(q, "de-b")
    outcome = plan.Outcome(kind="merged", target_before="e" * 40, merged_commit="f" * 40)
    settled = settle(q, b, outcome, msgspec.structs.replace(RESULT, merged=[a, b]))
    payload = settled.events[0].payload
    assert isinstance(payload, ev.MergeRequestMerged)
    assert payload.batch == [a, b]


def test_work_already_on_the_target_closes_its_bead_naming_the_merge_that_landed_it(q: Queue) -> None:
    head = "ab" * 20
    a = claimed(q, "de-a", head=head)
    q.add(ev.MergeRequestMerged(mr_id=a, merged_commit=head, target_before="e" * 40))
    b = claimed(q, "de-b", head=head)
    settled = settle(q, b, plan.Outcome(kind="already_merged", target_before=head, merged_commit=head))
    payload = settled.events[0].payload
    assert isinstance(payload, ev.MergeRequestMerged)
    assert payload.already is True
    assert settled.close is not None
    assert settled.close.reason == (
        f"merged in {b}: its work was already on main; commit {head[:10]} landed with {a} (bead de-a)"
    ), "the close says so before the event is folded"
    fold(q, settled)
    assert plan.close_reason(q.state, q.mr(b)) == settled.close.reason, "and the same as a reconcile would"


# ---- conflicts -----------------------------------------------------------------------------------------------


def test_a_conflict_of_an_agents_merge_request_goes_back_to_it(q: Queue) -> None:
    a = claimed(q, "de-a")
    mr = msgspec.structs.replace(q.mr(a), session="de-a-1")
    outcome = plan.Outcome(kind="conflict", target_before="e" * 40, files=["calc.py"])
    settled = plan.settle(q.state, mr, outcome, RESULT, POLICY, q.clock)
    assert settled.commands == [], "no conflict bead: the witness gives the bead a fresh session"
    assert settled.events[0].payload == ev.MergeRequestConflicted(
        mr_id=a, target_commit="e" * 40, conflict_command="", files=["calc.py"], sent_back=True
    )
    assert (settled.publish_branch, settled.counted, settled.close) == (False, "conflicted", None)
    fold(q, settled)
    assert q.mr(a).status == "conflicted"
    again = claimed(q, "de-a", head="12" * 20)
    mr = msgspec.structs.replace(q.mr(again), session="de-a-2")
    settled = plan.settle(q.state, mr, outcome, RESULT, POLICY, q.clock)
    assert len(settled.commands) == 1, "max_conflict_returns (1) went back already: now a person resolves it"


def test_a_conflict_nobody_can_send_back_gets_a_conflict_bead_first_and_names_the_id_it_settled_under(
    q: Queue,
) -> None:
    a = claimed(q, "de-a")
    mr = msgspec.structs.replace(q.mr(a), bundle="/gt/rigs/demo/published/de-a-1/x.bundle")
    outcome = plan.Outcome(kind="conflict", target_before="e" * 40, files=["calc.py", "README"])
    settled = plan.settle(q.state, mr, outcome, RESULT, POLICY, q.clock)
    [create] = settled.commands
    assert isinstance(create, BeadCreate)
    assert create.cmd_id == f"conflict-{a}-1"
    assert (create.title, create.priority, create.labels, create.prefix) == (
        "Resolve merge conflicts: work on de-a", 1, ["merge-conflict"], "de",
    )  # fmt: skip
    assert "Conflicting files: calc.py, README" in create.description
    assert create.metadata == {"mr": a, "bead": "de-a", "head": q.mr(a).head, "target_commit": "e" * 40}
    assert settled.publish_branch is True, "a bundle's branch is published for the person who resolves it"
    crews = msgspec.structs.replace(mr, branch="crew/ann", bundle="/gt/rigs/demo/published/crew-ann/x.bundle")
    kept = plan.settle(q.state, crews, outcome, RESULT, POLICY, q.clock).publish_branch
    assert kept is False, "a crew member's conflict is resolved in its workspace: origin gets no crew/ann"
    payload = settled.events[0].payload
    assert isinstance(payload, ev.MergeRequestConflicted)
    assert (payload.conflict_command, payload.sent_back) == (f"conflict-{a}-1", False)
    # Some other sender took the id first: the event names the one the conflict bead is settled under.
    renamed = settled.sent_under(f"conflict-{a}-1", f"conflict-{a}-1~2")
    assert [new.payload for new in renamed] == [msgspec.structs.replace(payload, conflict_command=f"conflict-{a}-1~2")]
    assert renamed[0].expected_seq == settled.events[0].expected_seq
    q.add(renamed[0].payload)
    q.add(ev.BeadCreated(bead_id="de-fix", title="Resolve merge conflicts", priority=1))
    q.add(ev.CommandAccepted(command_id=f"conflict-{a}-1~2", command="bead.create", result={"id": "de-fix"}))
    assert (q.mr(a).status, q.mr(a).blocked_by) == ("blocked", "de-fix")
    q.add(ev.BeadClosed(bead_id="de-fix", reason="resolved"))
    [requeue] = plan.reconciled(q.state)
    assert requeue.payload == ev.MergeRequestRequeued(mr_id=a, reason="conflict bead de-fix closed")


# ---- gates that failed ---------------------------------------------------------------------------------------


def test_a_failed_gate_goes_back_to_the_polecat_until_the_bead_failed_max_failures_times(q: Queue) -> None:
    for n in range(1, 4):
        mr_id = claimed(q, "de-a", head=f"{n:040d}")
        settled = settle(q, mr_id, plan.Outcome(kind="failed", failure=TEST_FAILED))
        payload = settled.events[0].payload
        assert isinstance(payload, ev.MergeRequestFailed)
        assert (payload.gate, payload.exit_code, payload.tail) == ("test", 1, "1 failed")
        assert settled.counted == "failed"
        if n < 3:
            assert (payload.escalated, settled.commands) == (False, [])
        else:
            [escalation] = settled.commands
            assert isinstance(escalation, EscalationRaise)
            assert escalation.cmd_id == f"esc-{mr_id}"
            assert escalation.message.startswith(
                "bead de-a failed its test gate 3 times in the merge queue of rig demo"
            )
            assert escalation.resolved_when == [f"mr:{mr_id}", "bead:de-a"]
            assert payload.escalated is True
        fold(q, settled)
    assert plan.failures_of(q.state, "de-a") == 3


def test_a_branch_that_is_gone_fails_like_a_gate(q: Queue) -> None:
    a = claimed(q, "de-a")
    gone = plan.GateResult(gate="fetch", exit_code=128, seconds=0.0, tail="no such branch", log_path="")
    settled = settle(q, a, plan.Outcome(kind="branch_missing", failure=gone))
    assert events(settled) == ["mr.failed"]
    fold(q, settled)
    assert (q.mr(a).status, q.mr(a).gate) == ("failed", "fetch")


# ---- back into the queue -------------------------------------------------------------------------------------


def test_a_deferred_one_or_one_whose_gate_fails_on_the_target_too_goes_back_with_its_retries_carried(
    q: Queue,
) -> None:
    a = claimed(q, "de-a")
    q.add(ev.MergeRequestRequeued(mr_id=a, reason="moved", retries=1))
    q.claim(a)
    deferred = settle(q, a, plan.Outcome(kind="deferred", reason="waits for its batch's culprit"))
    assert [new.payload for new in deferred.events] == [
        ev.MergeRequestRequeued(mr_id=a, reason="waits for its batch's culprit", retries=1)
    ]
    on_target = settle(q, a, plan.Outcome(kind="target_failed", failure=TEST_FAILED))
    assert [new.payload for new in on_target.events] == [
        ev.MergeRequestRequeued(mr_id=a, reason="its test gate fails on main too: not its failure", retries=1)
    ]
    assert (on_target.commands, on_target.counted) == ([], None), "nobody is blamed"


def test_a_gate_failing_on_the_target_is_recorded_the_first_time_and_pauses_the_queue_the_second(q: Queue) -> None:
    a = claimed(q, "de-a")
    failed = plan.TargetFailed(TEST_FAILED, "pytest -q", "c" * 40)
    first = plan.target_failing(q.state, q.mr(a), failed, POLICY)
    assert first is not None
    assert events(first) == ["mq.target_failed"]
    assert first.logs[0].fields["recorded"] == ev.MergeQueueTargetFailed.TYPE
    fold(q, first)
    second = plan.target_failing(q.state, q.mr(a), failed, POLICY)
    assert second is not None
    assert events(second) == ["mq.paused"]
    fold(q, second)
    assert q.state.queues["demo"].cause == "gate_broken"
    paused = q.state.queues["demo"]
    assert "the test gate ('pytest -q') fails on main itself, 2 times in a row" in paused.reason
    # The trial: "then `gt mq resume mi` (`gt mq resume mi` once fixed)". A view adds the hint, once.
    shown = paused_lines([PausedQueue(rig="demo", cause=paused.cause, reason=paused.reason, mr_id=a)])
    assert shown[0].count("gt mq resume demo") == 1, shown


# ---- pushes refused ------------------------------------------------------------------------------------------


def refused(refusal: str, tail: str = "remote: no") -> plan.Outcome:
    return plan.Outcome(kind="push_refused", failure=msgspec.structs.replace(GIT_SAID, tail=tail), refusal=refusal)


def test_a_push_the_target_refuses_pauses_the_rigs_queue_once_with_the_merge_request_back_in_it(q: Queue) -> None:
    a, b = claimed(q, "de-a"), claimed(q, "de-b")
    settled = settle(q, a, refused(refusals.CHECKED_OUT, tail="refusing to update checked out branch"))
    assert events(settled) == ["mq.paused", "mr.requeued"], "the pause first, then the merge request back"
    assert settled.events[0].expected_seq == 0, "the rig's queue had no event yet"
    pause = settled.events[0].payload
    assert isinstance(pause, ev.MergeQueuePaused)
    assert (pause.cause, pause.mr_id, pause.detail) == ("push_refused", a, "refusing to update checked out branch")
    assert "main is the branch checked out in /repos/demo.git" in pause.reason
    requeue = settled.events[1].payload
    assert isinstance(requeue, ev.MergeRequestRequeued)
    assert requeue.reason.startswith("the queue of rig demo is paused: main is the branch checked out")
    assert [line.event for line in settled.logs] == ["merge_queue_paused"]
    fold(q, settled)
    again = settle(q, b, refused(refusals.DENIED))
    assert events(again) == ["mr.requeued"], "paused already: one pause, one escalation"
    assert again.logs == []
    [queue] = plan.paused_queues(q.state)
    escalation = plan.escalation(q.state, queue)
    assert escalation.cmd_id == "esc-mq-demo-1"
    assert escalation.resolved_when == [f"mr:{a}", "bead:de-a"]
    assert "1 merge request(s) wait" in escalation.message, "b is still claimed here"


def test_a_target_that_moved_is_tried_again_after_a_backoff_then_failed_and_escalated(q: Queue) -> None:
    a = claimed(q, "de-a")
    waits = []
    for _ in range(POLICY.push_retries):
        settled = settle(q, a, refused(refusals.MOVED))
        [new] = settled.events
        assert isinstance(new.payload, ev.MergeRequestRequeued)
        assert new.payload.reason == "the target moved during the merge"
        assert new.payload.not_before is not None
        waits.append((new.payload.retries, new.payload.not_before - q.clock))
        assert (settled.commands, settled.counted) == ([], None)
        fold(q, settled)
        q.claim(a)
    assert waits == [(1, timedelta(seconds=2)), (2, timedelta(seconds=4))]
    given_up = settle(q, a, refused(refusals.MOVED))
    [escalation] = given_up.commands
    assert isinstance(escalation, EscalationRaise)
    assert escalation.cmd_id == f"esc-push-{a}-3", "named after the attempt: a later one escalates again"
    assert "main moved under every attempt (someone else keeps pushing to it); given up after 3 attempts" in (
        escalation.message
    )
    assert "git said:\nremote: no\n" in escalation.message
    assert events(given_up) == ["mr.failed"]
    assert given_up.counted == "failed"
    fold(q, given_up)
    assert q.mr(a).status == "escalated"


def test_an_unreachable_repository_says_what_git_said_in_the_requeue(q: Queue) -> None:
    a = claimed(q, "de-a")
    settled = settle(q, a, refused(refusals.UNREACHABLE, tail="ssh: connect to host: timed out"))
    payload = settled.events[0].payload
    assert isinstance(payload, ev.MergeRequestRequeued)
    assert payload.reason == "the repository could not be reached: ssh: connect to host: timed out"


def test_a_push_a_hook_refuses_fails_and_escalates_at_once(q: Queue) -> None:
    a = claimed(q, "de-a")
    settled = settle(q, a, refused(refusals.REFUSED, tail="remote: pre-receive hook declined"))
    [escalation] = settled.commands
    assert isinstance(escalation, EscalationRaise)
    assert escalation.cmd_id == f"esc-push-{a}-1"
    assert escalation.message.startswith(
        f"merge request {a} (bead de-a) of rig demo was not merged into main: the repository /repos/demo.git "
        "refused the push (a hook"
    )
    assert [(new.payload.TYPE, getattr(new.payload, "escalated", None)) for new in settled.events] == [
        ("mr.failed", True)
    ]
    assert [line.event for line in settled.logs] == ["mr_escalated"]


# ---- a batch whose processing failed -------------------------------------------------------------------------


def test_a_failed_processing_requeues_only_what_this_refinery_still_holds(q: Queue) -> None:
    a = claimed(q, "de-a")  # claimed by r-1
    b = q.submit("de-b")
    assert plan.processing_failed(q.state, a, "r-2", "boom", POLICY, q.clock) is None, "not ours"
    assert plan.processing_failed(q.state, b, "r-1", "boom", POLICY, q.clock) is None, "not claimed"
    assert plan.processing_failed(q.state, "mr-nosuch", "r-1", "boom", POLICY, q.clock) is None
    settled = plan.processing_failed(q.state, a, "r-1", "git died", POLICY, q.clock)
    assert settled is not None
    payload = settled.events[0].payload
    assert isinstance(payload, ev.MergeRequestRequeued)
    assert (payload.reason, payload.retries) == ("error: git died", 1)


# ---- what every reconcile owes -------------------------------------------------------------------------------


def test_a_queued_merge_request_whose_bead_closed_is_rejected_as_stale(q: Queue) -> None:
    a = q.submit("de-a")
    q.submit("de-b")
    q.add(ev.BeadClosed(bead_id="de-a", reason="done by hand"))
    [owed] = plan.reconciled(q.state)
    assert owed.payload == ev.MergeRequestRejected(mr_id=a, reason="its bead was closed")
    assert owed.expected_seq == q.mr(a).version


def test_a_batch_is_claimed_for_as_many_leases_as_bisecting_it_may_take(q: Queue) -> None:
    ids = [q.submit(f"de-{n}") for n in range(4)]
    one = plan.claims([q.mr(ids[0])], q.clock, POLICY, "r-9")
    [claim] = [new.payload for new in one]
    assert isinstance(claim, ev.MergeRequestClaimed)
    assert (claim.holder, claim.attempt, claim.batch) == ("r-9", 1, [])
    assert claim.lease_until == q.clock + timedelta(seconds=900)
    four = plan.claims([q.mr(i) for i in ids], q.clock, POLICY, "r-9")
    assert [new.expected_seq for new in four] == [q.mr(i).version for i in ids]
    payloads = [new.payload for new in four]
    assert all(isinstance(p, ev.MergeRequestClaimed) and p.batch == ids for p in payloads)
    assert all(
        p.lease_until == q.clock + timedelta(seconds=900 * 4) for p in payloads if isinstance(p, ev.MergeRequestClaimed)
    )


# ---- carried out in its order --------------------------------------------------------------------------------


async def test_a_settlement_is_carried_out_commands_then_events_then_the_close_then_the_branch(
    q: Queue, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    done: list[str] = []

    async def store(cmd: Command) -> StoredCommand:
        done.append(f"send {cmd.cmd_id}")
        # Some other sender took the conflict bead's id first: it is settled under another.
        return StoredCommand(seq=1, cmd_id=f"{cmd.cmd_id}~2" if isinstance(cmd, BeadCreate) else cmd.cmd_id or "")

    async def append(owed: list[NewEvent]) -> int:
        done.extend(f"append {new.payload.TYPE} {getattr(new.payload, 'conflict_command', '')}".strip() for new in owed)
        return len(owed)

    monkeypatch.setattr(merger, "publish_branch", lambda paths, mr: done.append("publish"))
    monkeypatch.setattr(merger, "delete_branch", lambda paths, branch: done.append(f"delete {branch}"))
    settler = Settler(store, append)
    paths = merger.Paths(tmp_path, "demo")
    a = claimed(q, "de-a")
    mr = msgspec.structs.replace(q.mr(a), bundle="/gt/x.bundle")
    conflict = plan.Outcome(kind="conflict", target_before="e" * 40, files=["calc.py"])
    await settler.run(plan.settle(q.state, mr, conflict, RESULT, POLICY, q.clock), mr, paths)
    assert done == ["publish", f"send conflict-{a}-1", f"append mr.conflicted conflict-{a}-1~2"]
    done.clear()
    b = claimed(q, "de-b")
    merge = plan.Outcome(kind="merged", target_before="e" * 40, merged_commit="f" * 40)
    await settler.run(settle(q, b, merge), q.mr(b), paths)
    assert done == ["append mr.merged", f"send close-{b}", "delete polecat/x/de-b"]
    assert (settler.figures.merged, settler.figures.conflicted, settler.closing) == (1, 1, {b})
