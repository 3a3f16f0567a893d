"""Who this ``gt`` process acts as: the one place the CLI decides it.

Inside a polecat session (the witness sets ``GT_RIG``, ``GT_POLECAT`` and ``GT_SESSION``) every command goes
to the session's own subject (``gt.cmd.step.done.<rig>.<polecat>.<session>``): the services record its actor as
``polecat:<rig>/<polecat>`` from that subject, whatever the body says, and under the shipped NATS accounts the
session's own identity may publish nowhere else (docs/architecture.md, "Identity"). Elsewhere a command goes to
its plain subject, an operator's, unless this process is a town agent's (``GT_TOWN_AGENT``: the mayor agent), whose
commands go to its own subject (``gt.cmd.bead.create.agent.mayor``), recorded as ``agent:mayor``. On a plain subject
the body's ``actor`` (``--actor``) labels the operator (``operator:ann``; none:
the service records ``operator``). A service's or an agent's name there is refused ``unauthorized``: the services
send on their own subjects, which operators may not publish on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from shared.core import subjects

OPERATOR = "operator"
"""What the services record when a command names no actor."""


def session_actor(env: Mapping[str, str] | None = None) -> str | None:
    """``polecat:<rig>/<polecat>`` of the polecat session this process runs in; None outside one."""
    env = os.environ if env is None else env
    rig, polecat = env.get("GT_RIG", "").strip(), env.get("GT_POLECAT", "").strip()
    if not rig or not polecat:
        return None
    return f"polecat:{rig}/{polecat}"


def session_origin(env: Mapping[str, str] | None = None) -> subjects.SessionOrigin | None:
    """The polecat session this process runs in, as its command subjects name it; None outside one."""
    env = os.environ if env is None else env
    rig, polecat = env.get("GT_RIG", "").strip(), env.get("GT_POLECAT", "").strip()
    session = env.get("GT_SESSION", "").strip()
    if not rig or not polecat or not session:
        return None
    return subjects.SessionOrigin(rig, polecat, session)


TOWN_AGENT_ENV = subjects.TOWN_AGENT_ENV


def town_agent_origin(env: Mapping[str, str] | None = None) -> subjects.TownAgentOrigin | None:
    """The town agent this process runs as (``GT_TOWN_AGENT``), outside a polecat session; None otherwise."""
    env = os.environ if env is None else env
    name = env.get(TOWN_AGENT_ENV, "").strip()
    return subjects.TownAgentOrigin(name) if name and session_origin(env) is None else None


def command_origin(env: Mapping[str, str] | None = None) -> subjects.Origin | None:
    """The subject a command of this process names its sender by: its polecat session, its town agent, or none (a
    plain subject: an operator's)."""
    return session_origin(env) or town_agent_origin(env)


def default_actor(explicit: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The actor a command carries: ``explicit`` when given, else the session's polecat, else None (the
    service then records ``operator``)."""
    return explicit or session_actor(env)
