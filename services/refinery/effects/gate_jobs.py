"""Gates on the gate runners (``GT_MQ_RUNNERS``): each candidate is a durable job in the log (``gate.requested``),
its commit pushed to the rig's repository under ``refs/gt/gate/<job>`` for the runners to fetch. The merger (in
its thread) asks ``RunnerGates`` as it asks the refinery's own gates; ``JobDesk`` is its side on the event loop:
it writes the jobs and reads their answers from the refinery's projection.

A candidate the log already has a job for (same stack key and gates: asked by a refinery that was restarted
since) is adopted, not asked again: a job still running is waited for, a finished one's answer taken as it is.
Jobs whose answer is needed no more (behind a red one, or when the batch ends) are cancelled, and every job's ref
is deleted once the batch is done. Adapter: writes events, pushes refs.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

import structlog

from services.refinery.effects.merger import Candidate, GateBackend, Paths, gate_commands
from services.refinery.settings import RefinerySettings
from shared.core.aio import pause
from shared.host import git
from shared.model.decision import NewEvent
from shared.model.events import GateJobCancelled, GateJobRequested
from shared.model.events.gate_jobs import GATE_JOB_OPEN, GateCommand, GateResult
from shared.model.gate_jobs import GATE_JOB_REFS, GateJob, job_ref
from shared.model.rigs import Rig

log = structlog.get_logger(__name__)
T = TypeVar("T")
POLL_S = 0.05


class GateJobError(Exception):
    """A job's gates could not run, or no runner answered in time: nobody is blamed, the batch is tried again."""


class JobDesk:
    """The refinery's gate jobs, on its event loop: written with ``append`` (the service's ``append_owed``), read
    from ``jobs`` (its projection's)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        append: Callable[[list[NewEvent]], Awaitable[int]],
        jobs: Callable[[], dict[str, GateJob]],
    ) -> None:
        self.loop, self.append, self.jobs = loop, append, jobs

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the event loop from the merger's thread; its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(_awaited(make), self.loop)
        return future.result()

    async def adoptable(self, key: str) -> GateJob | None:
        """The newest job under ``key`` that answered or may still answer (not cancelled, no error)."""
        found = [job for job in self.jobs().values() if job.key == key and job.status != "cancelled" and not job.error]
        return max(found, key=lambda job: job.version, default=None)

    async def request(self, events: list[GateJobRequested]) -> None:
        stored = await self.append([NewEvent(payload=event, expected_seq=0) for event in events])
        if stored != len(events):
            raise GateJobError(f"{len(events) - stored} of {len(events)} gate jobs could not be recorded")

    async def decided(self, ids: Sequence[str], deadline: float) -> list[GateJob]:
        """The jobs ``ids`` once the first failing one (in order) and every one before it finished, or all did; as
        they are then (the ones after the first red may still run).

        Raises:
            GateJobError: a job could not run, was cancelled, or no runner finished it before ``deadline``
                (``time.monotonic()``).
        """
        while True:
            jobs = self.jobs()
            seen = [jobs.get(job_id) for job_id in ids]
            for job_id, job in zip(ids, seen, strict=True):
                if job is None or job.status == "cancelled" or job.error:
                    why = job.error if job is not None and job.error else "it was cancelled or is not in the log"
                    raise GateJobError(f"gate job {job_id} gave no answer: {why}")
                if job.status != "finished":
                    break
                if not job.passed:
                    return [j for j in seen if j is not None]
            else:
                return [j for j in seen if j is not None]
            if time.monotonic() > deadline:
                waiting = [j.id for j in seen if j is not None and j.status != "finished"]
                raise GateJobError(f"no gate runner finished the jobs {', '.join(waiting)} in time")
            await pause(POLL_S)

    async def passed_on(self, commit: str, gate: GateCommand) -> bool:
        """Whether a finished job passed ``gate`` (that very command) on ``commit``."""
        return any(
            job.commit == commit and job.status == "finished" and job.passed and gate in job.gates
            for job in self.jobs().values()
        )

    async def open_jobs(self, rig: str) -> set[str]:
        """The rig's jobs still to run or running."""
        return {job.id for job in self.jobs().values() if job.rig == rig and job.status in GATE_JOB_OPEN}

    async def orphans(self, rig: str, requester: str) -> list[str]:
        """The rig's open jobs asked for by another refinery process than ``requester``."""
        return [
            job.id
            for job in self.jobs().values()
            if job.rig == rig and job.status in GATE_JOB_OPEN and job.requester != requester
        ]

    async def cancel(self, ids: Sequence[str], reason: str) -> None:
        jobs = self.jobs()
        owed = [
            NewEvent(payload=GateJobCancelled(job_id=job.id, reason=reason), expected_seq=job.version)
            for job in (jobs.get(job_id) for job_id in ids)
            if job is not None and job.status in GATE_JOB_OPEN
        ]
        if owed:
            await self.append(owed)


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


