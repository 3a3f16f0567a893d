"""Subject grammar and stream names. Pure functions, no I/O."""

from __future__ import annotations

import re
from typing import NamedTuple

EVT_PREFIX = "gt.evt"
CMD_PREFIX = "gt.cmd"
QUERY_PREFIX = "gt.q"

EVT_ALL = f"{EVT_PREFIX}.>"
"""Every event subject: what GT_EVT holds."""
CMD_ALL = f"{CMD_PREFIX}.>"
"""Every command subject: what GT_CMD holds."""

DEFAULT_EVT_STREAM = "GT_EVT"
DEFAULT_CMD_STREAM = "GT_CMD"
DEFAULT_SNAPSHOT_BUCKET = "GT_SNAP"
DEFAULT_HEARTBEAT_BUCKET = "GT_HEARTBEATS"
DEFAULT_SERVICE_BUCKET = "GT_SERVICES"
DEFAULT_LEASE_BUCKET = "GT_LEASES"
DEFAULT_ACTIVE_BUCKET = "GT_ACTIVE"
DEFAULT_PLUGIN_BUCKET = "GT_PLUGINS"


def event_subject(aggregate: str, aggregate_id: str) -> str:
    return f"{EVT_PREFIX}.{aggregate}.{aggregate_id}"


SESSION_SCOPE = "~"
"""Between a session and its own command id in a session command's outcome id (``s-1~finish-s-1``,
``shared.core.ids.session_scoped_id``)."""


def outcome_subject(command_id: str) -> str:
    """Where a command's outcome is: ``gt.evt.cmd.<id>``; a session's own command's (``<session>~<id>``) on
    ``gt.evt.cmd.<session>.<id>``, the session a token of its own, so that a session may read exactly its own
    outcomes (a permission of ``...cmd.<session>.*``). With both in one token, the session's permission had to be
    ``...cmd.*``, and a direct get of the literal subject ``gt.evt.cmd.*`` (a wildcard the server resolves) read
    every sender's newest outcome (a red team's)."""
    session, scoped, own = command_id.partition(SESSION_SCOPE)
    return f"{EVT_PREFIX}.cmd.{session}.{own}" if scoped else f"{EVT_PREFIX}.cmd.{command_id}"


def outcome_subjects(command_id: str) -> tuple[str, ...]:
    """Every subject the outcome of ``command_id`` may be on: ``outcome_subject``'s, and for a session's command
    the one a town before the session's own token wrote (``gt.evt.cmd.<session>~<id>``), so a command stored before
    an upgrade and delivered again after it is found settled."""
    current = outcome_subject(command_id)
    legacy = f"{EVT_PREFIX}.cmd.{command_id}"
    return (current,) if legacy == current else (current, legacy)


def outcome_command_id(subject: str) -> str:
    """The command id whose outcome is on ``subject`` (``outcome_subject``'s inverse)."""
    rest = subject.removeprefix(f"{EVT_PREFIX}.cmd.")
    session, dot, own = rest.partition(".")
    return f"{session}{SESSION_SCOPE}{own}" if dot else rest


def session_outcomes(session: str) -> str:
    """Every outcome of ``session``'s own commands (a permission's subject)."""
    return f"{EVT_PREFIX}.cmd.{session}.*"


def command_subject(aggregate: str, verb: str) -> str:
    return f"{CMD_PREFIX}.{aggregate}.{verb}"


class SessionOrigin(NamedTuple):
    """Who sent a command on a session's own subject: the NATS permissions of a polecat session allow it to
    publish only on subjects that end in its rig, polecat and session (docs/architecture.md, "Identity")."""

    rig: str
    polecat: str
    session: str

    @property
    def actor(self) -> str:
        return f"polecat:{self.rig}/{self.polecat}"


def session_command_subject(aggregate: str, verb: str, origin: SessionOrigin) -> str:
    """``gt.cmd.step.done.<rig>.<polecat>.<session>``: a command as a polecat session sends it."""
    return f"{CMD_PREFIX}.{aggregate}.{verb}.{origin.rig}.{origin.polecat}.{origin.session}"


