"""Automations, run by the deacon: the adapter around the pure ``automations.plan``.

Each reconcile reads the files (cached by modification time), records how finished commands ended, starts
the condition checks that are due, and asks the plan which gates are open. A due automation gets
``automation.fired`` (appended with the aggregate's expected sequence, before anything runs); then each open
run is moved on: an exec command started in the background, a formula run's commands sent to the mayor under
ids fixed by the run, and the end recorded. The processes this runs and the checks' results live in memory
only: they are what the deacon is doing, not what happened, and a restarted deacon finds every open run in
the log (see docs/automations.md for what it does with each).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import structlog

from services.deacon.automations import plan as automation_plan
from services.deacon.automations import queries as automation_views
from services.deacon.automations import shell
from services.deacon.automations.definitions import (
    DEFAULT_TIMEOUT_S,
    Automation,
    AutomationCatalog,
    AutomationSettings,
    Definitions,
    InvalidAutomation,
)
from services.deacon.automations.plan import CheckResult, Fire, Plan, SendCommand, Settle, StartExec, Step
from services.deacon.automations.state import AutomationState, Run
from services.deacon.effects.event_scan import EventScanner
from shared.bus.commands import StoreCommand
from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.core import ids
from shared.core.config import TownConfig
from shared.core.faults import crash_point
from shared.model.commands import BeadCreate, BeadSling
from shared.model.decision import NewEvent
from shared.model.events import AutomationCompleted, AutomationFailed
from shared.model.queries import deacon

log = structlog.get_logger(__name__)

AppendOwed = Callable[[list[NewEvent]], Awaitable[int]]
WAKE_SLACK_S = 0.05
"""Added to a timed wake so the clock has surely passed the moment when the reconcile reads it."""


class AutomationRunner:
    def __init__(
        self,
        *,
        config: TownConfig,
        settings: AutomationSettings,
        state: Callable[[], AutomationState],
        last_seq: Callable[[], int],
        append_owed: AppendOwed,
        store: StoreCommand,
        clock: Callable[[], datetime],
        wake: Callable[[], None],
        holder: str,
        new_run_id: Callable[[], str] = lambda: ids.random_bead_id("run"),
    ) -> None:
        self.config = config
        self.settings = settings
        self.catalog = AutomationCatalog(settings.directory)
        self.holder = holder
        """Who this deacon process is in ``automation.fired`` (an exec run is only ever run by its holder)."""
        self._state = state
        self._last_seq = last_seq
        self._append_owed = append_owed
        self._store = store
        self._clock = clock
        self._wake = wake
        self._new_run_id = new_run_id
        self._tg: asyncio.TaskGroup | None = None
        self._scanner: EventScanner | None = None
        self._running: dict[str, asyncio.Task[None]] = {}
        """Exec runs this process is executing, by run id."""
        self._results: dict[str, tuple[str, AutomationCompleted | AutomationFailed]] = {}
        """Exec runs that ended here and whose end is not recorded yet: run id -> (automation, event)."""
        self._sent: set[str] = set()
        """Formula runs' command ids sent by this process (sent again only after a restart)."""
        self._checks: dict[str, CheckResult] = {}
        self._checking: dict[str, asyncio.Task[None]] = {}
        self._reported: dict[str, str] = {}
        self._loaded: frozenset[str] | None = None
        self._wake_handle: asyncio.TimerHandle | None = None
        self._wake_at: datetime | None = None
        self.definitions = Definitions()
        self.plan = Plan()
        self.fired = self.completed = self.failed = self.checks_run = self.scan_errors = 0

    def start(self, tg: asyncio.TaskGroup, nc: Connection) -> None:
        """Once caught up with the log: from now on runs may start."""
        self._tg = tg
        self._scanner = EventScanner(nc, self.config.evt_stream)

    def lookup(self, name: str) -> Automation | InvalidAutomation | None:
        """The file of ``name`` as it reads now (for deciding ``gt.cmd.automation.run``)."""
        defs = self.load()
        return defs.automations.get(name) or defs.invalid.get(name)

    def load(self) -> Definitions:
        defs = self.definitions = self.catalog.load()
        for name, broken in defs.invalid.items():
            if self._reported.get(name) != broken.message:
                self._reported[name] = broken.message
                if broken.refused:
                    log.warning("automation_file_refused", automation=name, file=broken.path, reason=broken.problem)
                    continue
                log.warning(
                    "automation_invalid", automation=name, file=broken.path, field=broken.field, problem=broken.problem
                )
        for name in set(self._reported) - set(defs.invalid):
            del self._reported[name]
        names = frozenset(defs.automations)
        if names != self._loaded:
            self._loaded = names
            log.info("automations_loaded", directory=str(self.catalog.directory), automations=sorted(names))
        return defs

    def query(self, query: deacon.Automations | deacon.Automation) -> Any:
        """``gt.q.deacon.automations`` (every one) and ``gt.q.deacon.automation`` (``name``, with its history)."""
        defs = self.load()
        now = self._clock()
        if isinstance(query, deacon.Automations):
            return automation_views.list_view(defs, self._state(), self.plan.waiting, now)
        return automation_views.detail_view(query.name, defs, self._state(), self.plan.waiting, now)

    def status(self) -> dict[str, Any]:
        return {
            "automations": len(self.definitions.automations),
            "automations_invalid": sorted(self.definitions.invalid),
            "automation_runs_open": sorted(n for n, r in self._state().automations.items() if r.open is not None),
            "automations_fired": self.fired,
            "automations_completed": self.completed,
            "automations_failed": self.failed,
            "automation_checks_run": self.checks_run,
            "automation_scan_errors": self.scan_errors,
        }

    # ---- one pass ------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        if self._tg is None:
            return
        defs = self.load()
        await self._record_results()
        now = self._clock()
        state = self._state()
        self._start_checks(defs, state, now)
        matched = await self._scan(defs, state)
        plan = self.plan = automation_plan.due(defs.automations, state, now, matched=matched, checks=self._checks)
        for fire in plan.fires:
            await self._fire(defs.automations[fire.automation], fire, now)
        steps = automation_plan.run_steps(state, self._clock(), holder=self.holder, active=self._active())
        for step in steps.steps:
            await self._carry_out(step)
        self._sent &= set(state.awaited)  # ids of runs that ended are not needed any more
        wakes = [t for t in (plan.wake_at, steps.wake_at) if t is not None]
        if wakes:
            self._schedule_wake(min(wakes), self._clock())

    def _active(self) -> set[str]:
        return set(self._running) | set(self._results)

    async def _fire(self, auto: Automation, fire: Fire, now: datetime) -> None:
        event = automation_plan.fired_event(
            auto,
            run_id=self._new_run_id(),
            gate=fire.gate,
            reason=fire.reason,
            cursor=fire.cursor,
            now=now,
            holder=self.holder,
            grace_s=self.settings.grace_s,
        )
        crash_point("deacon.before_fire")
        if await self._append_owed([NewEvent(payload=event, expected_seq=fire.expected_seq)]):
            self.fired += 1
            log.info("automation_fired", automation=auto.name, run=event.run_id, gate=fire.gate, reason=fire.reason)

    async def _carry_out(self, step: Step) -> None:
        state = self._state()
        if isinstance(step, StartExec):
            record = state.automations.get(step.automation)
            if record is None or record.open is None or record.open.id != step.run.id or step.run.id in self._active():
                return  # settled or started meanwhile
            crash_point("deacon.after_fired")
            assert self._tg is not None
            task = self._tg.create_task(self._execute(step.automation, step.run), name=f"automation-{step.run.id}")
            self._running[step.run.id] = task
            task.add_done_callback(functools.partial(_forget, self._running, step.run.id))
        elif isinstance(step, SendCommand):
            cmd = step.command
            assert cmd.cmd_id is not None
            if cmd.cmd_id in self._sent:
                return
            if isinstance(cmd, BeadCreate):
                crash_point("deacon.after_fired")
            await self._store(cmd)
            self._sent.add(cmd.cmd_id)
            log.info("automation_command_sent", automation=step.automation, run=step.run_id, command=cmd.SUBJECT)
            if isinstance(cmd, BeadSling):
                crash_point("deacon.after_sling")
        else:
            await self._settle(step)

    async def _settle(self, step: Settle) -> None:
        event = step.event
        if await self._append_owed([NewEvent(payload=event, expected_seq=step.expected_seq)]):
            self._count(event)

    def _count(self, event: AutomationCompleted | AutomationFailed) -> None:
        if isinstance(event, AutomationCompleted):
            self.completed += 1
            log.info("automation_completed", automation=event.automation, run=event.run_id, result=event.result[:200])
        else:
            self.failed += 1
            log.info(
                "automation_failed",
                automation=event.automation,
                run=event.run_id,
                error=event.error[:200],
                exit_code=event.exit_code,
            )

    async def _record_results(self) -> None:
        """Store how this process's exec runs ended; a run settled by someone else meanwhile is let go."""
        for run_id, (name, event) in list(self._results.items()):
            record = self._state().automations.get(name)
            if record is None or record.open is None or record.open.id != run_id:
                del self._results[run_id]
                log.warning("automation_result_dropped", automation=name, run=run_id, reason="the run was settled")
                continue
            if await self._append_owed([NewEvent(payload=event, expected_seq=record.version)]):
                del self._results[run_id]
                self._count(event)

    # ---- exec actions and condition checks -----------------------------------------------------

    def _env(self, name: str, **extra: str) -> dict[str, str]:
        """A command's environment: ``shell.BASE_ENV`` of the deacon's, the town's ``NATS_URL`` and ``GT_HOME``
        and the run's variables; never the deacon's NATS credentials or the town's settings."""
        return shell.command_env(self.config, GT_AUTOMATION=name, **extra)

    async def _execute(self, name: str, run: Run) -> None:
        extra = {"GT_AUTOMATION_RUN": run.id, "GT_AUTOMATION_GATE": run.gate}
        if run.cursor is not None:
            extra["GT_AUTOMATION_EVENT_SEQ"] = str(run.cursor)
        timeout = run.timeout_s or DEFAULT_TIMEOUT_S
        log.info("automation_exec_started", automation=name, run=run.id, command=run.exec[:200])
        event: AutomationCompleted | AutomationFailed
        try:
            env = self._env(name, **extra)
            result = await shell.run(run.exec, cwd=self.catalog.directory, env=env, timeout=timeout)
        except OSError as exc:
            event = AutomationFailed(automation=name, run_id=run.id, error=f"the command could not start: {exc}")
        except Exception as exc:
            # A bug here must not take the deacon down with it: the run is recorded failed and the
            # traceback logged. Cancellation (the deacon stopping) is not an Exception and passes.
            log.exception("automation_exec_error", automation=name, run=run.id)
            event = AutomationFailed(automation=name, run_id=run.id, error=f"the deacon failed to run it: {exc!r}")
        else:
            crash_point("deacon.after_exec")
            tail = result.output[-automation_plan.MAX_RESULT :]
            if result.timed_out:
                error = f"timed out after {timeout:g}s" + (f"; output ends:\n{tail}" if tail else "")
                event = AutomationFailed(automation=name, run_id=run.id, error=error, exit_code=result.exit_code)
            elif result.exit_code != 0:
                error = f"exit {result.exit_code}" + (f"; output ends:\n{tail}" if tail else "")
                event = AutomationFailed(automation=name, run_id=run.id, error=error, exit_code=result.exit_code)
            else:
                event = AutomationCompleted(automation=name, run_id=run.id, result=tail or "exit 0")
        self._results[run.id] = (name, event)
        self._wake()

    def _start_checks(self, defs: Definitions, state: AutomationState, now: datetime) -> None:
        for name in set(self._checks) - set(defs.automations):
            del self._checks[name]
        due = automation_plan.checks_to_run(defs.automations, state, now, self._checks, set(self._checking))
        for name in due:
            assert self._tg is not None
            task = self._tg.create_task(self._check(defs.automations[name], now), name=f"automation-check-{name}")
            self._checking[name] = task
            task.add_done_callback(functools.partial(_forget, self._checking, name))

    async def _check(self, auto: Automation, at: datetime) -> None:
        assert auto.check is not None
        try:
            result = await shell.run(
                auto.check, cwd=self.catalog.directory, env=self._env(auto.name), timeout=auto.check_timeout_s
            )
            checked = CheckResult(at=at, exit_code=result.exit_code, output=result.output[-500:])
        except OSError as exc:
            log.warning("automation_check_failed", automation=auto.name, error=str(exc))
            checked = CheckResult(at=at, exit_code=127, output=f"could not start: {exc}")
        self.checks_run += 1
        self._checks[auto.name] = checked
        log.debug("automation_checked", automation=auto.name, exit_code=checked.exit_code)
        self._wake()

    async def _scan(self, defs: Definitions, state: AutomationState) -> dict[str, int]:
        """For event gates with a subject filter: the newest matching event's sequence, by automation."""
        assert self._scanner is not None
        self._scanner.forget_except(set(defs.automations))
        matched: dict[str, int] = {}
        upto = self._last_seq()
        for name, auto in sorted(defs.automations.items()):
            if auto.gate != "event" or auto.subject is None or auto.on is None or not auto.enabled:
                continue
            record = state.automations.get(name)
            if record is not None and record.open is not None:
                continue
            try:
                seq = await self._scanner.newest_match(
                    name, auto.on, auto.subject, cursor=record.cursor if record else 0, upto=upto
                )
            except (BusError, TimeoutError) as exc:
                self.scan_errors += 1
                log.warning("automation_scan_failed", automation=name, error=repr(exc))
                continue
            if seq is not None:
                matched[name] = seq
        return matched

    def _schedule_wake(self, when: datetime, now: datetime) -> None:
        if self._wake_handle is not None and self._wake_at == when:
            return
        if self._wake_handle is not None:
            self._wake_handle.cancel()
        delay = max(0.0, (when - now) / timedelta(seconds=1)) + WAKE_SLACK_S
        self._wake_at = when
        self._wake_handle = asyncio.get_running_loop().call_later(delay, self._wake)


def _forget(tasks: dict[str, asyncio.Task[None]], key: str, _done: asyncio.Task[None]) -> None:
    tasks.pop(key, None)
