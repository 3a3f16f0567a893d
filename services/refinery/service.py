"""The refinery service: the merge queue. Merge requests come in as commands; one per rig at a time is
claimed under a lease, rebased onto its target in a temporary worktree, gated, and fast-forwarded onto the
target. Each step is recorded; a crash anywhere is made good by the next claim (see docs/failure-behaviour.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import msgspec
import structlog

from services.refinery import decide as refinery_decide
from services.refinery import plan, queries
from services.refinery import settings as refinery_settings
from services.refinery.effects import gate_runs, merger, refusals
from services.refinery.effects.gate_user import resolve as resolve_gate_user
from services.refinery.projection import new_projection
from services.refinery.state import MergeRequest, RefineryState
from shared import git, lease_state
from shared import leases as lease_kv
from shared.aio import pause
from shared.bus.errors import BusError
from shared.bus.fencing import fence_error
from shared.bus.kv import Bucket
from shared.commands import BeadClose, BeadCreate, Command, EscalationRaise, Fence, MergeRequestSubmit
from shared.config import TownConfig
from shared.decision import Accepted, DecideContext, NewEvent
from shared.errors import ActivityLostError, CommandError
from shared.events import (
    Event,
    MergeRequestClaimed,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestMerged,
    MergeRequestRejected,
    MergeRequestRequeued,
)
from shared.events.merge_queues import PUSH_REFUSED
from shared.faults import crash_point
from shared.ids import merge_lease_name
from shared.queries import Query
from shared.queries.refinery import RefineryStatus
from shared.rig_state import home_name
from shared.service import Service, ServiceSettings

log = structlog.get_logger(__name__)
ERROR_BACKOFF_S = 5.0
SESSION_CATCH_UP_S = 5.0


class RefineryService(Service[RefineryState]):
    name: ClassVar[str] = "refinery"

    def __init__(
        self,
        config: TownConfig,
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        refinery: refinery_settings.RefinerySettings | None = None,
    ) -> None:
        super().__init__(config, new_projection(), settings, clock=clock)
        self.mq = refinery or refinery_settings.load()
        # Checked before anything connects: a gate user that cannot be used stops the refinery at start-up.
        self.gate_user = resolve_gate_user(self.mq.gate_user)
        self.policy = plan.Policy(
            lease_s=self.mq.lease_s,
            max_failures=self.mq.max_failures,
            max_conflict_returns=self.mq.max_conflict_returns,
            fifo=self.mq.fifo,
            batch=self.mq.batch,
            batch_wait_s=self.mq.batch_wait_s,
            push_retries=self.mq.push_retries,
            push_backoff_s=self.mq.push_backoff_s,
            push_backoff_max_s=self.mq.push_backoff_max_s,
        )
        self.holder = f"refinery-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.rigs_root = config.gt_home / "rigs"
        self._tg: asyncio.TaskGroup | None = None
        self._cleaned = asyncio.Event()
        self._busy: set[str] = set()
        """Rigs with a merge request being processed by this process."""
        self._closing: set[str] = set()
        self._pauses_escalated: set[tuple[str, int]] = set()
        """(rig, pause number) of paused queues this process escalated (or found escalated)."""
        self.merged = self.failed = self.conflicted = self.gate_runs = self.batches = self.fenced = 0
        self.gate_seconds = 0.0

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return refinery_decide.decide(self.projection.state, cmd, ctx)

    def aggregate_key(self, cmd: Command) -> str | None:
        return refinery_decide.aggregate_key(cmd)

    async def prepare(self, cmd: Command) -> object:
        state = self.projection.state
        unknown = isinstance(cmd, MergeRequestSubmit) and cmd.session and cmd.session not in state.sessions
        if unknown:
            # The session and its hook lease may be a few events ahead of this projection: judge its merge
            # request on the log as it is now (a miss here refuses it).
            with contextlib.suppress(TimeoutError):
                await self.catch_up(timeout=SESSION_CATCH_UP_S)
        if isinstance(cmd, MergeRequestSubmit) and cmd.bundle is not None:
            return await self._import_bundle(cmd)
        return None

    async def _import_bundle(self, cmd: MergeRequestSubmit) -> refinery_decide.BundleRefused | None:
        """Take a session's published commits into the rig's clone before its merge request is decided (while
        `gt done` waits, its workspace still there): refused at once when too large or not what it says. Only for
        a request its session may make: anything else is refused by ``decide`` without reading the file."""
        state = self.projection.state
        rig = state.rigs.get(cmd.rig)
        if rig is None:
            return None
        try:
            refinery_decide.check_session_submit(state, cmd, rig.base_branch)
        except CommandError:
            return None
        assert cmd.bundle is not None
        published = f"/rigs/{home_name(rig)}/published/{cmd.session}/{cmd.head}.bundle"
        if not cmd.bundle.endswith(published):
            # Only where `gt done` publishes (the session's own folder, its head's name): never a file elsewhere
            # the refinery (root) could read and say things about.
            why = f"the bundle must be the session's own, ...{published}; got {cmd.bundle}"
            return refinery_decide.BundleRefused("invalid", why[:500])
        paths = merger.Paths(self.rigs_root, home_name(rig))
        problem = await asyncio.to_thread(merger.import_published, paths, rig, cmd, self.mq.max_bytes)
        if problem is None:
            return None
        log.info("bundle_refused", mr_bead=cmd.bead, session=cmd.session, code=problem.code, why=problem.message)
        return refinery_decide.BundleRefused(problem.code, problem.message)

    def query(self, query: Query[Any]) -> Any:
        return queries.answer(self.projection.state, query, self.clock(), self.policy)

    def status(self) -> RefineryStatus:
        return RefineryStatus(
            **msgspec.structs.asdict(super().status()),
            merged=self.merged,
            failed=self.failed,
            conflicted=self.conflicted,
            gate_runs=self.gate_runs,
            gate_seconds=round(self.gate_seconds, 3),
            batches=self.batches,
            fenced=self.fenced,
            batch_size=self.policy.batch,
            processing=sorted(self._busy),
        )

    # ---- the queue -----------------------------------------------------------------------------

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg
        tg.create_task(self._remove_leftover_worktrees(), name="refinery-cleanup")

    async def _remove_leftover_worktrees(self) -> None:
        """What a crashed refinery left: first its gates' processes (were their watchers killed too), then its
        temporary worktrees; nothing is processed until they are gone."""
        try:
            if self.rigs_root.exists():
                for rig_dir in sorted(self.rigs_root.iterdir()):
                    paths = merger.Paths(self.rigs_root, rig_dir.name)
                    try:
                        stopped = await asyncio.to_thread(gate_runs.stop_leftovers, paths.gates)
                        if stopped:
                            log.warning("leftover_gates_stopped", rig=rig_dir.name, pids=stopped)
                        removed = await asyncio.to_thread(merger.clean_worktrees, paths)
                    except (git.GitError, OSError) as exc:
                        # A rig whose leftovers cannot go is logged; the next attempt at one of its merge
                        # requests replaces its own worktree anyway.
                        log.warning("temp_worktree_cleanup_failed", rig=rig_dir.name, error=str(exc))
                        continue
                    if removed:
                        log.info("temp_worktrees_removed", rig=rig_dir.name, worktrees=removed)
        finally:
            self._cleaned.set()
            self.wake()

    async def reconcile(self) -> None:
        if self._tg is None or not self._cleaned.is_set():
            return
        state = self.projection.state
        owed: list[NewEvent] = []
        for mr in plan.stale(state):
            owed.append(
                NewEvent(
                    payload=MergeRequestRejected(mr_id=mr.id, reason="its bead was closed"), expected_seq=mr.version
                )
            )
        for mr in plan.unblocked(state):
            reason = f"conflict bead {mr.blocked_by} closed"
            owed.append(NewEvent(payload=MergeRequestRequeued(mr_id=mr.id, reason=reason), expected_seq=mr.version))
        if owed:
            await self.append_owed(owed)
        await self._escalate_pauses()
        for mr in plan.beads_to_close(state):
            if mr.id not in self._closing:
                self._closing.add(mr.id)
                await self._close_bead(mr)
        now = self.clock()
        planned = plan.next_batches(state, now, self.policy, frozenset(self._busy), self.holder)
        if planned.wake_at is not None:
            self._wake_at(planned.wake_at, now)
        for batch in planned.batches:
            await self._claim_and_process(batch, now)

    def _wake_at(self, when: datetime, now: datetime) -> None:
        delay = max(0.0, (when - now).total_seconds())
        asyncio.get_running_loop().call_later(delay, self.wake)

    async def _claim_and_process(self, batch: list[MergeRequest], now: datetime) -> None:
        assert self._tg is not None
        token = await self._take_merge_lease(batch[0].rig, now)
        if token is None:
            return
        ids = [mr.id for mr in batch] if len(batch) > 1 else []
        # Bisecting a batch runs the gates about log2(size) + 2 times: the claim lasts that many leases.
        lease = self.policy.lease_s * (1 if len(batch) == 1 else 2 + math.ceil(math.log2(len(batch))))
        claimed: list[str] = []
        for mr in batch:
            claim = MergeRequestClaimed(
                mr_id=mr.id,
                attempt=mr.attempts + 1,
                holder=self.holder,
                lease_until=now + timedelta(seconds=lease),
                batch=ids,
            )
            if await self._store(mr, claim):
                claimed.append(mr.id)
        rig = batch[0].rig
        if claimed:
            self._busy.add(rig)
            self._tg.create_task(self._process(rig, claimed, token), name=f"refinery-{rig}")
        else:
            await self._release_merge_lease(rig, token)

    # ---- the rig's merge lease -----------------------------------------------------------------

    def _merge_lease_ttl(self) -> float:
        return min(self.mq.merge_lease_ttl_s, self.mq.lease_s)

    def _lease_kv(self) -> Bucket:
        assert self.nc is not None
        return Bucket(self.nc, self.config.lease_bucket)

    async def _take_merge_lease(self, rig: str, now: datetime) -> int | None:
        """The rig's merge lease for this refinery (its token), taken over from any other holder; None when
        that failed (the lease moved meanwhile: the next reconcile looks again).

        Another holder is a former instance of this refinery: only the instance holding the activity key acts,
        and this one got the key only once the other had stopped acting (died, released it, or lost it). So its
        lease is taken over at once, not after its TTL, and the new token fences out whatever it left running."""
        name = merge_lease_name(rig)
        lease = self.projection.state.merge_leases.get(name)
        if lease is not None and lease.status == "held":
            if lease.holder == self.holder:
                return lease.token
            kv = self._lease_kv()
            renewal, revision = await lease_kv.read(kv, name)
            # Marked first, so the former holder's renewals fail from now on (its pushes are checked too).
            last = lease_state.last_renewed(lease, renewal)
            if not await lease_kv.mark_expired(kv, name, lease.holder, lease.token, last, seen_revision=revision):
                return None
            lapsed = lease_state.due_to_expire(lease, renewal, now)
            log.warning(
                "merge_lease_taken_over", rig=rig, lease=name, previous=lease.holder, token=lease.token, lapsed=lapsed
            )
        acquired, token = lease_state.acquisition(lease, name, self.holder, self._merge_lease_ttl(), now)
        if not await self.append_owed([acquired]):
            return None
        return token

    async def _release_merge_lease(self, rig: str, token: int) -> None:
        lease = self.projection.state.merge_leases.get(merge_lease_name(rig))
        if lease is None or not lease.held_by(self.holder, token):
            return
        await self.append_owed([lease_state.release(lease)])

    async def _renew_merge_lease(self, rig: str, token: int, lost: list[str]) -> None:
        """Renew while the batch is processed; a renewal refused (the lease lapsed and passed on) is recorded
        in ``lost`` and stops the push."""
        name = merge_lease_name(rig)
        every = self._merge_lease_ttl() / 3
        while True:
            try:
                await lease_kv.renew(self._lease_kv(), name, self.holder, token, self.clock())
            except lease_kv.LeaseLostError as exc:
                lost.append(exc.why)
                log.warning("merge_lease_lost", rig=rig, lease=name, token=token, why=exc.why)
                return
            except (BusError, TimeoutError) as exc:
                log.warning("merge_lease_not_renewed", rig=rig, error=repr(exc))
            await pause(every)

    def _lost_lease_check(self, rig: str, token: int, lost: list[str]) -> Callable[[], str | None]:
        """For the merger's thread: why this refinery may not push now (None: it may), asking the log."""
        loop = asyncio.get_running_loop()
        fence = Fence(lease=merge_lease_name(rig), token=token)

        def check() -> str | None:
            if lost:
                return lost[0]
            if self.activity is None or not self.activity.may_act():
                # Paused (its activity key not renewed in time) or lost: a standby may be taking over.
                return "this refinery may not act now: its activity key is not renewed"
            assert self.nc is not None
            future = asyncio.run_coroutine_threadsafe(fence_error(self.nc, self.config.evt_stream, fence), loop)
            error = future.result(timeout=10)
            return error.message if error is not None else None

        return check

    async def _store(self, mr: MergeRequest, event: Event) -> bool:
        current = self.projection.state.mrs.get(mr.id, mr)
        return bool(await self.append_owed([NewEvent(payload=event, expected_seq=current.version)]))

    async def _process(self, rig_name: str, mr_ids: list[str], token: int) -> None:
        lost: list[str] = []
        renewing = asyncio.create_task(self._renew_merge_lease(rig_name, token, lost), name=f"lease-{rig_name}")
        try:
            await self._process_claimed(rig_name, mr_ids, lost_lease=self._lost_lease_check(rig_name, token, lost))
            # Released before the rig counts as free here: a claim made before would be under this token. Not
            # on cancellation (shutdown): the lease then lapses after its TTL.
            await self._release_merge_lease(rig_name, token)
        finally:
            renewing.cancel()
            self._busy.discard(rig_name)
            self.wake()

    async def _process_claimed(self, rig_name: str, mr_ids: list[str], *, lost_lease: Callable[[], str | None]) -> None:
        state = self.projection.state
        mrs = [state.mrs[mr_id] for mr_id in mr_ids]
        rig = state.rigs[rig_name]
        paths = merger.Paths(self.rigs_root, home_name(rig))
        first = mrs[0]
        # A batch's worktree and logs are named after its first merge request and that one's attempt.
        name = f"{first.id}-{first.attempts}"
        structlog.contextvars.bind_contextvars(mr=first.id, bead=first.bead, batch=len(mrs))
        try:
            log.info("mr_processing", attempt=first.attempts, mrs=mr_ids, target=first.target)
            result = await asyncio.to_thread(
                merger.process,
                paths,
                rig,
                mrs,
                name=name,
                gate_timeout=self.mq.gate_timeout_s,
                lost_lease=lost_lease,
                gate_user=self.gate_user,
            )
            if result.fenced:
                # Another refinery holds the rig now and claims these merge requests again: nothing of ours
                # is written (and it would be refused: their versions moved or will).
                self.fenced += 1
                log.warning("merge_fenced", mrs=mr_ids, why=result.fenced)
                return
            self.gate_runs += result.gates_run
            self.gate_seconds += result.gate_seconds
            self.batches += 1
            if result.target_failed is not None:
                await self._target_failed(first, result.target_failed)
            for mr in mrs:
                await self._settle(mr, result.outcomes[mr.id], result, paths)
        except ActivityLostError:
            raise  # another refinery acts now: nothing more is written, not even a requeue
        except Exception as exc:
            # Any failure of one batch (git, a bug) must not stop the queue: it is logged with its traceback and
            # its merge requests are queued again after a pause. Cancellation is not caught.
            # Each such requeue backs off longer, and after too many in a row the merge request is escalated.
            log.exception("mr_processing_failed")
            await pause(ERROR_BACKOFF_S)
            error = merger.GateResult(gate="error", exit_code=1, seconds=0.0, tail=f"{exc}"[-2000:], log_path="")
            for mr_id in mr_ids:
                current = self.projection.state.mrs.get(mr_id)
                if current is not None and current.status == "claimed" and current.holder == self.holder:
                    why = "its processing kept failing"
                    await self._retry_later(current, f"error: {exc}"[:500], error, why)
        finally:
            structlog.contextvars.unbind_contextvars("mr", "bead", "batch")

    async def _settle(
        self,
        mr: MergeRequest,
        outcome: merger.Outcome,
        result: merger.BatchResult,
        paths: merger.Paths,
    ) -> None:
        state = self.projection.state
        structlog.contextvars.bind_contextvars(mr=mr.id, bead=mr.bead)
        if outcome.kind in ("merged", "already_merged"):
            already = outcome.kind == "already_merged"
            event = MergeRequestMerged(
                mr_id=mr.id,
                merged_commit=outcome.merged_commit,
                target_before=outcome.target_before,
                gates_run=result.gates_run,
                gate_seconds=round(result.gate_seconds, 3),
                batch=result.merged if len(result.merged) > 1 else [],
                already=already,
            )
            await self._store(mr, event)
            self.merged += 1
            log.info("mr_merged", commit=outcome.merged_commit, already=already)
            crash_point("refinery.after_merged")
            self._closing.add(mr.id)
            await self._close_bead(mr)
            crash_point("refinery.after_bead_close")
            await asyncio.to_thread(merger.delete_branch, paths, mr.branch)
        elif outcome.kind == "conflict":
            # An agent first: the witness gives the bead a fresh session told to rebase and resolve; a person
            # only once agents did not manage (or there is no agent's session to send it back to).
            sent_back = plan.send_conflict_back(state, mr, self.policy)
            if not sent_back and mr.bundle is not None:
                # For the person who resolves it: the polecat's branch in the rig's repository (it published a
                # bundle, it pushed nothing); a resolution pushed there is what the queue takes next.
                await asyncio.to_thread(merger.publish_branch, paths, mr)
            command = "" if sent_back else await self._conflict_bead(mr, outcome)
            event_c = MergeRequestConflicted(
                mr_id=mr.id,
                target_commit=outcome.target_before,
                conflict_command=command,
                files=outcome.files,
                sent_back=sent_back,
            )
            await self._store(mr, event_c)
            self.conflicted += 1
            log.info("mr_conflicted", files=outcome.files, sent_back=sent_back)
        elif outcome.kind in ("failed", "branch_missing"):
            assert outcome.failure is not None
            failures = plan.failures_of(state, mr.bead) + 1
            escalate = failures >= self.policy.max_failures
            if escalate:
                await self._escalate(mr, outcome.failure, failures)
            event_f = MergeRequestFailed(
                mr_id=mr.id,
                gate=outcome.failure.gate,
                exit_code=outcome.failure.exit_code,
                tail=outcome.failure.tail,
                escalated=escalate,
            )
            await self._store(mr, event_f)
            self.failed += 1
            log.info("mr_failed", gate=outcome.failure.gate, exit_code=outcome.failure.exit_code, escalated=escalate)
        elif outcome.kind in ("deferred", "target_failed"):
            # Not a failure of its own: the count of retries in a row is carried, not reset.
            current = state.mrs.get(mr.id, mr)
            reason = outcome.reason
            if outcome.kind == "target_failed":
                assert outcome.failure is not None
                reason = f"its {outcome.failure.gate} gate fails on {mr.target} too: not its failure"
            await self._store(mr, MergeRequestRequeued(mr_id=mr.id, reason=reason, retries=current.retries))
        else:  # push_refused
            await self._push_refused(mr, outcome)

    async def _push_refused(self, mr: MergeRequest, outcome: merger.Outcome) -> None:
        """A target that moved or a repository out of reach: tried again later, a bounded number of times. A
        refusal of the target's own (a checked-out branch with changes, a permission) pauses the rig's queue, the
        merge request back in it: every other would meet it too. Any other refusal (a hook) fails the merge
        request at once with git's message, escalated: nothing the polecat could change."""
        assert outcome.failure is not None
        rig = self.projection.state.rigs.get(mr.rig)
        why = refusals.why(outcome.refusal, mr.target, rig.repo if rig is not None else mr.rig)
        if outcome.refusal in refusals.TARGET_SIDE:
            await self._pause(mr, PUSH_REFUSED, why, outcome.failure.tail)
        elif outcome.refusal in refusals.RETRYABLE:
            reason = (
                "the target moved during the merge"
                if outcome.refusal == refusals.MOVED
                else f"the repository could not be reached: {outcome.failure.tail}"[:500]
            )
            await self._retry_later(mr, reason, outcome.failure, why)
        else:
            await self._fail_and_escalate(mr, outcome.failure, why)

    async def _pause(self, mr: MergeRequest, cause: str, why: str, detail: str) -> None:
        """Pause the rig's queue (once: one escalation, see ``_escalate_pauses``) and put ``mr`` back into it."""
        state = self.projection.state
        paused = plan.pause(state, mr.rig, cause, why, mr.id, detail)
        if paused is not None:
            await self.append_owed([paused])
            log.warning("merge_queue_paused", rig=mr.rig, cause=cause, why=why)
        current = state.mrs.get(mr.id, mr)
        reason = f"the queue of rig {mr.rig} is paused: {why}"[:500]
        await self._store(mr, MergeRequestRequeued(mr_id=mr.id, reason=reason, retries=current.retries))

    async def _target_failed(self, first: MergeRequest, failed: merger.TargetFailed) -> None:
        """A gate failed on the target's tip too: recorded for the rig's queue, which pauses the second time in a
        row (``plan.target_failed``); the merge requests go back into the queue in ``_settle``."""
        failure = plan.TargetFailure(
            gate=failed.result.gate,
            command=failed.command,
            target=first.target,
            commit=failed.commit,
            exit_code=failed.result.exit_code,
            tail=failed.result.tail,
        )
        event = plan.target_failed(self.projection.state, first.rig, first.id, failure, self.policy)
        if event is not None:
            await self.append_owed([event])
            kind = event.payload.TYPE
            log.warning("gate_fails_on_target", gate=failure.gate, exit_code=failure.exit_code, recorded=kind)

    async def _escalate_pauses(self) -> None:
        """One escalation per pause of a rig's queue, named after the pause (sent again after a restart: the
        mayor answers it from its stored outcome). Resolved when the merge request that met the cause merges."""
        state = self.projection.state
        for queue in plan.paused_queues(state):
            key = (queue.rig, queue.pauses)
            if key in self._pauses_escalated:
                continue
            mr = state.mrs.get(queue.mr_id)
            waiting = sum(1 for m in state.mrs.values() if m.rig == queue.rig and m.status == "queued")
            message = (
                f"the merge queue of rig {queue.rig} is paused: {queue.reason}. {waiting} merge request(s) wait; "
                f"no gate runs until `gt mq resume {queue.rig}`.\n{queue.detail}"
            )
            resolved = [f"mr:{queue.mr_id}"] + ([f"bead:{mr.bead}"] if mr is not None else [])
            await self.store(
                EscalationRaise(
                    severity="high",
                    message=message[:9000],
                    source=f"refinery/{queue.rig}",
                    bead=mr.bead if mr is not None else None,
                    resolved_when=resolved,
                    cmd_id=f"esc-mq-{queue.rig}-{queue.pauses}",
                )
            )
            self._pauses_escalated.add(key)

    async def _retry_later(self, mr: MergeRequest, reason: str, failure: merger.GateResult, why: str) -> None:
        """Back into the queue not before a backoff recorded in the log (a restart waits the same), or failed
        and escalated once it went back too often in a row."""
        current = self.projection.state.mrs.get(mr.id, mr)
        not_before = plan.retry_at(current.retries, self.clock(), self.policy)
        if not_before is None:
            tries = current.retries + 1
            await self._fail_and_escalate(mr, failure, f"{why}; given up after {tries} attempts in a row")
            return
        requeued = MergeRequestRequeued(mr_id=mr.id, reason=reason, retries=current.retries + 1, not_before=not_before)
        await self._store(mr, requeued)
        log.info("mr_retry_later", reason=reason, retries=requeued.retries, not_before=not_before.isoformat())

    async def _fail_and_escalate(self, mr: MergeRequest, failure: merger.GateResult, why: str) -> None:
        current = self.projection.state.mrs.get(mr.id, mr)
        said = "git said" if failure.gate == "push" else "the last error"
        message = (
            f"merge request {mr.id} (bead {mr.bead}) of rig {mr.rig} was not merged into {mr.target}: {why}. "
            f"{said}:\n{failure.tail}\nOnce fixed, `gt mq retry {mr.id}` puts it back into the queue."
        )
        await self.store(
            EscalationRaise(
                severity="high",
                message=message,
                source=f"refinery/{mr.rig}",
                bead=mr.bead,
                # Fixed and retried, it merges; or the bead was closed otherwise: either way nothing is left to do.
                resolved_when=[f"mr:{mr.id}", f"bead:{mr.bead}"],
                cmd_id=f"esc-{failure.gate}-{mr.id}-{current.attempts}",
            )
        )
        event = MergeRequestFailed(
            mr_id=mr.id, gate=failure.gate, exit_code=failure.exit_code, tail=failure.tail, escalated=True
        )
        await self._store(mr, event)
        self.failed += 1
        log.warning("mr_escalated", gate=failure.gate, exit_code=failure.exit_code, why=why)

    # ---- commands to the mayor (idempotent by their ids) ---------------------------------------

    async def _close_bead(self, mr: MergeRequest) -> None:
        state = self.projection.state
        reason = plan.close_reason(state, state.mrs.get(mr.id, mr))
        try:
            await self.store(BeadClose(id=mr.bead, reason=reason, cmd_id=f"close-{mr.id}"))
        except BaseException:
            # Not sent: the next reconcile sends it again (plan.beads_to_close), instead of taking it as on its way.
            self._closing.discard(mr.id)
            raise

    async def _conflict_bead(self, mr: MergeRequest, outcome: merger.Outcome) -> str:
        state = self.projection.state
        bead = state.beads.get(mr.bead)
        title = bead.title if bead else mr.bead
        command = f"conflict-{mr.id}-{mr.attempts}"
        returns = bead.conflicts_sent_back if bead else 0
        tried = f"Its agent was sent {returns} conflict(s) of this bead to resolve already.\n" if returns else ""
        description = (
            f"Merge request {mr.id} (bead {mr.bead}) does not rebase onto {mr.target}.\n{tried}"
            f"Branch: {mr.branch} at {mr.head}\nTarget: {mr.target} at {outcome.target_before}\n"
            f"Conflicting files: {', '.join(outcome.files) or 'unknown'}\n"
            f"Rebase the branch onto {mr.target}, integrating its change with what landed: keep what is on "
            f"{mr.target} working and re-apply the branch's change on top of it (where they contradict, what "
            "landed stands; never both sides of a conflict side by side), so the gates pass. Push it and close "
            "this bead: the merge request goes back into the queue."
        )
        create = BeadCreate(
            title=f"Resolve merge conflicts: {title}"[:200],
            priority=1,
            description=description,
            labels=["merge-conflict"],
            metadata={"mr": mr.id, "bead": mr.bead, "head": mr.head, "target_commit": outcome.target_before},
            prefix=state.rigs[mr.rig].prefix,
            cmd_id=command,
        )
        # The id it is settled under: another only when some other sender took this one first.
        return (await self.store(create)).cmd_id

    async def _escalate(self, mr: MergeRequest, failure: merger.GateResult, failures: int) -> None:
        message = (
            f"bead {mr.bead} failed its {failure.gate} gate {failures} times in the merge queue of rig {mr.rig} "
            f"(last: merge request {mr.id}, exit {failure.exit_code}); it is not sent back again. "
            f"`gt mq show {mr.id}` has the log tail."
        )
        source = f"refinery/{mr.rig}"
        await self.store(
            EscalationRaise(
                severity="high",
                message=message,
                source=source,
                bead=mr.bead,
                resolved_when=[f"mr:{mr.id}", f"bead:{mr.bead}"],
                cmd_id=f"esc-{mr.id}",
            )
        )
