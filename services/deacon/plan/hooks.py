"""Stale hooks: a working bead whose hook lease lapsed (released or expired, nobody took it since) for longer
than ``after_s``, with no merge request waiting, is handed to the witness (``gt.cmd.session.recover_hook``),
which re-slings or escalates it. The deacon tracks only beads that are slung and not closed. Pure."""

from __future__ import annotations

from datetime import datetime

import msgspec

from services.deacon.plan.liveness import family_down
from services.deacon.state import HookState, LeaseState, LivenessState
from shared.core.ids import is_valid_id, stable_digest_id

HOOK_MOVERS = ("witness", "refinery")
"""Services that move a bead on from its hook (sessions, merges); witnesses of a few rigs each count too."""


class StaleHook(msgspec.Struct, frozen=True, kw_only=True):
    bead: str
    token: int
    holder: str
    """The session whose lease lapsed."""

    @property
    def command_id(self) -> str:
        raw = f"stale-hook-{self.bead}-{self.token}"
        return raw if is_valid_id(raw) else stable_digest_id(raw, prefix="stale-hook")


def stale(hooks: HookState, leases: LeaseState, now: datetime, after_s: float) -> list[StaleHook]:
    """Every working bead whose hook lease lapsed more than ``after_s`` ago, with nothing in the merge queue."""
    out = []
    for name, bead_id in hooks.by_lease.items():
        lease = leases.leases.get(name)
        bead = hooks.beads.get(bead_id)
        if lease is None or bead is None or lease.status == "held" or lease.ended_at is None:
            continue
        if bead.merge_pending is not None or (now - lease.ended_at).total_seconds() < after_s:
            continue
        out.append(StaleHook(bead=bead_id, token=lease.token, holder=lease.holder))
    return out


def to_hand_over(
    hooks: HookState, leases: LeaseState, liveness: LivenessState, now: datetime, after_s: float
) -> list[StaleHook]:
    """The stale hooks to hand to the witness now: none while a service that moves beads on is down (a hook
    waiting on it is not stale: it moves once that one is back)."""
    if any(family_down(liveness, service) for service in HOOK_MOVERS):
        return []
    return stale(hooks, leases, now, after_s)
