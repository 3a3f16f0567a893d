"""Who this ``gt`` process acts as: the one place the CLI decides it.

Inside a polecat session (the witness sets ``GT_RIG`` and ``GT_POLECAT``) every command the CLI sends carries
the actor ``polecat:<rig>/<polecat>``; elsewhere it carries none, and the owning service records ``operator``.
An explicit ``--actor`` (a command body's ``actor``) still wins.

For now the session's environment says who it is; once each session has a NATS identity of its own, the
actor comes from who may publish, and this module is what changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

OPERATOR = "operator"
"""What the services record when a command names no actor."""


def session_actor(env: Mapping[str, str] | None = None) -> str | None:
    """``polecat:<rig>/<polecat>`` of the polecat session this process runs in; None outside one."""
    env = os.environ if env is None else env
    rig, polecat = env.get("GT_RIG", "").strip(), env.get("GT_POLECAT", "").strip()
    if not rig or not polecat:
        return None
    return f"polecat:{rig}/{polecat}"


def default_actor(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The actor a command carries: ``explicit`` when given, else the session's polecat, else None (the
    service then records ``operator``)."""
    return explicit or session_actor(env)
