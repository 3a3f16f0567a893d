"""Identifiers: validation, bead ids and stable digests of ids that cannot be used as subject tokens."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from shared.core import subjects

ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
PREFIX_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_]{0,15}$")
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
BEAD_SUFFIX_LEN = 6


def is_valid_id(value: str) -> bool:
    """True when ``value`` can be used as one subject token and as an id (no dots, spaces or wildcards)."""
    return ID_PATTERN.fullmatch(value) is not None


def stable_digest_id(raw: str, *, prefix: str = "cmd") -> str:
    """A valid id derived from ``raw``: the same input always yields the same id, so dedupe still works."""
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{prefix}-{digest}"


def command_id(header_id: str | None, body_id: str | None, cmd_seq: int) -> str:
    """The command's id (docs/architecture.md, "Commands: from a body to events"): header, else body ``cmd_id``,
    else ``cmd-<GT_CMD seq>``."""
    for candidate in (header_id, body_id):
        if candidate:
            return candidate if is_valid_id(candidate) else stable_digest_id(candidate)
    return f"cmd-{cmd_seq}"


SESSION_SCOPE = subjects.SESSION_SCOPE
"""Between a session and its own command id in a session command's outcome id (``s-1~finish-s-1``). No id a
sender chooses holds it (``command_id`` turns such an id into a digest), so a scoped id is never anyone else's."""


def session_scoped_id(session: str, command_id: str) -> str:
    """The id a polecat session's command is settled under (its outcome is on ``gt.evt.cmd.<this>``): the session's
    own namespace, so that no id a session chooses is the id of a service's, the operator's or another session's
    command (a session that sent ``close-<mr>`` first would have settled the refinery's close of that bead)."""
    return f"{session}{SESSION_SCOPE}{command_id}"


def keyed_id(base: str, secret: str | None) -> str:
    """``base`` followed by a digest keyed with ``secret``: the same for every resend of one sender's command
    (idempotent), not one another sender can guess ahead of it and take first in GT_CMD's dedupe window. ``base``
    as it is when there is no secret (a town without per-session identities)."""
    if not secret:
        return base
    digest = hmac.new(secret.encode(), base.encode(), hashlib.sha256).hexdigest()[:16]
    return f"{base[:47]}-{digest}"


def to_base36(number: int) -> str:
    if number < 0:
        raise ValueError("base36 takes a non-negative number")
    digits = []
    while True:
        number, rem = divmod(number, 36)
        digits.append(_BASE36[rem])
        if number == 0:
            return "".join(reversed(digits))


def random_bead_id(prefix: str) -> str:
    """``<prefix>-<base36>`` with a random suffix; uniqueness is enforced by the log (expected sequence 0)."""
    suffix = to_base36(secrets.randbelow(36**BEAD_SUFFIX_LEN)).rjust(BEAD_SUFFIX_LEN, "0")
    return f"{prefix}-{suffix}"


CONVOY_PREFIX = "cv"
ESCALATION_PREFIX = "esc"
MAIL_PREFIX = "hq"
"""The prefixes of the ids the mayor gives convoys, escalations and messages (a bead's is its command's)."""
NEW_ID_SUFFIX = re.compile(rf"^[0-9a-z]{{{BEAD_SUFFIX_LEN}}}$")
"""The suffix of an id a sender chooses for what its command creates: the shape ``random_bead_id`` gives."""


def is_new_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is an id a sender may choose for a new ``<prefix>-...`` (``random_bead_id``'s shape)."""
    head, sep, suffix = value.partition("-")
    return head == prefix and bool(sep) and NEW_ID_SUFFIX.fullmatch(suffix) is not None


def new_event_id() -> str:
    """A 20-character random id for events (fits the id pattern, cheap to store)."""
    return secrets.token_hex(10)


HOOK_LEASE_PREFIX = "hook-"
MERGE_LEASE_PREFIX = "merge-"
RESERVED_LEASE_PREFIXES = (HOOK_LEASE_PREFIX, MERGE_LEASE_PREFIX)
"""Leases the services take themselves (the witness a bead's hook, the refinery a rig's merge slot)."""


def _prefixed(prefix: str, name: str) -> str:
    if len(prefix) + len(name) <= 64:
        return f"{prefix}{name}"
    digest = hashlib.blake2b(name.encode()).hexdigest()[:8]
    return f"{prefix}{name[: 64 - len(prefix) - 9]}-{digest}"


def hook_lease_name(bead: str) -> str:
    """The lease a bead's working session holds: each new session takes it with the next fencing token."""
    return _prefixed(HOOK_LEASE_PREFIX, bead)


def merge_lease_name(rig: str) -> str:
    """The lease a refinery holds while it merges into one of the rig's targets."""
    return _prefixed(MERGE_LEASE_PREFIX, rig)
