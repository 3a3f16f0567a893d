"""Running the checks of waiting ``ci`` gates (``plan/gates.py``): each in ``sh -c`` from a scratch directory with
the environment an automation's command gets (``shell.command_env``: never the deacon's NATS credentials),
``GT_BEAD``/``GT_STEP`` and the molecule's vars (``GT_VAR_<name>``), at most ``gate_timeout_s``, at most
``MAX_RUNNING`` at once. One that exits 0 has the mayor open the gate (``gt.cmd.gate.open`` under the gate's own
command id: a resend, or a run again after a crash, opens it once). The last run of each is kept for
``gt.q.deacon.gate_checks``, which the operator asks (a polecat session may not)."""

from __future__ import annotations

import asyncio
import functools
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path

import structlog

from services.deacon.automations import shell
from services.deacon.plan.gates import CiCheck, checks_due
from services.deacon.settings import DeaconSettings
from shared.bus.commands import StoredCommand
from shared.core.config import TownConfig
from shared.model.commands import Command, GateOpen
from shared.model.gates import CI_OUTPUT_SHOWN, MoleculeGates
from shared.model.queries.deacon import GateCheckView

log = structlog.get_logger(__name__)

COULD_NOT_START = -1
MAX_RUNNING = 4
"""Checks run at once at most: a town with many beads at a CI gate runs them in turns."""
VAR_ENV_PREFIX = "GT_VAR_"
"""A molecule var's name in a CI check's environment: ``GT_VAR_bead_title``."""


class GateChecks:
    def __init__(
        self,
        *,
        config: TownConfig,
        settings: Callable[[], DeaconSettings],
        gates: Callable[[], Mapping[str, MoleculeGates]],
        store: Callable[[Command], Awaitable[StoredCommand]],
        clock: Callable[[], datetime],
    ) -> None:
        self.config = config
        self.settings = settings
        self.gates = gates
        self.store = store
        self.clock = clock
        self._tg: asyncio.TaskGroup | None = None
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._last: dict[tuple[str, str], GateCheckView] = {}
        self.opened = 0
        """Gates this deacon had the mayor open."""

    def start(self, tg: asyncio.TaskGroup) -> None:
        self._tg = tg

    def reconcile(self) -> None:
        """Start the checks that are due (each in its own task: a slow check holds up nothing else)."""
        if self._tg is None:
            return
        waiting = self.gates()
        # A gate no longer waited on (opened, its bead closed) is forgotten: its last run is of no use.
        self._last = {key: view for key, view in self._last.items() if _waits(waiting, key)}
        settings = self.settings()
        last_run = {key: view.started_at for key, view in self._last.items()}
        for check in checks_due(waiting, self.clock(), last_run, self._running, settings.gate_poll_s):
            if len(self._running) >= MAX_RUNNING:
                break  # the rest at a later patrol
            task = self._tg.create_task(self._run(check, settings.gate_timeout_s), name=f"gate-check-{check.bead}")
            self._running[check.key] = task
            task.add_done_callback(functools.partial(self._finished, check.key))

    def _finished(self, key: tuple[str, str], _task: asyncio.Task[None]) -> None:
        self._running.pop(key, None)

    def views(self) -> list[GateCheckView]:
        return sorted(self._last.values(), key=lambda view: (view.bead, view.step))

    async def _run(self, check: CiCheck, timeout: float) -> None:
        started = self.clock()
        variables = {f"{VAR_ENV_PREFIX}{name}": value for name, value in check.vars.items()}
        env = shell.command_env(self.config, **variables, GT_BEAD=check.bead, GT_STEP=check.step)
        scratch = await asyncio.to_thread(tempfile.mkdtemp, prefix="gt-gate-check-")
        try:
            # In a directory of its own, not GT_HOME: nothing of the town's files is where it starts.
            result = await shell.run(check.command, cwd=Path(scratch), env=env, timeout=timeout)
        except OSError as exc:
            code, output = COULD_NOT_START, f"the check could not start: {exc}"
        except Exception as exc:  # a bug here must not take the deacon down: logged, the check runs again later
            log.exception("gate_check_error", bead=check.bead, step=check.step)
            code, output = COULD_NOT_START, f"the deacon failed to run it: {exc!r}"
        else:
            code, output = result.exit_code, result.output[-CI_OUTPUT_SHOWN:]
        finally:
            await asyncio.to_thread(shutil.rmtree, scratch, True)
        runs = self._last[check.key].runs + 1 if check.key in self._last else 1
        self._last[check.key] = GateCheckView(
            bead=check.bead,
            step=check.step,
            command=check.command,
            started_at=started,
            exit_code=code,
            output=output,
            runs=runs,
        )
        if code != 0:
            log.info("gate_check_failed", bead=check.bead, step=check.step, exit_code=code, output=output[-300:])
            return
        # Durable in GT_CMD: the mayor opens the gate when it takes it (now, or when it is back).
        try:
            await self.store(GateOpen(bead=check.bead, step=check.step, output=output, cmd_id=check.command_id))
        except Exception:  # never the deacon's end: the check runs again at its next poll, and stores it then
            log.exception("gate_open_not_stored", bead=check.bead, step=check.step)
            return
        self.opened += 1
        log.info("gate_check_passed", bead=check.bead, step=check.step)


def _waits(gates: Mapping[str, MoleculeGates], key: tuple[str, str]) -> bool:
    molecule = gates.get(key[0])
    waiting = molecule.waiting() if molecule is not None else None
    return waiting is not None and waiting[0] == key[1]
