"""The gate runner service: takes gate jobs from the log and runs them, one at a time (see the package's
docstring). ``plan`` decides which job and what to write; ``effects.job_run`` fetches and runs."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import structlog

from services.runner import plan
from services.runner import settings as runner_settings
from services.runner.effects import job_run
from services.runner.projection import new_projection
from services.runner.state import RunnerState
from shared.core import subjects
from shared.core.config import TownConfig
from shared.host.gates import workspace
from shared.host.gates.user import GateWorkspaces, town_directory
from shared.host.gates.user import resolve as resolve_gate_user
from shared.model.events.gate_jobs import GateJobEvent, GateResult
from shared.service import Service, ServiceSettings

log = structlog.get_logger(__name__)
FINISH_TRIES = 3
CATCH_UP_S = 5.0


class RunnerService(Service[RunnerState]):
    name: ClassVar[str] = "runner"
    # Its NATS user (account RUNNERS, ops/nats/accounts.conf) has no JetStream of its own: it reads the gate jobs'
    # events by direct gets, appends only those, and makes no stream (another service provisions the town).
    provisions: ClassVar[bool] = False
    reads_only: ClassVar[str | None] = subjects.event_subject(GateJobEvent.AGGREGATE, ">")

    def __init__(
        self,
        config: TownConfig,
        settings: ServiceSettings | None = None,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        runner: runner_settings.RunnerSettings | None = None,
    ) -> None:
        super().__init__(config, new_projection(), settings, clock=clock)
        self.runner = runner or runner_settings.load(gt_home=config.gt_home)
        self.home = Path(self.runner.home)
        # Checked before anything connects: a gate user that cannot be used stops the runner at start-up.
        user = resolve_gate_user(self.runner.gate_user)
        self.gate_workspaces = GateWorkspaces(user, town_directory(self.home)) if user is not None else None
        self._tg: asyncio.TaskGroup | None = None
        self._cleaned = asyncio.Event()
        self._running: set[str] = set()
        """The job this runner runs now (at most one)."""
        self._gate = ""
        """The gate of that job running now, for its heartbeats."""
        self.jobs_run = self.jobs_lost = 0

    @property
    def identity(self) -> str:
        return subjects.runner_scope(self.runner.name)

    @property
    def query_scope(self) -> str:
        return self.identity  # each runner answers on its own: the supervisor waits for every one

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg
        tg.create_task(self._remove_leftovers(), name="runner-cleanup")

    async def before_release(self) -> None:
        """A gate workspace being settled after its gates (``workspace.used``) is left settled, not mid-checkout, to
        a standby taking over on this host; for a while, never forever."""
        await asyncio.to_thread(workspace.wait_for_settles, workspace.SETTLE_EXIT_WAIT_S)

    async def _remove_leftovers(self) -> None:
        """What a killed runner left (its gates' processes) goes before a job is taken."""
        try:
            await asyncio.to_thread(job_run.stop_leftovers, self.home)
        finally:
            self._cleaned.set()
            self.wake()

    async def reconcile(self) -> None:
        if self._tg is None or not self._cleaned.is_set() or self._running:
            return
        state, now, me = self.projection.state, self.clock(), self.identity
        running = frozenset(self._running)
        job = plan.next_job(state, now, me, self.runner.stale_s, running)
        if job is None:
            due = plan.stale_at(state, self.runner.stale_s, running)
            if due is not None:
                delay = max(0.05, (due - now).total_seconds())
                asyncio.get_running_loop().call_later(delay, self.wake)
            return
        if not await self.append_owed([plan.take(job, me)]):
            self.wake()  # another runner took it first: look for the next
            return
        taken = self.projection.state.jobs[job.id]
        self._running.add(job.id)
        self._tg.create_task(self._run(job.id, taken.attempt), name=f"gate-job-{job.id}")

    async def _run(self, job_id: str, attempt: int) -> None:
        stop = threading.Event()
        structlog.contextvars.bind_contextvars(job=job_id, attempt=attempt)
        beating = asyncio.create_task(self._beat(job_id, attempt, stop), name=f"heartbeat-{job_id}")
        results: list[GateResult] = []
        error = ""
        try:
            job = self.projection.state.jobs[job_id]
            log.info("gate_job_started", rig=job.rig, commit=job.commit, mrs=job.stack)
            try:
                results = await asyncio.to_thread(
                    job_run.run, self.home, job, gate_workspaces=self.gate_workspaces, stop=stop,
                    on_gate=self._on_gate,
                )  # fmt: skip
            except job_run.JobError as exc:
                error = str(exc)
                log.warning("gate_job_not_run", error=error)
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            if stop.is_set():
                self.jobs_lost += 1
                log.info("gate_job_lost")
                return
            await self._finish(job_id, attempt, results, error)
        finally:
            beating.cancel()
            self._running.discard(job_id)
            self._gate = ""
            structlog.contextvars.unbind_contextvars("job", "attempt")
            self.wake()

    def _on_gate(self, gate: str) -> None:
        self._gate = gate  # from the job's thread: a plain assignment, read by the heartbeat

    async def _beat(self, job_id: str, attempt: int, stop: threading.Event) -> None:
        """A heartbeat in the log every ``heartbeat_s`` while the job is this runner's; ``stop`` once it is not."""
        me = self.identity
        while True:
            await asyncio.sleep(self.runner.heartbeat_s)
            job = self.projection.state.jobs.get(job_id)
            if not plan.owns(job, me, attempt):
                stop.set()
                return
            assert job is not None
            if not await self.append_owed([plan.heartbeat(job, me, self._gate)]):
                job = self.projection.state.jobs.get(job_id)
                if not plan.owns(job, me, attempt):
                    stop.set()
                    return

    async def _finish(self, job_id: str, attempt: int, results: list[GateResult], error: str) -> None:
        """The job's result in the log, unless it is not this runner's any more."""
        me = self.identity
        for _ in range(FINISH_TRIES):
            job = self.projection.state.jobs.get(job_id)
            if not plan.owns(job, me, attempt):
                break
            assert job is not None
            if await self.append_owed([plan.finished(job, me, results, error)]):
                self.jobs_run += 1
                failed = next((r.gate for r in results if r.exit_code != 0), "")
                log.info("gate_job_finished", passed=not error and not failed, failed=failed, error=error[:200])
                return
            # A heartbeat of its own stored but not applied yet moved the job: look again once caught up.
            with contextlib.suppress(TimeoutError):
                await self.catch_up(timeout=CATCH_UP_S)
        self.jobs_lost += 1
        log.info("gate_job_lost")
