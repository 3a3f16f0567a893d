"""The refinery's decisions on commands: a branch enters its rig's merge queue. Pure."""

from __future__ import annotations

import hashlib

import msgspec

from services.refinery.state import MergeRequest, RefineryState
from shared.commands import Command, MergeRequestSubmit
from shared.decision import Accepted, DecideContext, NewEvent
from shared.errors import CommandError
from shared.events import MergeRequestSubmitted


def mr_id_for(rig: str, head: str) -> str:
    """The same commit submitted twice to one rig is one merge request."""
    return "mr-" + hashlib.blake2b(f"{rig}:{head}".encode()).hexdigest()[:12]


def aggregate_key(cmd: Command) -> str | None:
    if isinstance(cmd, MergeRequestSubmit):
        return f"mr:{mr_id_for(cmd.rig, cmd.head)}"
    return None


def mr_view(mr: MergeRequest) -> dict[str, object]:
    view: dict[str, object] = msgspec.to_builtins(mr)
    return view


def decide(state: RefineryState, cmd: Command, ctx: DecideContext) -> Accepted:
    if isinstance(cmd, MergeRequestSubmit):
        return submit(state, cmd)
    raise CommandError("unknown_command", f"the refinery does not handle {cmd.SUBJECT}")


def submit(state: RefineryState, cmd: MergeRequestSubmit) -> Accepted:
    if cmd.rig not in state.rigs:
        raise CommandError("not_found", f"no rig {cmd.rig!r} (`gt rig list` shows them)")
    if cmd.bead not in state.bead_rigs:
        raise CommandError("not_found", f"no bead {cmd.bead!r} to merge work for")
    slung_to = state.bead_rigs[cmd.bead]
    if slung_to is not None and slung_to != cmd.rig:
        raise CommandError("invalid", f"bead {cmd.bead} is slung to rig {slung_to}, not {cmd.rig}")
    mr_id = mr_id_for(cmd.rig, cmd.head)
    existing = state.mrs.get(mr_id)
    if existing is not None:
        return Accepted(result={**mr_view(existing), "changed": False})
    event = MergeRequestSubmitted(
        mr_id=mr_id,
        bead=cmd.bead,
        rig=cmd.rig,
        branch=cmd.branch,
        target=cmd.target or state.rigs[cmd.rig],
        head=cmd.head,
        priority=cmd.priority,
        session=cmd.session,
    )
    return Accepted(
        events=[NewEvent(payload=event, expected_seq=0)],
        result={"id": mr_id, "status": "queued", "changed": True, "bead": cmd.bead, "rig": cmd.rig, "head": cmd.head},
    )
