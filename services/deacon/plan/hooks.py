"""Stale hooks: a working bead whose hook lease lapsed (released or expired, nobody took it since) for longer
than ``after_s``, with no merge request waiting, is handed to the witness (``gt.cmd.session.recover_hook``),
which re-slings or escalates it. The deacon tracks only beads that are slung and not closed. Pure."""

from __future__ import annotations

import functools
from datetime import datetime

import msgspec

from services.deacon.plan.leases import LeaseState
from shared.events import (
    BeadClaimed,
    BeadClosed,
    BeadSlung,
    BeadUnslung,
    Envelope,
    Event,
    MergeRequestConflicted,
    MergeRequestFailed,
    MergeRequestRejected,
    MergeRequestSubmitted,
)
from shared.events.beads import BeadStatus, forward
from shared.ids import hook_lease_name, is_valid_id, stable_digest_id


class HookedBead(msgspec.Struct, kw_only=True, gc=False):
    id: str
    status: BeadStatus = "hooked"
    merge_pending: str | None = None
    """The merge request waiting in the queue (the hook is free while the refinery works on it)."""


class HookState(msgspec.Struct, kw_only=True):
    beads: dict[str, HookedBead] = {}
    """Slung beads not closed yet, by id."""
    by_lease: dict[str, str] = {}
    """Hook lease name -> its bead."""
    mr_beads: dict[str, str] = {}
    """Merge requests waiting in the queue -> their bead."""


@functools.singledispatch
def fold(payload: Event, state: HookState, env: Envelope, seq: int) -> None:
    """Other events change nothing here."""


@fold.register
def _slung(payload: BeadSlung, state: HookState, env: Envelope, seq: int) -> None:
    bead = state.beads.get(payload.bead_id)
    if bead is None:
        bead = state.beads[payload.bead_id] = HookedBead(id=payload.bead_id)
        state.by_lease[hook_lease_name(payload.bead_id)] = payload.bead_id
    if bead.merge_pending is not None:
        state.mr_beads.pop(bead.merge_pending, None)
        bead.merge_pending = None


@fold.register
def _claimed(payload: BeadClaimed, state: HookState, env: Envelope, seq: int) -> None:
    if (bead := state.beads.get(payload.bead_id)) is not None:
        bead.status = forward(bead.status, "in_progress")


def _untrack(state: HookState, bead_id: str) -> None:
    bead = state.beads.pop(bead_id, None)
    if bead is not None:
        state.by_lease.pop(hook_lease_name(bead.id), None)
        if bead.merge_pending is not None:
            state.mr_beads.pop(bead.merge_pending, None)


@fold.register
def _closed(payload: BeadClosed, state: HookState, env: Envelope, seq: int) -> None:
    _untrack(state, payload.bead_id)


@fold.register
def _unslung(payload: BeadUnslung, state: HookState, env: Envelope, seq: int) -> None:
    """An operator gave the hook back: its lease is released on purpose, never a stale hook (until slung again)."""
    _untrack(state, payload.bead_id)


@fold.register
def _submitted(payload: MergeRequestSubmitted, state: HookState, env: Envelope, seq: int) -> None:
    if (bead := state.beads.get(payload.bead)) is not None:
        if bead.merge_pending is not None:
            state.mr_beads.pop(bead.merge_pending, None)
        bead.merge_pending = payload.mr_id
        state.mr_beads[payload.mr_id] = bead.id


def _mr_ended(state: HookState, mr_id: str) -> None:
    bead_id = state.mr_beads.pop(mr_id, None)
    bead = state.beads.get(bead_id or "")
    if bead is not None and bead.merge_pending == mr_id:
        bead.merge_pending = None


@fold.register
def _mr_failed(payload: MergeRequestFailed, state: HookState, env: Envelope, seq: int) -> None:
    _mr_ended(state, payload.mr_id)


@fold.register
def _mr_conflicted(payload: MergeRequestConflicted, state: HookState, env: Envelope, seq: int) -> None:
    if payload.sent_back:  # finished: the agent resolves it in a fresh session (a blocked one still waits)
        _mr_ended(state, payload.mr_id)


@fold.register
def _mr_rejected(payload: MergeRequestRejected, state: HookState, env: Envelope, seq: int) -> None:
    _mr_ended(state, payload.mr_id)


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
