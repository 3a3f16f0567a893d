"""The auth callout responder: nats-server asks it about every login of a user its config does not know (a
polecat session), and it answers with that session's own permissions, or a refusal.

The server publishes an authorization request JWT (signed by the server's nkey) to ``$SYS.REQ.USER.AUTH`` in
the callout account (AUTH, which only the responder's ``auth`` user is in). The answer is an authorization
response JWT signed by the issuer account key the server config names (``auth_callout.issuer``), carrying a
user JWT: ``aud`` the account the session joins (AGENTS), ``name`` the session id, ``exp`` its credential's expiry,
and the permissions of ``shared.model.session_identity.session_permissions``. Only nkeys (and PyNaCl under it) and
JSON: NATS ADR-26. Every bad request is answered (or dropped, when it cannot even say whom to answer) and
logged; none ends the loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import nacl.exceptions
import nacl.signing
import nats.errors
import nkeys
import structlog
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared.bus.errors import map_errors
from shared.core import subjects
from shared.core.errors import GastownError
from shared.model import session_identity

log = structlog.get_logger(__name__)

AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"
AUTH_USER = "auth"
SYS_USER = "sys"
"""The system account's user (accounts.conf): it may only ask a server to disconnect a client (KICK)."""
KICK_TIMEOUT_S = 2.0
"""The responder's login (account AUTH in ops/nats/accounts.conf; it bypasses the callout)."""
SESSION_ACCOUNT = subjects.SESSION_ACCOUNT
"""The account a session joins (ops/nats/accounts.conf): no JetStream, only what GT exports to sessions."""
RESPONDERS = "gt-auth-callout"
REQUEST_AUDIENCE = "nats-authorization-request"
DEFAULT_CREDENTIAL_TTL_S = 7 * 24 * 3600.0
_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_SERVER_PREFIX = nkeys.PREFIX_BYTE_SERVER


class CalloutSettings(NamedTuple):
    """Per-session identities, from the witness's environment (docs/deployment.md, "Per-session identities")."""

    issuer_seed: bytes
    """The account nkey seed whose public key is ``auth_callout.issuer`` (``GT_AUTH_ISSUER_SEED``)."""
    session_key: bytes
    """The HMAC key session passwords are signed with (``GT_SESSION_KEY``)."""
    auth_password: str
    """The ``auth`` user's password, the responder's login (``GT_NATS_AUTH_PASSWORD``)."""
    credential_ttl_s: float = DEFAULT_CREDENTIAL_TTL_S
    """How long a session's credential is good (``GT_SESSION_CREDENTIAL_TTL``, seconds)."""
    sys_password: str | None = None
    """The ``sys`` user's password (``GT_NATS_SYS_PASSWORD``): the witness disconnects an ended session's
    connections with it (``$SYS.REQ.SERVER.<id>.KICK``). None: they last until the credential expires."""


def _secret(env: Mapping[str, str], name: str) -> str | None:
    """``env[name]``, or the first line of the file ``env[name + "_FILE"]`` names (a mounted secret)."""
    value = env.get(name)
    if value:
        return value.strip()
    path = env.get(f"{name}_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            return file.readline().strip() or None
    except OSError as exc:
        raise ValueError(f"{name}_FILE {path!r} cannot be read: {exc.strerror}") from exc


def load_settings(env: Mapping[str, str] | None = None) -> CalloutSettings | None:
    """The responder's settings; None when per-session identities are not configured (no issuer seed).

    Raises:
        ValueError: a setting is missing or unusable (the message names it).
    """
    env = os.environ if env is None else env
    seed = _secret(env, "GT_AUTH_ISSUER_SEED")
    if seed is None:
        return None
    try:
        issuer_public(seed.encode())
    except (nkeys.NkeysError, ValueError, binascii.Error) as exc:
        raise ValueError(
            "GT_AUTH_ISSUER_SEED is not an account nkey seed (SA...; "
            "`python -m shared.bus.auth_callout keygen` makes one)"
        ) from exc
    key = _secret(env, "GT_SESSION_KEY")
    if not key or len(key) < 16:
        raise ValueError("GT_SESSION_KEY (or GT_SESSION_KEY_FILE) must be set: at least 16 characters, random")
    password = _secret(env, "GT_NATS_AUTH_PASSWORD")
    if not password:
        raise ValueError("GT_NATS_AUTH_PASSWORD (or GT_NATS_AUTH_PASSWORD_FILE) must be set: the auth user's login")
    ttl_text = env.get("GT_SESSION_CREDENTIAL_TTL") or str(DEFAULT_CREDENTIAL_TTL_S)
    try:
        ttl = float(ttl_text)
    except ValueError:
        ttl = 0.0
    if ttl < 60:
        raise ValueError(f"GT_SESSION_CREDENTIAL_TTL must be a number of seconds of at least 60, got {ttl_text!r}")
    return CalloutSettings(
        issuer_seed=seed.encode(),
        session_key=key.encode(),
        auth_password=password,
        credential_ttl_s=ttl,
        sys_password=_secret(env, "GT_NATS_SYS_PASSWORD"),
    )


def issuer_public(seed: bytes) -> str:
    """The public key (A...) of an account seed (SA...).

    Raises:
        ValueError: not an account seed.
    """
    pair = nkeys.from_seed(bytearray(seed))
    public = bytes(pair.public_key).decode()
    if not public.startswith("A"):
        raise ValueError("not an account seed")
    return public


def new_issuer_seed() -> str:
    """A fresh account nkey seed for ``auth_callout.issuer``."""
    return bytes(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_ACCOUNT)).decode()


