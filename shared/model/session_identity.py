"""A polecat session's own NATS identity: its password (minted by the witness), checked by the auth callout,
and the permissions its connection gets. Pure: no I/O, time passed in.

Under the shipped auth configs (ops/nats/accounts.conf) a session logs in with its session id as the NATS user
and a password that carries its rig, polecat, bead and expiry, signed with the town's session key
(``GT_SESSION_KEY``): ``v1.<rig>.<polecat>.<bead>.<expires unix>.<hex HMAC-SHA256>``. Ids never contain dots
(``shared.core.ids``), so the token splits unambiguously. The server asks the witness's responder
(``shared.bus.auth_callout``) about each such login; the responder checks the token here and, while the
session is live, answers with the permissions of ``session_permissions``: the session's own command subjects,
its own heartbeat and hook lease keys, its own inbox, the read-only log access agents have, and nothing else.
See docs/deployment.md, "Per-session identities".
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, NamedTuple

from shared.core import subjects
from shared.core.ids import hook_lease_name, is_valid_id

TOKEN_VERSION = "v1"  # noqa: S105 (the format of a credential, not one)
TOWN_AGENT_TOKEN_VERSION = "a1"  # noqa: S105 (the format of a credential, not one)

AGENT_COMMANDS: tuple[tuple[str, str], ...] = (
    ("bead", "claim"),
    ("step", "start"),
    ("step", "done"),
    ("session", "done_intent"),
    ("session", "finish"),
    ("session", "handoff"),
    ("mr", "done"),
    ("mail", "send"),
    ("mail", "reply"),
    ("mail", "read"),
    ("mail", "archive"),
    ("escalation", "raise"),
)
"""The commands a polecat session may send (gt step, gt done, gt handoff, gt mail, gt escalate; gt-agent's
claim of its hooked bead), each only on its own session subject (``subjects.session_command_subject``). No
rig.add, no bead.create/update/close, no sling, no nudges, no merge queue decisions; not mr.submit, which takes
a branch submitted by hand (gt done's merge request is mr.done, fenced by the session's hook lease)."""

TOWN_AGENT_COMMANDS: tuple[tuple[str, str], ...] = (
    ("bead", "create"),
    ("bead", "update"),
    ("bead", "close"),
    ("bead", "sling"),
    ("bead", "unsling"),
    ("convoy", "create"),
    ("convoy", "add"),
    ("mail", "send"),
    ("mail", "reply"),
    ("mail", "read"),
    ("mail", "archive"),
    ("escalation", "raise"),
    ("escalation", "ack"),
    ("nudge", "send"),
)
"""What the mayor agent may send (docs/mayor-agent.md), each only on its own subject
(``subjects.town_agent_command_subject``): an operator's work on beads, convoys, mail and escalations. No rig
changes, no gate approvals (a human gate is a person's), no merge queue decisions, no leases, no session stops, no
automations, no GC: what it cannot do, a person does after reading its answer."""

MAX_PAYLOAD = 64 * 1024
"""A session's largest message (agent commands are capped at 32 KiB by the intake; the rest is headroom):
enforced by the server for the whole account AGENTS (ops/nats/accounts.conf ``limits``), since nats-server
applies no limit of a user JWT an auth callout returns."""
MAX_SUBSCRIPTIONS = 256
"""A gt call holds a handful (its request inbox): also an account limit of AGENTS, per connection."""


class SessionClaim(NamedTuple):
    """What a valid session password says: who the session is and until when its credential is good."""

    session: str
    rig: str
    polecat: str
    bead: str
    expires_at: int
    """Unix seconds."""

    @property
    def origin(self) -> subjects.SessionOrigin:
        return subjects.SessionOrigin(self.rig, self.polecat, self.session)


class TownAgentClaim(NamedTuple):
    """What a valid town agent password says: which town agent (``mayor``) and until when."""

    name: str
    run: int
    """The launch of the agent it was minted for (``town_agent.launched``'s ``run``): good for that run alone."""
    expires_at: int
    """Unix seconds."""

    @property
    def user(self) -> str:
        return town_agent_user(self.name)

    @property
    def login(self) -> str:
        """Its logins' key (``agent-mayor#3``): a run's connections are cut once another run is launched."""
        return f"{self.user}{RUN_MARK}{self.run}"

    @property
    def origin(self) -> subjects.TownAgentOrigin:
        return subjects.TownAgentOrigin(self.name)


town_agent_user = subjects.town_agent_user
RUN_MARK = "#"


def town_agent_run_of(login: str) -> tuple[str, int] | None:
    """``agent-mayor#3`` -> ("mayor", 3); None for any other login."""
    user, mark, run = login.partition(RUN_MARK)
    name = subjects.town_agent_of_user(user)
    return (name, int(run)) if name is not None and mark and run.isdigit() else None


class Refusal(NamedTuple):
    """Why a login was refused (said in the server's log; the client only sees ``Authorization Violation``)."""

    reason: str


class SessionBuckets(NamedTuple):
    """The stream and buckets whose names the permissions spell out (``TownConfig`` has these fields)."""

    evt_stream: str
    heartbeat_bucket: str
    lease_bucket: str


def _mac(key: bytes, session: str, rig: str, polecat: str, bead: str, expires_at: int) -> str:
    message = "\n".join((TOKEN_VERSION, session, rig, polecat, bead, str(expires_at))).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def mint(key: bytes, *, session: str, rig: str, polecat: str, bead: str, expires_at: int) -> str:
    """The password of ``session`` (its NATS user name), good until ``expires_at`` (unix seconds).

    Raises:
        ValueError: an id that cannot be carried in a token (see ``shared.core.ids.is_valid_id``), or no key.
    """
    if not key:
        raise ValueError("the session key is empty (GT_SESSION_KEY)")
    for what, value in (("session", session), ("rig", rig), ("polecat", polecat), ("bead", bead)):
        if not is_valid_id(value):
            raise ValueError(f"{what} {value!r} is not an id a session credential can carry")
    mac = _mac(key, session, rig, polecat, bead, int(expires_at))
    return f"{TOKEN_VERSION}.{rig}.{polecat}.{bead}.{int(expires_at)}.{mac}"


def mint_town_agent(key: bytes, *, name: str, run: int, expires_at: int) -> str:
    """The password of run ``run`` of town agent ``name`` (user ``agent-<name>``), good until ``expires_at`` (unix
    seconds) while that run is the agent's current one: ``a1.<name>.<run>.<expires unix>.<hex HMAC-SHA256>``, signed
    with the session key.

    Raises:
        ValueError: a name that is not an id, or no key.
    """
    if not key:
        raise ValueError("the session key is empty (GT_SESSION_KEY)")
    if name not in subjects.TOWN_AGENTS:
        raise ValueError(f"{name!r} is no town agent (one of {', '.join(subjects.TOWN_AGENTS)})")
    mac = _town_agent_mac(key, name, int(run), int(expires_at))
    return f"{TOWN_AGENT_TOKEN_VERSION}.{name}.{int(run)}.{int(expires_at)}.{mac}"


def _town_agent_mac(key: bytes, name: str, run: int, expires_at: int) -> str:
    # Its own version in the message: no session token's MAC is ever a town agent's.
    message = "\n".join((TOWN_AGENT_TOKEN_VERSION, town_agent_user(name), name, str(run), str(expires_at))).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def verify(key: bytes, user: object, password: object, now: float) -> SessionClaim | TownAgentClaim | Refusal:
    """The claim of a login as ``user`` with ``password`` at ``now`` (unix seconds), or why it is refused.
    Never raises, whatever it is given (it reads what any client sent)."""
    if not isinstance(user, str) or not isinstance(password, str) or not key:
        return Refusal("no session credentials")
    if password.startswith(TOWN_AGENT_TOKEN_VERSION + "."):
        return _verify_town_agent(key, user, password, now)
    parts = password.split(".")
    if len(parts) != 6 or parts[0] != TOKEN_VERSION:
        return Refusal(f"the password of {_shown(user)} is not a session credential")
    _, rig, polecat, bead, expires_text, mac = parts
    if not all(is_valid_id(v) for v in (user, rig, polecat, bead)) or not expires_text.isascii():
        return Refusal(f"the password of {_shown(user)} is not a session credential")
    if not expires_text.isdigit() or len(expires_text) > 12:
        return Refusal(f"the password of {_shown(user)} is not a session credential")
    expires_at = int(expires_text)
    expected = _mac(key, user, rig, polecat, bead, expires_at)
    if not hmac.compare_digest(expected.encode(), mac.encode("utf-8", "surrogatepass")):
        return Refusal(f"the password of session {user} is not one the witness minted")
    if now >= expires_at:
        return Refusal(f"the credential of session {user} expired")
    return SessionClaim(session=user, rig=rig, polecat=polecat, bead=bead, expires_at=expires_at)


def _verify_town_agent(key: bytes, user: str, password: str, now: float) -> TownAgentClaim | Refusal:
    parts = password.split(".")
    if len(parts) != 5:
        return Refusal(f"the password of {_shown(user)} is not a town agent credential")
    _, name, run_text, expires_text, mac = parts
    if name not in subjects.TOWN_AGENTS or user != town_agent_user(name):
        return Refusal(f"the password of {_shown(user)} is not a town agent credential")
    numbers = (run_text, expires_text)
    if not all(n.isascii() and n.isdigit() and len(n) <= 12 for n in numbers):
        return Refusal(f"the password of {_shown(user)} is not a town agent credential")
    run, expires_at = int(run_text), int(expires_text)
    expected = _town_agent_mac(key, name, run, expires_at)
    if not hmac.compare_digest(expected.encode(), mac.encode("utf-8", "surrogatepass")):
        return Refusal(f"the password of town agent {name} is not one the witness minted")
    if now >= expires_at:
        return Refusal(f"the credential of town agent {name} expired")
    return TownAgentClaim(name=name, run=run, expires_at=expires_at)


def _shown(user: str) -> str:
    return repr(user[:80])


def session_permissions(claim: SessionClaim, buckets: SessionBuckets) -> dict[str, Any]:
    """The user JWT's permissions (the ``pub`` and ``sub`` of its ``nats`` claim) of ``claim``'s session: what
    ``gt`` and ``gt-agent`` do inside a session, for this session only. The session is in account AGENTS, which
    has no JetStream and imports from the town only what sessions need (ops/nats/accounts.conf); these narrow
    each import to the session's own:

    - its commands on its own subjects, so a command says who sent it by where it was published;
    - queries (the services answer a session about itself only: the server names the asker in
      ``Nats-Request-Info``, ``subjects.session_of_request``);
    - its heartbeat key and its bead's hook lease key: put (also create, update, delete, all plain publishes to
      the key's subject) and direct get of exactly that key (the subject names the key, so the permission can);
    - its own commands' outcomes (``gt.evt.cmd.<session>.<command id>``) and its lease's newest event, by direct
      get: the reads
      ``gt`` makes of the log. Nothing else of the log: no stream info (it lists every subject), no consumers;
    - subscribe only to its own inbox prefix (``subjects.session_inbox_prefix``).
    """
    evt = buckets.evt_stream
    heartbeat = f"$KV.{buckets.heartbeat_bucket}.{claim.session}"
    lease_name = hook_lease_name(claim.bead)
    lease = f"$KV.{buckets.lease_bucket}.{lease_name}"
    publish = [subjects.session_command_subject(agg, verb, claim.origin) for agg, verb in AGENT_COMMANDS]
    publish += [
        f"{subjects.QUERY_PREFIX}.>",
        heartbeat,
        lease,
        f"$JS.API.DIRECT.GET.KV_{buckets.heartbeat_bucket}.{heartbeat}",
        f"$JS.API.DIRECT.GET.KV_{buckets.lease_bucket}.{lease}",
        f"$JS.API.DIRECT.GET.{evt}.{subjects.session_outcomes(claim.session)}",
        f"$JS.API.DIRECT.GET.{evt}.{subjects.event_subject('lease', lease_name)}",
    ]
    return {
        "pub": {"allow": publish},
        "sub": {"allow": [subjects.session_inbox_prefix(claim.session) + ".>"]},
    }


def town_agent_permissions(claim: TownAgentClaim, buckets: SessionBuckets) -> dict[str, Any]:
    """The user JWT's permissions of town agent ``claim`` (the mayor agent), in account AGENTS as the sessions are
    (no JetStream, only the town's imports): its commands (``TOWN_AGENT_COMMANDS``) on its own subjects, queries
    (answered to it as to an operator: ``subjects.session_of_request``), its own commands' outcomes by direct get,
    and its own inbox. No key of any bucket, no other event, no stream or consumer of the log."""
    scope = town_agent_user(claim.name)
    publish = [subjects.town_agent_command_subject(agg, verb, claim.origin) for agg, verb in TOWN_AGENT_COMMANDS]
    publish += [
        f"{subjects.QUERY_PREFIX}.>",
        f"$JS.API.DIRECT.GET.{buckets.evt_stream}.{subjects.session_outcomes(scope)}",
    ]
    return {
        "pub": {"allow": publish},
        "sub": {"allow": [subjects.session_inbox_prefix(scope) + ".>"]},
    }
