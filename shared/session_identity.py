"""A polecat session's own NATS identity: its password (minted by the witness), checked by the auth callout,
and the permissions its connection gets. Pure: no I/O, time passed in.

Under the shipped auth configs (ops/nats/accounts.conf) a session logs in with its session id as the NATS user
and a password that carries its rig, polecat, bead and expiry, signed with the town's session key
(``GT_SESSION_KEY``): ``v1.<rig>.<polecat>.<bead>.<expires unix>.<hex HMAC-SHA256>``. Ids never contain dots
(``shared.ids``), so the token splits unambiguously. The server asks the witness's responder
(``shared.bus.auth_callout``) about each such login; the responder checks the token here and, while the
session is live, answers with the permissions of ``session_permissions``: the session's own command subjects,
its own heartbeat and hook lease keys, its own inbox, the read-only log access agents have, and nothing else.
See docs/deployment.md, "Per-session identities".
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, NamedTuple

from shared import subjects
from shared.ids import hook_lease_name, is_valid_id

TOKEN_VERSION = "v1"  # noqa: S105 (the format of a credential, not one)

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

MAX_PAYLOAD = 64 * 1024
"""A session's largest message: agent commands are capped at 32 KiB by the intake; the rest is headroom."""
MAX_SUBSCRIPTIONS = 256
"""A gt call holds a handful (its request inbox, an ordered consumer on the log); gt-agent a few more."""
MAX_DATA = -1
"""No byte cap on the connection: what a session can write is bounded by its payload cap here and by the intake's
per-actor rate limits and volume quotas (``shared.rate_limit``)."""
RESPONSE_TTL_NS = 60 * 1_000_000_000
"""A session may answer a request sent to it once, within a minute (``resp``), without any right on ``_INBOX.>``."""


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
        ValueError: an id that cannot be carried in a token (see ``shared.ids.is_valid_id``), or no key.
    """
    if not key:
        raise ValueError("the session key is empty (GT_SESSION_KEY)")
    for what, value in (("session", session), ("rig", rig), ("polecat", polecat), ("bead", bead)):
        if not is_valid_id(value):
            raise ValueError(f"{what} {value!r} is not an id a session credential can carry")
    mac = _mac(key, session, rig, polecat, bead, int(expires_at))
    return f"{TOKEN_VERSION}.{rig}.{polecat}.{bead}.{int(expires_at)}.{mac}"


def verify(key: bytes, user: object, password: object, now: float) -> SessionClaim | Refusal:
    """The claim of a login as ``user`` with ``password`` at ``now`` (unix seconds), or why it is refused.
    Never raises, whatever it is given (it reads what any client sent)."""
    if not isinstance(user, str) or not isinstance(password, str) or not key:
        return Refusal("no session credentials")
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


def _shown(user: str) -> str:
    return repr(user[:80])


def session_permissions(claim: SessionClaim, buckets: SessionBuckets) -> dict[str, Any]:
    """The user JWT's permissions (the ``pub``, ``sub``, ``resp`` and limits of its ``nats`` claim) of ``claim``'s
    session: what ``gt`` and ``gt-agent`` do inside a session, for this session only.

    - its commands on its own subjects, so a command says who sent it by where it was published;
    - queries (the services answer a session's inbox about itself only: ``subjects.session_of_inbox``);
    - reading the log as every agent does (stream info, single messages, ordered consumers on it);
    - its heartbeat key and its bead's hook lease key: put (also create, update, delete, all plain publishes to
      the key's subject) and direct get of exactly that key. Never the bare ``DIRECT.GET.KV_<bucket>`` or
      ``STREAM.MSG.GET.KV_<bucket>``, whose body can name any key, nor ``STREAM.INFO`` of a bucket (it lists
      every key); the CLI opens the buckets without asking for their info (``gt.cli.session_kv``).
    - subscribe only to its own inbox prefix (``subjects.session_inbox_prefix``).
    """
    evt = buckets.evt_stream
    heartbeat = f"$KV.{buckets.heartbeat_bucket}.{claim.session}"
    lease = f"$KV.{buckets.lease_bucket}.{hook_lease_name(claim.bead)}"
    publish = [subjects.session_command_subject(agg, verb, claim.origin) for agg, verb in AGENT_COMMANDS]
    publish += [
        f"{subjects.QUERY_PREFIX}.>",
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{evt}",
        f"$JS.API.STREAM.MSG.GET.{evt}",
        f"$JS.API.DIRECT.GET.{evt}",
        f"$JS.API.DIRECT.GET.{evt}.>",
        f"$JS.API.CONSUMER.CREATE.{evt}",
        f"$JS.API.CONSUMER.CREATE.{evt}.>",
        "$JS.FC.>",
        heartbeat,
        lease,
        f"$JS.API.DIRECT.GET.KV_{buckets.heartbeat_bucket}.{heartbeat}",
        f"$JS.API.DIRECT.GET.KV_{buckets.lease_bucket}.{lease}",
    ]
    return {
        "pub": {"allow": publish},
        "sub": {"allow": [subjects.session_inbox_prefix(claim.session) + ".>"]},
        "resp": {"max": 1, "ttl": RESPONSE_TTL_NS},
        "subs": MAX_SUBSCRIPTIONS,
        "data": MAX_DATA,
        "payload": MAX_PAYLOAD,
    }