# ---- JWTs ------------------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode_jwt(claims: dict[str, Any], seed: bytes) -> str:
    signing_input = f"{_b64(json.dumps(_HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    signature = nkeys.from_seed(bytearray(seed)).sign(signing_input.encode())
    return f"{signing_input}.{_b64(bytes(signature))}"


class BadRequestError(GastownError, ValueError):
    """An authorization request that cannot be read or was not signed by a server."""


def decode_request(token: bytes) -> dict[str, Any]:
    """The claims of an authorization request JWT, checked: signed by the server key it names as ``iss``.

    Raises:
        BadRequestError: anything else.
    """
    try:
        header_b64, claims_b64, sig_b64 = token.decode("ascii").split(".")
        claims = json.loads(_unb64(claims_b64))
        signature = _unb64(sig_b64)
    except (ValueError, UnicodeError, binascii.Error, RecursionError) as exc:
        raise BadRequestError(f"unreadable authorization request: {exc!r}"[:300]) from exc
    if not isinstance(claims, dict) or claims.get("aud") != REQUEST_AUDIENCE:
        raise BadRequestError("not an authorization request")
    _verify_server_signature(str(claims.get("iss", "")), f"{header_b64}.{claims_b64}".encode(), signature)
    return claims


def _verify_server_signature(issuer: str, signed: bytes, signature: bytes) -> None:
    try:
        raw = base64.b32decode(issuer + "=" * (-len(issuer) % 8))
    except (ValueError, binascii.Error) as exc:
        raise BadRequestError("the request's issuer is not a server nkey") from exc
    checksum = int.from_bytes(raw[33:], "little")
    if len(raw) != 35 or raw[0] != _SERVER_PREFIX or nkeys.crc16(bytearray(raw[:33])) != checksum:
        raise BadRequestError("the request's issuer is not a server nkey")
    try:
        nacl.signing.VerifyKey(raw[1:33]).verify(signed, signature)
    except nacl.exceptions.BadSignatureError as exc:
        raise BadRequestError("the request's signature is not its issuer's") from exc


# ---- the answer --------------------------------------------------------------------------------------


