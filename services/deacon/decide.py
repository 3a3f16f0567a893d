"""The deacon's decisions on commands: leases (acquire, release), an automation's manual run, a sweep. Pure: the
time comes in the context, and the automation file a run names is read by ``prepare`` before (``ctx.facts``).

Lease acquire and release are decided on the record of every lease (``shared.model.leases``: the record, its fold
and the events that move it). The log holds acquisitions, releases and expiries; renewals live in the
``GT_LEASES`` KV bucket, so holders renew as often as they like without growing the log."""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.deacon.automations import plan as automation_plan
from services.deacon.automations.definitions import Automation, InvalidAutomation
from services.deacon.plan import gc
from services.deacon.state import DeaconState, GcState, LeaseState
from shared.core.errors import CommandError
from shared.model.commands import AutomationRun, Command, GcSweep, LeaseAcquire, LeaseRelease
from shared.model.decision import Accepted, DecideContext
from shared.model.events import GcSwept
from shared.model.leases import Lease, acquisition
from shared.model.leases import release as release_event
from shared.model.results import GcResult, LeaseResult


def decide(
    state: DeaconState, cmd: Command, ctx: DecideContext, *, gc_ttl_s: float, holder: str, grace_s: float
) -> Accepted:
    """``holder`` and ``grace_s``: an automation run's holder (this deacon) and its grace before it counts as
    lost; ``gc_ttl_s``: how long finished things are kept before a sweep drops them."""
    match cmd:
        case LeaseAcquire():
            return acquire(state.leases, cmd, ctx.now)
        case LeaseRelease():
            return release(state.leases, cmd)
        case AutomationRun():
            found = ctx.facts if isinstance(ctx.facts, Automation | InvalidAutomation) else None
            return automation_plan.decide_run(state.automations, cmd, ctx, found, holder=holder, grace_s=grace_s)
        case GcSweep():
            return sweep(state.gc, cmd, ctx.now, gc_ttl_s)
    raise CommandError("unknown_command", f"the deacon does not handle {cmd.SUBJECT}")


def unchanged(lease: Lease) -> LeaseResult:
    """Asked again of what is already so: the lease's whole record."""
    return msgspec.convert({**msgspec.to_builtins(lease), "changed": False}, LeaseResult)


def acquire(state: LeaseState, cmd: LeaseAcquire, now: datetime) -> Accepted[LeaseResult]:
    lease = state.leases.get(cmd.lease)
    if lease is not None and lease.status == "held":
        if lease.holder == cmd.holder:
            return Accepted(result=unchanged(lease))
        raise CommandError(
            "conflict",
            f"lease {cmd.lease} is held by {lease.holder} (token {lease.token}) until it is released or expires "
            f"(TTL {lease.ttl_s:g} s after its last renewal)",
        )
    event, token = acquisition(lease, cmd.lease, cmd.holder, cmd.ttl_s, now)
    return Accepted(
        events=[event],
        result=LeaseResult(lease=cmd.lease, holder=cmd.holder, token=token, ttl_s=cmd.ttl_s, changed=True),
    )


def release(state: LeaseState, cmd: LeaseRelease) -> Accepted[LeaseResult]:
    lease = state.leases.get(cmd.lease)
    if lease is None:
        raise CommandError("not_found", f"no lease {cmd.lease!r}")
    if lease.token != cmd.token or lease.holder != cmd.holder:
        raise CommandError(
            "conflict", f"fenced: lease {cmd.lease} is at token {lease.token} of {lease.holder}, not {cmd.token}"
        )
    if lease.status == "released":
        return Accepted(result=unchanged(lease))
    if lease.status == "expired":
        raise CommandError("conflict", f"fenced: lease {cmd.lease} token {cmd.token} expired before the release")
    return Accepted(
        events=[release_event(lease)],
        result=LeaseResult(lease=cmd.lease, token=cmd.token, status="released", changed=True),
    )


def sweep(state: GcState, cmd: GcSweep, now: datetime, default_ttl_s: float) -> Accepted[GcResult]:
    """``gt.cmd.gc.sweep``: a sweep now, with the command's ``ttl_s`` or the deacon's own."""
    ttl_s = default_ttl_s if cmd.ttl_s is None else cmd.ttl_s
    new = gc.sweep(state, now, ttl_s)
    assert isinstance(new.payload, GcSwept)
    return Accepted(
        events=[new], result=GcResult(id="gc", cutoff=new.payload.cutoff.isoformat(), ttl_s=ttl_s, changed=True)
    )
