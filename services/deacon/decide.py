"""The deacon's decisions on commands: leases (acquire, release), an automation's manual run, a sweep. Pure: the
time comes in the context, and the automation file a run names is read by ``prepare`` before (``ctx.facts``)."""

from __future__ import annotations

from services.deacon.automations import plan as automation_plan
from services.deacon.automations.definitions import Automation, InvalidAutomation
from services.deacon.plan import gc, leases
from services.deacon.state import DeaconState
from shared.commands import AutomationRun, Command, GcSweep, LeaseAcquire, LeaseRelease
from shared.decision import Accepted, DecideContext
from shared.errors import CommandError


def decide(
    state: DeaconState, cmd: Command, ctx: DecideContext, *, gc_ttl_s: float, holder: str, grace_s: float
) -> Accepted:
    """``holder`` and ``grace_s``: an automation run's holder (this deacon) and its grace before it counts as
    lost; ``gc_ttl_s``: how long finished things are kept before a sweep drops them."""
    if isinstance(cmd, LeaseAcquire):
        return leases.acquire(state.leases, cmd, ctx.now)
    if isinstance(cmd, LeaseRelease):
        return leases.release(state.leases, cmd)
    if isinstance(cmd, AutomationRun):
        found = ctx.facts if isinstance(ctx.facts, Automation | InvalidAutomation) else None
        return automation_plan.decide_run(state.automations, cmd, ctx, found, holder=holder, grace_s=grace_s)
    if isinstance(cmd, GcSweep):
        return gc.decide(state.gc, cmd, ctx.now, gc_ttl_s)
    raise CommandError("unknown_command", f"the deacon does not handle {cmd.SUBJECT}")


def aggregate_key(cmd: Command) -> str | None:
    """Commands with the same key are decided in order."""
    if isinstance(cmd, LeaseAcquire | LeaseRelease):
        return f"lease:{cmd.lease}"
    if isinstance(cmd, AutomationRun):
        return f"automation:{cmd.name}"
    if isinstance(cmd, GcSweep):
        return "gc"
    return None
