"""The refinery service: the merge queue. Merge requests come in as commands; one per rig at a time is
claimed under a lease, rebased onto its target in a temporary worktree, gated, and fast-forwarded onto the
target. Each step is recorded; a crash anywhere is made good by the next claim (see docs/failure-behaviour.md).

Wiring: what is owed and what an outcome settles are decided in ``plan``; the merge lease, git and the gates,
and carrying a settlement out are ``effects``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
import structlog

from services.refinery import decide as refinery_decide
from services.refinery import plan, queries
from services.refinery import settings as refinery_settings
from services.refinery.effects import bundles, merger
from services.refinery.effects.gate_jobs import JobDesk, runner_gates
from services.refinery.effects.merge_lease import MergeLease
from services.refinery.effects.runner_beats import RunnerBeats
from services.refinery.effects.settling import Settler
from services.refinery.projection import new_projection
from services.refinery.state import MergeRequest, RefineryState
from shared.core.aio import pause
from shared.core.config import TownConfig
from shared.core.errors import ActivityLostError
from shared.host.gates import workspace
from shared.host.gates.user import GateWorkspaces, town_directory
from shared.host.gates.user import resolve as resolve_gate_user
from shared.model.commands import Command, MergeRequestSubmit
from shared.model.decision import Accepted, DecideContext
from shared.model.queries import Query
from shared.model.queries.refinery import RefineryStatus
from shared.model.rigs import home_name
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
        self.policy = plan.policy_of(self.mq)
        self.holder = self.instance
        """This process as the holder of its claims and of the rigs' merge leases."""
        self.merge_lease = MergeLease(self, min(self.mq.merge_lease_ttl_s, self.mq.lease_s))
        self.settler = Settler(self.store, self.append_owed)
        self.rigs_root = config.gt_home / "rigs"
        self.gate_workspaces = (
            GateWorkspaces(self.gate_user, town_directory(self.rigs_root)) if self.gate_user is not None else None
        )
        self._tg: asyncio.TaskGroup | None = None
        self.desk: JobDesk | None = None  # the gate jobs' desk, when gates run on the runners (GT_MQ_RUNNERS)
        self._cleaned = asyncio.Event()
        self._busy: set[str] = set()  # rigs with a merge request being processed by this process
        self._landed: dict[tuple[str, str], merger.Landed] = {}  # (rig, target) -> the candidate it landed last
        self._pauses_escalated: set[tuple[str, int]] = set()
        """(rig, pause number) of paused queues this process escalated (or found escalated)."""
        self.gate_runs = self.batches = self.fenced = 0
        self.gate_seconds = 0.0
        self.runners = RunnerBeats(config.service_bucket)
        """The gate runners' heartbeats, for the board (``gt mq runners``)."""

    def decide(self, cmd: Command, ctx: DecideContext) -> Accepted:
        return refinery_decide.decide(self.projection.state, cmd, ctx)

    async def prepare(self, cmd: Command) -> object:
        state = self.projection.state
        unknown = isinstance(cmd, MergeRequestSubmit) and cmd.session and cmd.session not in state.sessions
        if unknown:
            # The session and its hook lease may be a few events ahead of this projection: judge its merge
            # request on the log as it is now (a miss here refuses it).
            with contextlib.suppress(TimeoutError):
                await self.catch_up(timeout=SESSION_CATCH_UP_S)
        if isinstance(cmd, MergeRequestSubmit) and cmd.bundle is not None:
            return await bundles.take(self.projection.state, cmd, self.rigs_root, self.mq.max_bytes)
        return None

    def query(self, query: Query[Any]) -> Any:
        live = queries.Live(beats=self.runners.beats(), stale_s=self.mq.runner_stale_s, runners_used=self.mq.runners)
        return queries.answer(self.projection.state, query, self.clock(), self.policy, live)

    def status(self) -> RefineryStatus:
        figures = self.settler.figures
        return RefineryStatus(
            **msgspec.structs.asdict(super().status()),
            merged=figures.merged,
            failed=figures.failed,
            conflicted=figures.conflicted,
            gate_runs=self.gate_runs,
            gate_seconds=round(self.gate_seconds, 3),
            batches=self.batches,
            fenced=self.fenced,
            batch_size=self.policy.batch,
            processing=sorted(self._busy),
        )

    # ---- the queue -----------------------------------------------------------------------------

    def start_following(self, tg: asyncio.TaskGroup) -> None:
        assert self.nc is not None
        tg.create_task(self.runners.run(self.nc), name="refinery-runner-beats")

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg
        if self.mq.runners:
            self.desk = JobDesk(asyncio.get_running_loop(), self.append_owed, lambda: self.projection.state.gate_jobs)
        tg.create_task(self._remove_leftovers(), name="refinery-cleanup")

    async def before_release(self) -> None:  # a gate workspace left settled to a standby, not mid-checkout
        await asyncio.to_thread(workspace.wait_for_settles, workspace.SETTLE_EXIT_WAIT_S)

    async def _remove_leftovers(self) -> None:
        """What a crashed refinery left (its gates, its temporary worktrees) goes before anything is processed."""
        try:
            await asyncio.to_thread(merger.remove_leftovers, self.rigs_root)
        finally:
            self._cleaned.set()
            self.wake()

    async def reconcile(self) -> None:
        if self._tg is None or not self._cleaned.is_set():
            return
        state = self.projection.state
        owed = plan.reconciled(state)
        if owed:
            await self.append_owed(owed)
        await self._escalate_pauses()
        for mr in plan.beads_to_close(state):
            if mr.id not in self.settler.closing:
                await self.settler.close(mr.id, plan.bead_close(state, mr))
        now = self.clock()
        planned = plan.next_batches(state, now, self.policy, frozenset(self._busy), self.holder)
        if planned.wake_at is not None:
            delay = max(0.0, (planned.wake_at - now).total_seconds())
            asyncio.get_running_loop().call_later(delay, self.wake)
        for batch in planned.batches:
            await self._claim_and_process(batch, now)

    async def _escalate_pauses(self) -> None:
        """One escalation per pause of a rig's queue (``plan.escalation``), sent once by this process."""
        state = self.projection.state
        for queue in plan.paused_queues(state):
            key = (queue.rig, queue.pauses)
            if key not in self._pauses_escalated:
                await self.store(plan.escalation(state, queue))
                self._pauses_escalated.add(key)

    async def _claim_and_process(self, batch: list[MergeRequest], now: datetime) -> None:
        assert self._tg is not None
        rig = batch[0].rig
        token = await self.merge_lease.take(rig, now)
        if token is None:
            return
        claims = plan.claims(batch, now, self.policy, self.holder)
        claimed = [mr.id for mr, claim in zip(batch, claims, strict=True) if await self.append_owed([claim])]
        if claimed:
            self._busy.add(rig)
            self._tg.create_task(self._process(rig, claimed, token), name=f"refinery-{rig}")
        else:
            await self.merge_lease.release(rig, token)

    async def _process(self, rig_name: str, mr_ids: list[str], token: int) -> None:
        lost: list[str] = []
        renewing = asyncio.create_task(self.merge_lease.renew(rig_name, token, lost), name=f"lease-{rig_name}")
        try:
            await self._process_claimed(rig_name, mr_ids, lost_lease=self.merge_lease.lost_check(rig_name, token, lost))
            # Released before the rig counts as free here: a claim made before would be under this token. Not
            # on cancellation (shutdown): the lease then lapses after its TTL.
            await self.merge_lease.release(rig_name, token)
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
                merger.process, paths, rig, mrs, name=name, gate_timeout=self.mq.gate_timeout_s, lost_lease=lost_lease,
                gate_workspaces=self.gate_workspaces, retry_red=self.mq.retry_red,
                landed=self._landed.get((rig_name, first.target)),
                backend=runner_gates(self.desk, paths, rig, first.target, self.mq, self.holder) if self.desk else None,
            )  # fmt: skip
            if result.fenced:
                # Another refinery holds the rig now and claims these merge requests again: nothing of ours
                # is written (and it would be refused: their versions moved or will).
                self.fenced += 1
                log.warning("merge_fenced", mrs=mr_ids, why=result.fenced)
                return
            landed = merger.landed_of(result, rig, self._landed.get((rig_name, first.target)))
            if landed is not None:
                self._landed[(rig_name, first.target)] = landed
            self.gate_runs += result.gates_run
            self.gate_seconds += result.gate_seconds
            self.batches += 1
            if result.target_failed is not None:
                recorded = plan.target_failing(self.projection.state, first, result.target_failed, self.policy)
                if recorded is not None:
                    await self.settler.record(recorded)
            for mr in mrs:
                structlog.contextvars.bind_contextvars(mr=mr.id, bead=mr.bead)
                settled = plan.settle(
                    self.projection.state, mr, result.outcomes[mr.id], result, self.policy, self.clock()
                )
                await self.settler.run(settled, mr, paths)
        except ActivityLostError:
            raise  # another refinery acts now: nothing more is written, not even a requeue
        except Exception as exc:
            # Any failure of one batch (git, a bug) must not stop the queue: it is logged with its traceback and
            # its merge requests are queued again after a pause. Cancellation is not caught.
            # Each such requeue backs off longer, and after too many in a row the merge request is escalated.
            log.exception("mr_processing_failed")
            await pause(ERROR_BACKOFF_S)
            for mr_id in mr_ids:
                failed = plan.processing_failed(
                    self.projection.state, mr_id, self.holder, f"{exc}", self.policy, self.clock()
                )
                if failed is not None:
                    await self.settler.run(failed, self.projection.state.mrs[mr_id], paths)
        finally:
            structlog.contextvars.unbind_contextvars("mr", "bead", "batch")