class RunnerGates:
    """A ``merger.GateBackend`` whose gates run on the runners, ``width`` candidates at once."""

    def __init__(
        self,
        desk: JobDesk,
        paths: Paths,
        rig: Rig,
        *,
        target: str,
        base: str,
        width: int,
        timeout: float,
        wait_s: float,
        requester: str,
    ) -> None:
        self.desk, self.paths, self.rig, self.target, self.base = desk, paths, rig, target, base
        self.gates = gate_commands(rig)
        self._width, self.timeout, self.wait_s, self.requester = width, timeout, wait_s, requester
        self._runs = 0
        self._seconds = 0.0
        self.used: list[str] = []
        """Every job this batch asked for or adopted."""
        self.counted: set[str] = set()

    @property
    def width(self) -> int:
        return self._width

    @property
    def runs(self) -> int:
        return self._runs

    @property
    def seconds(self) -> float:
        return self._seconds

    def adopted(self, key: str) -> str | None:
        job = self.desk.call(functools.partial(self.desk.adoptable, _job_key(key, self.gates)))
        if job is None:
            return None
        log.info("gate_job_adopted", job=job.id, status=job.status, mrs=job.stack)
        return job.commit

    def first_red(
        self, candidates: Sequence[Candidate], gates: Sequence[GateCommand], *, fresh: bool = False
    ) -> tuple[int, GateResult] | None:
        ids: list[str] = []
        asked: list[tuple[Candidate, str]] = []
        for candidate in candidates:
            key = _job_key(candidate.key, gates)
            job = None if fresh else self.desk.call(functools.partial(self.desk.adoptable, key))
            if job is not None and job.commit == candidate.commit:
                ids.append(job.id)
                continue
            job_id = f"g{uuid.uuid4().hex[:16]}"
            ids.append(job_id)
            asked.append((candidate, job_id))
        self.used += [job_id for job_id in ids if job_id not in self.used]
        if asked:
            git.push_refs(self.paths.bare, [f"{c.commit}:{job_ref(job_id)}" for c, job_id in asked])
            events = [self._request(c, job_id, gates) for c, job_id in asked]
            self.desk.call(functools.partial(self.desk.request, events))
            log.info("gate_jobs_requested", jobs=[job_id for _, job_id in asked], width=len(candidates))
        deadline = time.monotonic() + self.wait_s + self.timeout * len(gates)
        jobs = self.desk.call(functools.partial(self.desk.decided, ids, deadline))
        for job in jobs:
            if job.status == "finished" and job.id not in self.counted:
                self.counted.add(job.id)
                self._runs += len(job.results)
                self._seconds += sum(result.seconds for result in job.results)
        for index, job in enumerate(jobs):
            if job.status == "finished" and not job.passed:
                behind = [j.id for j in jobs[index + 1 :] if j.status in ("requested", "running")]
                if behind:
                    why = f"a candidate ahead of it failed ({job.id})"
                    self.desk.call(functools.partial(self.desk.cancel, behind, why))
                failure = job.failure
                assert failure is not None
                return index, failure
        return None

    def known_green(self, commit: str, gate: GateCommand) -> bool:
        return self.desk.call(functools.partial(self.desk.passed_on, commit, gate))

    def close(self) -> None:
        """The batch is done: its jobs still open are cancelled, and so are the rig's jobs a refinery before this
        one asked for and nobody adopted (only the holder of the rig's merge lease gates its candidates); then every
        job ref in the rig's repository whose job is not open is deleted (best effort: logged)."""
        orphans = self.desk.call(functools.partial(self.desk.orphans, self.rig.name, self.requester))
        done = [*self.used, *orphans]
        if done:
            self.desk.call(functools.partial(self.desk.cancel, done, "its batch is done"))
        try:
            listed = git.git("ls-remote", "--refs", "origin", f"{GATE_JOB_REFS}*", cwd=self.paths.bare)
            refs = [line.split("\t", 1)[1] for line in listed.splitlines() if "\t" in line]
            still = self.desk.call(functools.partial(self.desk.open_jobs, self.rig.name))
            gone = [ref for ref in refs if ref.removeprefix(GATE_JOB_REFS) not in still]
            git.push_refs(self.paths.bare, [f":{ref}" for ref in gone])
        except git.GitError as exc:
            log.warning("gate_job_refs_not_deleted", rig=self.rig.name, error=str(exc)[:300])

    def _request(self, candidate: Candidate, job_id: str, gates: Sequence[GateCommand]) -> GateJobRequested:
        return GateJobRequested(
            job_id=job_id,
            rig=self.rig.name,
            repo=self.rig.repo,
            target=self.target,
            base=self.base,
            commit=candidate.commit,
            ref=job_ref(job_id),
            stack=list(candidate.stack),
            key=_job_key(candidate.key, gates),
            gates=list(gates),
            env=list(self.rig.gate_env),
            timeout_s=self.timeout,
            pristine=self.rig.gate_pristine,
            requester=self.requester,
        )


def runner_gates(
    desk: JobDesk, paths: Paths, rig: Rig, target: str, mq: RefinerySettings, requester: str
) -> Callable[[str], GateBackend]:
    """The gates of one batch on the runners, made once the target's tip is known (``merger.process``)."""

    def made(target_before: str) -> GateBackend:
        return RunnerGates(
            desk, paths, rig, target=target, base=target_before, width=mq.runners, timeout=mq.gate_timeout_s,
            wait_s=mq.runner_wait_s, requester=requester,
        )  # fmt: skip

    return made


def _job_key(stack_key: str, gates: Sequence[GateCommand]) -> str:
    """A job's key: its candidate's stack key, and which gates it runs."""
    return f"{stack_key}:{'+'.join(g.gate for g in gates)}"