class ServiceOrigin(NamedTuple):
    """Who sent a command on a service's own subject: a service scope (``mayor``, ``witness``, ``witness-east``,
    ``refinery``, ``deacon``). Only the services' NATS users may publish there; operators may publish only the
    plain subjects and a session only its own (docs/architecture.md, "Identity")."""

    service: str

    @property
    def actor(self) -> str:
        return self.service


SERVICE_MARK = "svc"
"""The token between a command's own subject and the service that sent it: ``gt.cmd.bead.close.svc.refinery``."""


def service_command_subject(aggregate: str, verb: str, origin: ServiceOrigin) -> str:
    """``gt.cmd.bead.close.svc.refinery``: a command as a service sends it."""
    return f"{CMD_PREFIX}.{aggregate}.{verb}.{SERVICE_MARK}.{origin.service}"


class TownAgentOrigin(NamedTuple):
    """Who sent a command on a town agent's own subject (``gt.cmd.bead.create.agent.mayor``): the mayor agent, an
    AI session that acts for the operator with an operator's commands under a name of its own. Only its NATS user
    (``mayor_agent``) may publish there, and it may publish nowhere else (docs/deployment.md, "Accounts and
    permissions")."""

    name: str

    @property
    def actor(self) -> str:
        return f"agent:{self.name}"


AGENT_MARK = "agent"
"""The token between a command's own subject and the town agent that sent it: ``gt.cmd.bead.create.agent.mayor``."""


def town_agent_command_subject(aggregate: str, verb: str, origin: TownAgentOrigin) -> str:
    """``gt.cmd.bead.create.agent.mayor``: a command as a town agent sends it."""
    return f"{CMD_PREFIX}.{aggregate}.{verb}.{AGENT_MARK}.{origin.name}"


Origin = SessionOrigin | ServiceOrigin | TownAgentOrigin
"""Who sent a command, as the subject it came on says; a plain subject says nothing (an operator sent it)."""


TOWN_AGENTS = ("mayor",)
"""The town agents (``TownAgentOrigin``): AI sessions acting for the operator under a name of their own,
``agent:<name>``, each logging in as ``town_agent_user``."""


TOWN_AGENT_ENV = "GT_TOWN_AGENT"
"""Set in a town agent's session (``mayor``): its `gt` sends on its own subjects and `gt prime` shows the town."""


def town_agent_user(name: str) -> str:
    """Town agent ``name``'s NATS user and the scope its command ids are settled in: ``agent-mayor``. No session
    id has this shape (a session's id is its bead's, ``<prefix>-<random>``, and a number)."""
    return f"{AGENT_MARK}-{name}"


def town_agent_tmux_name(name: str) -> str:
    """Town agent ``name``'s tmux session, ``gt_agent_mayor``: never a polecat's (``gt-<rig>-<polecat>``), whatever
    its rig and polecat are called."""
    return f"gt_{AGENT_MARK}_{name}"


def town_agent_of_user(user: str) -> str | None:
    """The town agent logged in as ``user`` (``agent-mayor`` -> ``mayor``); None for anyone else."""
    return next((name for name in TOWN_AGENTS if user == town_agent_user(name)), None)


def id_scope(origin: Origin | None) -> str | None:
    """The namespace a command's id is settled in (``ids.session_scoped_id``) when an agent sent it: a polecat
    session's (its id), a town agent's (``agent-<name>``), so that no id an agent chooses is another sender's; None
    for a service's or an operator's."""
    if isinstance(origin, SessionOrigin):
        return origin.session
    if isinstance(origin, TownAgentOrigin):
        return town_agent_user(origin.name)
    return None