class Responder:
    """Answers authorization requests for polecat sessions and town agents. ``live(login)`` says whether the witness
    still knows the session (its id) and it has not ended, or runs that launch of the town agent (``agent-mayor#3``:
    ``TownAgentClaim.login``); ``clock`` gives unix seconds."""

    def __init__(
        self,
        settings: CalloutSettings,
        buckets: session_identity.SessionBuckets,
        live: Callable[[str], bool],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.buckets = buckets
        self.live = live
        self.clock = clock
        self.issuer = issuer_public(settings.issuer_seed)
        self.granted = 0
        self.refused = 0
        self.kicked = 0
        self.connections: dict[str, set[tuple[str, int]]] = {}
        """The (server id, client id) of each connection granted to a session (this process's: a restarted
        witness knows none, and their credential's expiry ends them)."""
        self.serving = asyncio.Event()
        """Set once the responder's subscription is made (logins are answered from then on)."""

    def answer(self, request: bytes) -> bytes | None:
        """The response JWT to one request (None: not even whom to answer could be read: it is dropped, and the
        server refuses the login when its wait ends)."""
        try:
            claims = decode_request(request)
            nats_claims = claims["nats"]
            user_nkey = str(nats_claims["user_nkey"])
            server_id = str(nats_claims["server_id"]["id"])
            opts = nats_claims.get("connect_opts") or {}
        except (BadRequestError, KeyError, TypeError, AttributeError) as exc:
            log.warning("auth_request_unreadable", error=str(exc)[:300])
            return None
        user = opts.get("user") if isinstance(opts, dict) else None
        password = opts.get("pass") if isinstance(opts, dict) else None
        now = self.clock()
        checked = session_identity.verify(self.settings.session_key, user, password, now)
        if isinstance(checked, session_identity.Refusal):
            return self._refuse(user_nkey, server_id, checked.reason)
        if isinstance(checked, session_identity.TownAgentClaim):
            login, permissions = checked.login, session_identity.town_agent_permissions(checked, self.buckets)
            if not self.live(login):
                why = f"town agent {checked.name} is not running, or runs another launch than run {checked.run}"
                return self._refuse(user_nkey, server_id, why)
            log.info("town_agent_login_granted", agent=checked.name)
        else:
            login, permissions = checked.session, session_identity.session_permissions(checked, self.buckets)
            if not self.live(login):
                return self._refuse(user_nkey, server_id, f"session {login} unknown, ended or expired")
            log.info("session_login_granted", session=login, rig=checked.rig, polecat=checked.polecat)
        self.granted += 1
        client = nats_claims.get("client_info") or {}
        client_id = client.get("id") if isinstance(client, dict) else None
        if isinstance(client_id, int):
            self.connections.setdefault(login, set()).add((server_id, client_id))
        name = checked.user if isinstance(checked, session_identity.TownAgentClaim) else login
        user_jwt = self._user_jwt(user_nkey, name, checked.expires_at, permissions, now)
        return self._response(user_nkey, server_id, now, user_jwt=user_jwt)

    def _user_jwt(self, user_nkey: str, login: str, expires_at: int, permissions: dict[str, Any], now: float) -> str:
        claims = {
            "jti": secrets.token_hex(16),
            "iat": int(now),
            "iss": self.issuer,
            "sub": user_nkey,
            "name": login,
            "aud": SESSION_ACCOUNT,
            "exp": expires_at,
            "nats": {**permissions, "type": "user", "version": 2},
        }
        return encode_jwt(claims, self.settings.issuer_seed)

    def _refuse(self, user_nkey: str, server_id: str, reason: str) -> bytes:
        self.refused += 1
        log.warning("session_login_refused", reason=reason)
        return self._response(user_nkey, server_id, self.clock(), error=reason)

    def _response(
        self, user_nkey: str, server_id: str, now: float, *, user_jwt: str | None = None, error: str | None = None
    ) -> bytes:
        body: dict[str, Any] = {"type": "authorization_response", "version": 2}
        if user_jwt is not None:
            body["jwt"] = user_jwt
        if error is not None:
            body["error"] = error
        claims = {
            "jti": secrets.token_hex(16),
            "iat": int(now),
            "iss": self.issuer,
            "sub": user_nkey,
            "aud": server_id,
            "nats": body,
        }
        return encode_jwt(claims, self.settings.issuer_seed).encode()

    @map_errors
    async def serve(self, nc: Client) -> None:
        """Answer requests on ``nc`` (logged in as the ``auth`` user) until cancelled."""
        # A queue group: with several witnesses (one per set of rigs) one answers each login.
        sub = await nc.subscribe(AUTH_SUBJECT, queue=RESPONDERS)
        await nc.flush()
        self.serving.set()
        log.info("auth_callout_serving", issuer=self.issuer)
        try:
            async for msg in sub.messages:
                await self._handle(nc, msg)
        finally:
            await sub.unsubscribe()

    @map_errors
    async def kick(self, sys_nc: Client, session: str) -> int:
        """Disconnect the connections granted to ``session`` (logged in as the ``sys`` user); how many the
        servers acknowledged. Its next login is refused by the live check, not by this."""
        done = 0
        for server_id, client_id in sorted(self.connections.pop(session, set())):
            subject = f"$SYS.REQ.SERVER.{server_id}.KICK"
            try:
                await sys_nc.request(subject, json.dumps({"cid": client_id}).encode(), timeout=KICK_TIMEOUT_S)
            except (nats.errors.Error, TimeoutError) as exc:
                # Gone already, or its server is away: its credential's expiry is the backstop.
                log.warning("session_kick_failed", session=session, server=server_id, cid=client_id, error=repr(exc))
                continue
            done += 1
        if done:
            self.kicked += done
            log.info("session_kicked", session=session, connections=done)
        return done

    async def _handle(self, nc: Client, msg: Msg) -> None:
        try:
            response = self.answer(msg.data)
        except Exception:
            # A bug on one request refuses that login (the server times it out); the next is answered.
            log.exception("auth_request_failed")
            return
        if response is not None and msg.reply:
            await nc.publish(msg.reply, response)


def keygen_lines() -> list[str]:
    """A fresh issuer key pair and session key, as ``.env`` lines: the server reads ``GT_AUTH_ISSUER``, the
    witness the other two."""
    seed = new_issuer_seed()
    return [
        f"GT_AUTH_ISSUER={issuer_public(seed.encode())}",
        f"GT_AUTH_ISSUER_SEED={seed}",
        f"GT_SESSION_KEY={secrets.token_hex(32)}",
    ]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["keygen"]:
        print("usage: python -m shared.bus.auth_callout keygen  (prints .env lines; keep the output secret)")
        sys.exit(2)
    print("\n".join(keygen_lines()))
