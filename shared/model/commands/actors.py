"""Who may send commands, by name: the services and their scopes, what a service acts for (the deacon's
automations), polecats and plugins. Pure vocabulary; the intake decides *who* sent a command from the subject it
came on (``shared.service.intake.identity``) and reads these names to say what a body's ``actor`` may claim."""

from __future__ import annotations

from typing import Literal

from shared.core import subjects

ActorClass = Literal["service", "operator", "agent"]
"""The class a command is charged under for rate limits: decided by the subject it came on."""
SERVICE_ACTORS = ("mayor", "witness", "refinery", "deacon")
SCOPED_SERVICE = "witness"
"""The service whose instances split the town by rig: each scope acts as ``witness-<scope>``."""
POLECAT_PREFIX = "polecat:"
PLUGIN_PREFIX = "plugin:"
AUTOMATION_PREFIX = "automation:"
TOWN_AGENT_PREFIX = "agent:"
TOWN_AGENTS = subjects.TOWN_AGENTS
AGENT_PREFIXES = (POLECAT_PREFIX, PLUGIN_PREFIX)
SUB_ACTORS: dict[str, tuple[str, ...]] = {"deacon": (AUTOMATION_PREFIX,)}
"""Whom a service may name as a command's actor in its body, besides itself: the deacon runs each automation as
``automation:<name>``. Any other actor in the body of a service's command is refused."""


def is_service(name: str) -> bool:
    """A service scope that sends commands: ``mayor``, ``witness`` or one of its scopes (``witness-<rigs>``),
    ``refinery``, ``deacon``."""
    scope = f"{SCOPED_SERVICE}-"
    return name in SERVICE_ACTORS or (name.startswith(scope) and len(name) > len(scope))


def may_act_for(service: str, actor: str) -> bool:
    """Whether service scope ``service`` may name ``actor`` (not itself) in a command's body (``SUB_ACTORS``)."""
    base = service.split("-", 1)[0]
    return any(actor.startswith(p) and len(actor) > len(p) for p in SUB_ACTORS.get(base, ()))


def sub_actors_of(service: str) -> tuple[str, ...]:
    """The prefixes of what service scope ``service`` acts for (none: only itself)."""
    return SUB_ACTORS.get(service.split("-", 1)[0], ())


def actor_class(actor: str) -> ActorClass:
    """The class an actor's name belongs to: the names a command on a plain subject may not take (a service's, an
    agent's), and the limits of one whose class no subject says."""
    if actor.startswith(AGENT_PREFIXES):
        return "agent"
    name = actor.split("/", 1)[0].split("-", 1)[0]  # witness/<rig>, witness-<scope>
    if name in SERVICE_ACTORS or actor.startswith(AUTOMATION_PREFIX):
        return "service"
    return "operator"


def reserved(label: str) -> str | None:
    """What ``label`` is reserved for, when it names anyone but an operator (in any case, spaces around it)."""
    name = label.strip().casefold()
    if name.startswith(AUTOMATION_PREFIX):
        return "an automation's name (the deacon runs automations)"
    if name.startswith(TOWN_AGENT_PREFIX):
        return "a town agent's name (the mayor agent sends on its own subject)"
    if name.startswith(POLECAT_PREFIX):
        return "a polecat's name (its sessions send on their own subjects)"
    if actor_class(name) == "service":
        return "a service's name"
    return None