def sent_subject(own: str, origin: Origin | None) -> str:
    """The subject a command whose own subject is ``own`` (``gt.cmd.bead.close``) is sent on by ``origin``: a
    session's or a service's own subject, or ``own`` itself (an operator's plain subject) when None."""
    if origin is None:
        return own
    split = split_command_subject(own)
    if split is None:
        raise ValueError(f"not a command subject: {own!r}")
    if isinstance(origin, SessionOrigin):
        return session_command_subject(*split, origin)
    if isinstance(origin, TownAgentOrigin):
        return town_agent_command_subject(*split, origin)
    return service_command_subject(*split, origin)


def split_origin(subject: str) -> tuple[str, Origin | None]:
    """The command's own subject and who sent it, as the subject says:
    ``gt.cmd.step.done.r.p.s`` -> ("gt.cmd.step.done", SessionOrigin("r", "p", "s")),
    ``gt.cmd.bead.close.svc.refinery`` -> ("gt.cmd.bead.close", ServiceOrigin("refinery")),
    ``gt.cmd.bead.create.agent.mayor`` -> ("gt.cmd.bead.create", TownAgentOrigin("mayor")), a plain (four-token)
    command subject -> (itself, None). Any other shape is returned as it is, with None (the intake answers
    ``unknown_command``)."""
    parts = subject.split(".")
    if len(parts) < 6 or parts[0] != "gt" or parts[1] != "cmd" or not all(parts[2:]):
        return subject, None
    own = ".".join(parts[:4])
    if len(parts) == 6 and parts[4] == SERVICE_MARK:
        return own, ServiceOrigin(parts[5])
    if len(parts) == 6 and parts[4] == AGENT_MARK:
        return own, TownAgentOrigin(parts[5])
    if len(parts) == 7:
        return own, SessionOrigin(parts[4], parts[5], parts[6])
    return subject, None


def session_inbox_prefix(session: str) -> str:
    """The only inbox a polecat session may subscribe to (its replies and deliveries): ``_INBOX_s-<session>``."""
    return f"_INBOX_s-{session}"


IMPORT_REPLY = "_R_"
"""The first token of the reply subject the NATS server makes for a request that crossed a service import (from
account AGENTS into GT): its answer goes back to the asker in the other account, and nowhere else."""


def is_inbox(reply: str) -> bool:
    """Whether ``reply`` is in an inbox (``_INBOX.<...>`` or a private ``_INBOX_<owner>.<...>``) or is the reply the
    server made for an imported request (``_R_.<...>``), the only reply subjects a service answers: an answer
    published on any other subject would carry the service's own rights (a forged event, an overwritten key)."""
    head, _, rest = reply.partition(".")
    if not rest or "*" in reply or ">" in reply or " " in reply:
        return False
    return head in ("_INBOX", IMPORT_REPLY) or (head.startswith("_INBOX_") and len(head) > len("_INBOX_"))


SESSION_ACCOUNT = "AGENTS"
"""The NATS account polecat sessions log in to under the shipped accounts (ops/nats/accounts.conf)."""
REQUEST_INFO = "Nats-Request-Info"
"""The header the NATS server sets on a request that crossed an import with ``share``: who asked (account,
user), written by the server, never by the asker."""


def session_of_inbox(reply: str) -> str | None:
    """The session whose private inbox ``reply`` is in (so a query answers it only about itself); None for
    any other inbox."""
    head = reply.split(".", 1)[0]
    if head.startswith("_INBOX_s-") and len(head) > len("_INBOX_s-"):
        return head[len("_INBOX_s-") :]
    return None


def agent_of_request(reply: str, request_info: dict[str, object] | None) -> str | None:
    """Who of account AGENTS asked (a session or a town agent: the key its query limit is counted under), else the
    session whose private inbox the reply is in; None for anyone else (an operator, a service)."""
    if request_info is not None and request_info.get("acc") == SESSION_ACCOUNT:
        user = request_info.get("user")
        return user if isinstance(user, str) and user else "?"
    return session_of_inbox(reply)


