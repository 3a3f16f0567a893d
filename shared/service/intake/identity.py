"""Who a command is from, decided by the subject it came on (docs/architecture.md, "Identity"), and what its body
may claim: the refusals (``unauthorized``) of a body naming someone its sender may not act as. The names
themselves (services, their scopes, what a service acts for) are the model's: ``shared.model.commands.actors``."""

from __future__ import annotations

from typing import NamedTuple

from shared.core import ids, subjects
from shared.core.errors import CommandError
from shared.model.commands import Command
from shared.model.commands.actors import (
    PLUGIN_PREFIX,
    TOWN_AGENTS,
    ActorClass,
    actor_class,
    is_service,
    may_act_for,
    reserved,
    sub_actors_of,
)
from shared.model.session_identity import TOWN_AGENT_COMMANDS

OPERATOR = "operator"
"""The actor of a command on a plain subject whose body names none."""
_PLAIN = subjects.command_subject("<aggregate>", "<verb>")
"""How a rejection names a plain command subject."""


class Sender(NamedTuple):
    """Who a command is from, as the intake records it, and the class whose rate limits it is charged under: both
    decided by the subject it came on, which the NATS permissions decide who may publish on."""

    actor: str
    cls: ActorClass


def command_actor(
    body_actor: str | None, origin: subjects.Origin | None, *, before_cutover: bool = False, command: str = ""
) -> Sender | CommandError:
    """Who a command is from, or the ``unauthorized`` rejection of a body that names someone its sender may not
    act as.

    - On a polecat session's own subject: its polecat (``polecat:<rig>/<polecat>``), whatever its body says; only
      that session may publish there.
    - On a service's own subject (``gt.cmd.<aggregate>.<verb>.svc.<service>``): that service; its body may name
      only what the service acts for (``SUB_ACTORS``: the deacon's ``automation:<name>``).
    - On a town agent's own subject (``gt.cmd.<aggregate>.<verb>.agent.<name>``): that agent, ``agent:<name>``
      (the mayor agent), charged as an operator; its body's ``actor`` is not read.
    - On a plain subject: an operator. The body's ``actor`` labels the operator (``operator``, ``operator:ann``,
      ``supervisor``, ``plugin:<name>``, any free label), but never a service's, an automation's or a polecat's
      name: only operators may publish plain subjects, and the services and sessions never send on them.

    ``command``: its own subject (``gt.cmd.bead.create``): a town agent may send only ``TOWN_AGENT_COMMANDS``.
    ``before_cutover``: a command on a plain subject stored before this town's services decided the actor by the
    subject (``topology.ORIGIN_CUTOVER_KEY``): settled by the rule it was sent under, its body's actor."""
    if isinstance(origin, subjects.SessionOrigin):
        return Sender(origin.actor, "agent")
    if isinstance(origin, subjects.ServiceOrigin):
        return _service_sender(body_actor, origin)
    if isinstance(origin, subjects.TownAgentOrigin):
        if origin.name not in TOWN_AGENTS:
            return CommandError("unauthorized", f"{origin.name[:80]!r} is no town agent: nobody acts as it")
        if command and tuple(command.split(".")[2:4]) not in TOWN_AGENT_COMMANDS:
            # Its NATS user may not publish it either (session_identity.town_agent_permissions): refused here too,
            # for a town whose agents share one NATS user.
            return CommandError(
                "unauthorized",
                f"the {origin.name} agent may not send {command}: it has an operator's work on beads, convoys, mail "
                "and escalations, and a person does the rest",
            )
        # The subject says who it is, whatever its body says: its NATS user may publish on this subject alone.
        return Sender(origin.actor, "operator")
    if before_cutover:
        actor = body_actor or OPERATOR
        return Sender(actor, actor_class(actor))
    if body_actor is None:
        return Sender(OPERATOR, "operator")
    if body_actor.startswith(PLUGIN_PREFIX):
        # A plugin sending commands with a user that may publish the plain subjects: an operator's label, held to
        # an agent's (smaller) limits as plugins always were. A label can only make its sender more limited.
        return Sender(body_actor, "agent")
    kept_for = reserved(body_actor)
    if kept_for is not None:
        return CommandError(
            "unauthorized",
            f"`actor` {body_actor[:80]!r} is {kept_for}, and a command on a plain subject "
            f"({_PLAIN}) is an operator's: its `actor` only labels the operator (operator, "
            "operator:<name>, any name that is not a service's or a polecat's). Who acted is decided by the subject "
            "a command came on, never by its body: a polecat session sends on its own subject, a service on "
            f"its own ({_PLAIN}.{subjects.SERVICE_MARK}.<service>), and operators may publish on neither",
        )
    return Sender(body_actor, "operator")


def _service_sender(body_actor: str | None, origin: subjects.ServiceOrigin) -> Sender | CommandError:
    service = origin.service
    if not is_service(service):
        return CommandError(
            "unauthorized",
            f"{service[:80]!r} is no service of the town: nobody acts as it (its subject is a service's)",
        )
    if body_actor is None or body_actor == service:
        return Sender(service, "service")
    if may_act_for(service, body_actor):
        return Sender(body_actor, "service")
    allowed = ", ".join(f"{p}<name>" for p in sub_actors_of(service)) or "nobody else"
    return CommandError(
        "unauthorized",
        f"a command on the {service}'s own subject is the {service}'s: its `actor` may name only the {service} "
        f"or what it acts for ({allowed}), not {body_actor[:80]!r}",
    )


def impersonation(cmd: Command, origin: subjects.SessionOrigin) -> CommandError | None:
    """The rejection of a command a polecat session sent in another session's name: a session acts only as
    itself (its ``session`` field, when the command has one, must be the session that sent it)."""
    named = getattr(cmd, "session", None)
    if named is not None and named != origin.session:
        return CommandError(
            "unauthorized",
            f"session {origin.session} (polecat {origin.rig}/{origin.polecat}) may act only as itself, "
            f"not as session {str(named)[:80]!r}",
        )
    bead = cmd.worked_bead()
    if bead is not None and (cmd.fence is None or cmd.fence.lease != ids.hook_lease_name(bead)):
        # The fence is then checked to be held by this very session (fence_error's holder): a session works
        # only the bead it is hooked to.
        return CommandError(
            "unauthorized",
            f"session {origin.session} acts on bead {bead} only with that bead's hook lease as its `fence` "
            f"({ids.hook_lease_name(bead)}): a session works only the bead it holds",
        )
    return None
