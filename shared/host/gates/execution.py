"""One probe: every gate of a rig run in order on one commit, in a persistent workspace, stopping at the first that
fails. What the refinery does with its own gates and what a gate runner does with a job. Blocking (run in a
thread). Adapter: runs git and the gates.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from shared.host.gates import runs, workspace
from shared.host.gates.user import GateUser, GateWorkspaces, gate_user_environment
from shared.model.events.gate_jobs import GateCommand, GateResult

TAIL_CHARS = 2000
GATE_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")
"""What a gate gets of its starter's environment, besides the names its rig lists (``gate_env``): gates run code
an agent wrote, so never the service's NATS credentials, the town's settings or whatever else the host holds."""
STOPPED = 125
"""A gate's exit code when it was stopped because its answer is needed no more (the job was taken or cancelled)."""


def gate_environment(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The allowlisted variables of ``environ`` (``GATE_BASE_ENV`` and the rig's ``names``) that are set."""
    return {key: environ[key] for key in (*GATE_BASE_ENV, *names) if key in environ}


def run_gate(
    gate: str,
    command: str,
    cwd: Path,
    log_path: Path,
    timeout: float,
    env: Mapping[str, str],
    as_user: GateUser | None = None,
    *,
    records: Path,
    stop: threading.Event | None = None,
) -> GateResult:
    """Run ``command`` through ``sh -c`` in ``cwd`` with exactly ``env`` (as ``as_user`` when given), its output
    in ``log_path`` (written by the starter: the gate gets only the open file), under a watcher that stops it
    and everything it started when the starter goes away (``runs``; ``records``: where it is recorded), or when
    ``stop`` is set."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with log_path.open("wb") as out:
        code = runs.run(
            ["sh", "-c", command], cwd=cwd, env=env, out=out, timeout=timeout, records=records, as_user=as_user,
            stop=stop,
        )  # fmt: skip
        if code is None and stop is not None and stop.is_set():
            out.write(f"\n[gastown] {gate} stopped: its answer is needed no more\n".encode())
            code = STOPPED
        elif code is None:
            out.write(f"\n[gastown] {gate} timed out after {timeout:g}s\n".encode())
            code = 124
    text = log_path.read_bytes()[-TAIL_CHARS * 4 :].decode(errors="replace")
    return GateResult(
        gate=gate, exit_code=code, seconds=time.monotonic() - began, tail=text[-TAIL_CHARS:], log_path=str(log_path)
    )


class Place:
    """Where one rig's gates run on one host: ``clone`` (a bare clone holding the commits to gate), ``workspace``
    (its persistent gate workspace, ``workspace``), ``logs`` (each gate's output), ``records`` (the gates running
    now, ``runs``) and ``home`` (the rig's name among the gate user's workspaces)."""

    def __init__(self, *, clone: Path, workspace: Path, logs: Path, records: Path, home: str) -> None:
        self.clone, self.workspace, self.logs, self.records, self.home = clone, workspace, logs, records, home


class Prober:
    """Runs gates on commits of one rig, one probe at a time, in the rig's persistent gate workspace (or, with a
    gate user, in that user's: ``user.GateWorkspaces``); a probe's gates share it (set-up output), and ignored files
    survive from one probe to the next unless ``pristine``. The rig's workspace is settled after each probe in the
    background (``workspace.used``); with ``hold_settle`` only once ``release_settle`` says the caller's work
    right after the gates (a push) is done."""

    def __init__(
        self,
        place: Place,
        env: dict[str, str],
        timeout: float,
        *,
        gate_workspaces: GateWorkspaces | None = None,
        pristine: bool = False,
        hold_settle: bool = False,
        on_first_gate: Callable[[], None] = lambda: None,
    ) -> None:
        self.place, self.env, self.timeout, self.pristine = place, env, timeout, pristine
        self.hold_settle = hold_settle
        self.gate_workspaces = gate_workspaces
        self.user: GateUser | None = gate_workspaces.user if gate_workspaces is not None else None
        self.on_first_gate = on_first_gate
        self.runs = 0
        self.seconds = 0.0

    def probe(
        self,
        commit: str,
        gates: Sequence[GateCommand],
        log_prefix: str,
        *,
        stop: threading.Event | None = None,
        on_gate: Callable[[str], None] = lambda _gate: None,
    ) -> list[GateResult]:
        """``gates`` run in order on ``commit`` until one fails (or ``stop`` is set): their results.

        Raises:
            GitError: the workspace could not be put at ``commit``.
        """
        results: list[GateResult] = []
        with self._workspace(commit) as (where, env):
            for gate in gates:
                if stop is not None and stop.is_set():
                    break
                on_gate(gate.gate)
                result = self._run(gate, where, env, f"{log_prefix}-{gate.gate}.log", stop)
                results.append(result)
                if result.exit_code != 0:
                    break
        return results

    @contextlib.contextmanager
    def _workspace(self, commit: str) -> Iterator[tuple[Path, dict[str, str]]]:
        place = self.place
        if self.gate_workspaces is None:
            used = workspace.used(place.clone, place.workspace, commit, pristine=self.pristine, hold=self.hold_settle)
            with used as where:
                yield where, self.env
            return
        user = self.gate_workspaces.user
        with self.gate_workspaces.prepared(place.home, place.clone, commit, pristine=self.pristine) as scratch:
            yield scratch / "work", gate_user_environment(user, self.env, scratch)

    def release_settle(self) -> None:
        """The settle of the last probe's workspace, held back (``hold_settle``), may start."""
        if self.gate_workspaces is None:
            workspace.release_settle(self.place.workspace)

    def _run(
        self, gate: GateCommand, work: Path, env: dict[str, str], log_name: str, stop: threading.Event | None
    ) -> GateResult:
        result = run_gate(
            gate.gate, gate.command, work, self.place.logs / log_name, self.timeout, env, self.user,
            records=self.place.records, stop=stop,
        )  # fmt: skip
        self.runs += 1
        self.seconds += result.seconds
        if self.runs == 1:
            self.on_first_gate()
        return result