def session_of_request(reply: str, request_info: dict[str, object] | None) -> str | None:
    """The polecat session that asked a query, so that it is answered only about itself: the user the server
    names in ``Nats-Request-Info`` when the request came from account AGENTS (a session's own identity), else the
    session whose private inbox the reply is in (a town without accounts, where the inbox is all there is)."""
    if request_info is not None and request_info.get("acc") == SESSION_ACCOUNT:
        user = request_info.get("user")
        # Users of AGENTS are the auth callout's: sessions, and the town agents, answered as an operator is (their
        # commands are an operator's). One with no name is refused everything.
        if isinstance(user, str) and town_agent_of_user(user) is not None:
            return None
        return user if isinstance(user, str) and user else "?"
    return session_of_inbox(reply)


RUNNER_SCOPE = "runner"
"""A gate runner's service scope is ``runner-<name>`` (``services.runner``); see ``scope_tokens``."""
RUNNER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
"""A gate runner's name (``GT_RUNNER_NAME``): lower-case letters, digits and dashes, one subject token."""


def runner_scope(name: str) -> str:
    """The service scope of the gate runner named ``name``: ``runner-<name>``."""
    return f"{RUNNER_SCOPE}-{name}"


def is_runner_scope(scope: str) -> bool:
    """Whether ``scope`` is a gate runner's (``runner-<name>``, a valid name)."""
    head, dash, name = scope.partition("-")
    return head == RUNNER_SCOPE and bool(dash) and bool(RUNNER_NAME.match(name))


def scope_tokens(scope: str) -> str:
    """A service scope as the subject tokens of its queries and of its keys in ``GT_ACTIVE`` and ``GT_SERVICES``:
    itself, but a gate runner's (``runner-<name>``) is ``runner.<name>``. The runners share one NATS user, and NATS
    wildcards stand only for whole tokens: with the name a token of its own, one permission (``gt.q.runner.>``,
    ``$KV.GT_ACTIVE.runner.*``) names every runner's subjects and nothing of another scope's (``runner-*`` would
    be no wildcard at all)."""
    return f"{RUNNER_SCOPE}.{scope.partition('-')[2]}" if is_runner_scope(scope) else scope


def query_subject(service: str, what: str) -> str:
    """``gt.q.<service>.<what>`` (a gate runner's: ``gt.q.runner.<name>.<what>``, ``scope_tokens``)."""
    return f"{QUERY_PREFIX}.{scope_tokens(service)}.{what}"


def split_command_subject(subject: str) -> tuple[str, str] | None:
    """``gt.cmd.bead.create`` -> ("bead", "create"); anything else -> None."""
    parts = subject.split(".")
    if len(parts) != 4 or parts[0] != "gt" or parts[1] != "cmd":
        return None
    return parts[2], parts[3]


def aggregate_of(subject: str) -> tuple[str, str] | None:
    """``gt.evt.bead.hq-1a2b3c`` -> ("bead", "hq-1a2b3c")."""
    parts = subject.split(".", 3)
    if len(parts) != 4 or parts[0] != "gt" or parts[1] != "evt":
        return None
    return parts[2], parts[3]


class DeliveryInfo(NamedTuple):
    """What a JetStream delivery's reply subject says about the message."""

    stream_seq: int
    delivered: int
    """How many times this message has been delivered to the consumer (1 = first time)."""
    pending: int
    """Messages left for the consumer after this one."""


def parse_js_reply(reply: str) -> DeliveryInfo:
    """Parse ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` (v1, 9 tokens) or the
    v2 form with domain and account hash (12 tokens). Cheaper than nats-py's ``msg.metadata`` in hot loops."""
    tokens = reply.split(".")
    try:
        if len(tokens) == 9:
            return DeliveryInfo(int(tokens[5]), int(tokens[4]), int(tokens[8]))
        if len(tokens) >= 12:
            return DeliveryInfo(int(tokens[7]), int(tokens[6]), int(tokens[10]))
    except ValueError:
        pass
    raise ValueError(f"not a JetStream delivery reply subject: {reply!r}")
