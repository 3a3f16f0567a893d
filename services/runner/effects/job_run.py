"""Running one gate job on this host: the candidate fetched by its ref into the runner's clone of the rig, the
gates run on it in the runner's persistent gate workspace (``shared.host.gates``). Blocking (run in a thread).

Each rig the runner gated has a directory under the runner's home: ``repo.git`` (a bare clone of the rig's
repository, fetching only what the jobs name), ``workspace`` (the gate workspace), ``logs`` and ``gates`` (the
records of the gates running now, which a runner starting stops first: ``shared.host.gates.runs``).
Adapter: runs git and the gates.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import structlog

from shared.host import git, path_locks
from shared.host.gates import execution, runs
from shared.host.gates.user import GateWorkspaces
from shared.model.events.gate_jobs import GateResult
from shared.model.gate_jobs import GateJob

log = structlog.get_logger(__name__)


def place(home: Path, rig: str) -> execution.Place:
    root = home / rig
    return execution.Place(
        clone=root / "repo.git", workspace=root / "workspace", logs=root / "logs", records=root / "gates", home=rig
    )


def stop_leftovers(home: Path) -> None:
    """What a runner killed before left running: its gates (were their watchers killed too)."""
    if not home.is_dir():
        return
    for rig_dir in sorted(home.iterdir()):
        stopped = runs.stop_leftovers(place(home, rig_dir.name).records)
        if stopped:
            log.warning("leftover_gates_stopped", rig=rig_dir.name, pids=stopped)


class JobError(Exception):
    """The job's gates could not run (not the candidate's fault): why, for the log."""


def fetch(where: execution.Place, job: GateJob) -> None:
    """The job's candidate in the runner's clone, exactly the commit asked for.

    Raises:
        JobError: it could not be fetched, or the ref names another commit.
    """
    try:
        with path_locks.lock(where.clone):
            git.ensure_bare_clone(job.repo, where.clone)
            git.fetch_ref(where.clone, job.ref)
            found = git.resolve_commit(where.clone, job.ref)
            git.git("update-ref", "-d", job.ref, cwd=where.clone)
    except git.GitError as exc:
        raise JobError(f"the candidate {job.ref} could not be fetched from the rig's repository: {exc}") from exc
    if found != job.commit:
        raise JobError(f"{job.ref} names {found} in the rig's repository, not the candidate {job.commit}")


def run(
    home: Path,
    job: GateJob,
    *,
    gate_workspaces: GateWorkspaces | None,
    stop: threading.Event,
    on_gate: Callable[[str], None],
) -> list[GateResult]:
    """The job's gates run on its candidate, in order until one fails (or ``stop`` is set).

    Raises:
        JobError: the candidate could not be fetched, or the workspace not put at it.
    """
    where = place(home, job.rig)
    fetch(where, job)
    env = execution.gate_environment(job.env, os.environ)
    prober = execution.Prober(where, env, job.timeout_s, gate_workspaces=gate_workspaces, pristine=job.pristine)
    try:
        return prober.probe(job.commit, job.gates, f"{job.id}-{job.attempt}", stop=stop, on_gate=on_gate)
    except git.GitError as exc:
        raise JobError(f"the gate workspace could not be put at {job.commit}: {exc}") from exc
