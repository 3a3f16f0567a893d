"""Session credentials, their permissions and the auth callout's answers, without a server."""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import nkeys
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from shared.bus.auth_callout import (
    CalloutSettings,
    Responder,
    encode_jwt,
    issuer_public,
    keygen_lines,
    load_settings,
    new_issuer_seed,
)
from shared.core.ids import hook_lease_name
from shared.core.subjects import SessionOrigin, session_command_subject
from shared.model.session_identity import (
    AGENT_COMMANDS,
    Refusal,
    SessionBuckets,
    SessionClaim,
    mint,
    session_permissions,
    verify,
)

KEY = b"k" * 32
NOW = 1_800_000_000
BUCKETS = SessionBuckets("GT_EVT", "GT_HEARTBEATS", "GT_LEASES")


def token(**overrides: Any) -> str:
    fields: dict[str, Any] = {
        "session": "hq-abc123-1",
        "rig": "demo",
        "polecat": "ace",
        "bead": "hq-abc123",
        "expires_at": NOW + 60,
    }
    fields.update(overrides)
    return mint(KEY, **fields)


def test_a_minted_credential_says_who_the_session_is_until_it_expires() -> None:
    claim = verify(KEY, "hq-abc123-1", token(), NOW)
    assert claim == SessionClaim("hq-abc123-1", "demo", "ace", "hq-abc123", NOW + 60)
    assert isinstance(claim, SessionClaim)
    assert claim.origin == SessionOrigin("demo", "ace", "hq-abc123-1")
    assert isinstance(verify(KEY, "hq-abc123-1", token(), NOW + 60), Refusal), "expired at its expiry"
    assert "expired" in str(verify(KEY, "hq-abc123-1", token(), NOW + 61))


def test_a_credential_is_good_only_for_its_session_with_what_it_says_and_the_towns_key() -> None:
    good = token()
    assert isinstance(verify(KEY, "hq-abc123-2", good, NOW), Refusal), "another session's user name"
    assert isinstance(verify(b"another key" * 3, "hq-abc123-1", good, NOW), Refusal)
    parts = good.split(".")
    for index, forged in ((1, "other"), (2, "bob"), (3, "hq-zzz999"), (4, str(NOW + 10**6))):
        changed = ".".join([*parts[:index], forged, *parts[index + 1 :]])
        assert isinstance(verify(KEY, "hq-abc123-1", changed, NOW), Refusal), forged


@given(hs.one_of(hs.text(), hs.none(), hs.integers(), hs.binary()), hs.one_of(hs.text(), hs.none(), hs.binary()))
def test_verify_never_raises_whatever_it_is_given(user: object, password: object) -> None:
    assert isinstance(verify(KEY, user, password, NOW), Refusal)
    if isinstance(password, str):
        assert isinstance(verify(KEY, "hq-abc123-1", "v1." + password, NOW), Refusal)


def test_a_session_may_publish_its_own_command_subjects_and_keys_and_read_only_its_own_inbox() -> None:
    claim = SessionClaim("hq-abc123-1", "demo", "ace", "hq-abc123", NOW + 60)
    perms = session_permissions(claim, BUCKETS)
    publish = perms["pub"]["allow"]
    origin = SessionOrigin("demo", "ace", "hq-abc123-1")
    assert {session_command_subject(a, v, origin) for a, v in AGENT_COMMANDS} <= set(publish)
    assert not [p for p in publish if p.startswith("gt.cmd.") and not p.endswith(".demo.ace.hq-abc123-1")]
    assert "$KV.GT_HEARTBEATS.hq-abc123-1" in publish
    lease = f"$KV.GT_LEASES.{hook_lease_name('hq-abc123')}"
    assert lease in publish
    assert f"$JS.API.DIRECT.GET.KV_GT_LEASES.{lease}" in publish
    # Nothing that reads or changes any key but its own: no bare direct get, no message get, no stream info
    # (it lists every key), no purge, no wildcard under a bucket.
    for subject in publish:
        assert "KV_GT" not in subject or subject.startswith("$JS.API.DIRECT.GET.KV_GT_"), subject
        assert not (subject.startswith("$KV.") and subject.endswith(">")), subject
    assert "$JS.API.DIRECT.GET.KV_GT_LEASES" not in publish
    assert perms["sub"] == {"allow": ["_INBOX_s-hq-abc123-1.>"]}
    # Of the log, only its own commands' outcomes and its own lease's newest event, each by a direct get naming it
    # (the session a literal token: a wildcard in the subject it asks for cannot stand for another's):
    # no stream info (it lists every subject), no message get or bare direct get (their body names any
    # subject), no consumer (its deliver subject could name any subject), no JetStream API beyond these.
    reads_of_the_log = [p for p in publish if p.startswith("$JS.API.") and "KV_GT" not in p]
    assert sorted(reads_of_the_log) == [
        "$JS.API.DIRECT.GET.GT_EVT.gt.evt.cmd.hq-abc123-1.*",
        f"$JS.API.DIRECT.GET.GT_EVT.gt.evt.lease.{hook_lease_name('hq-abc123')}",
    ]
    assert set(perms) == {"pub", "sub"}, "no `resp`: nothing sends a session requests"


# ---- the responder's answers ---------------------------------------------------------------------


SERVER_SEED = bytes(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_SERVER))
USER_NKEY = bytes(
    nkeys.from_seed(bytearray(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))).public_key
).decode()


def server_request(user: object, password: object, *, seed: bytes = SERVER_SEED) -> bytes:
    server_id = bytes(nkeys.from_seed(bytearray(seed)).public_key).decode()
    claims = {
        "jti": "x",
        "iat": NOW,
        "iss": server_id,
        "sub": "$G",
        "aud": "nats-authorization-request",
        "nats": {
            "server_id": {"name": "n", "host": "h", "id": server_id},
            "user_nkey": USER_NKEY,
            "client_info": {},
            "connect_opts": {"user": user, "pass": password},
            "type": "authorization_request",
            "version": 2,
        },
    }
    return encode_jwt(claims, seed).encode()


def claims_of(jwt: bytes | str) -> dict[str, Any]:
    text = jwt.decode() if isinstance(jwt, bytes) else jwt
    body = text.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return decoded


def responder(live: set[str]) -> Responder:
    settings = CalloutSettings(issuer_seed=new_issuer_seed().encode(), session_key=KEY, auth_password="p")
    return Responder(settings, BUCKETS, lambda s: s in live, clock=lambda: float(NOW))


def test_a_live_sessions_login_gets_a_user_jwt_of_its_own_for_the_agents_account_until_its_expiry() -> None:
    answering = responder({"hq-abc123-1"})
    response = answering.answer(server_request("hq-abc123-1", token()))
    assert response is not None
    outer = claims_of(response)
    assert outer["iss"] == answering.issuer
    assert outer["sub"] == USER_NKEY
    assert outer["nats"]["type"] == "authorization_response"
    assert "error" not in outer["nats"]
    user = claims_of(outer["nats"]["jwt"])
    assert (user["aud"], user["name"], user["exp"], user["sub"]) == ("AGENTS", "hq-abc123-1", NOW + 60, USER_NKEY)
    assert user["iss"] == answering.issuer
    assert user["nats"]["sub"] == {"allow": ["_INBOX_s-hq-abc123-1.>"]}


def test_an_ended_session_or_a_bad_password_is_refused_with_the_reason() -> None:
    answering = responder(set())
    ended = claims_of(answering.answer(server_request("hq-abc123-1", token())) or b"")
    assert ended["nats"]["error"] == "session hq-abc123-1 unknown, ended or expired"
    assert "jwt" not in ended["nats"]
    wrong = claims_of(answering.answer(server_request("hq-abc123-1", token()[:-2] + "00")) or b"")
    assert "not one the witness minted" in wrong["nats"]["error"]
    assert answering.refused == 2


def test_a_request_not_signed_by_a_server_or_unreadable_is_dropped_never_raised() -> None:
    answering = responder({"hq-abc123-1"})
    not_a_server = bytes(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_ACCOUNT))
    forged = server_request("hq-abc123-1", token(), seed=not_a_server)
    good = server_request("hq-abc123-1", token()).split(b".")
    other_signature = server_request("hq-abc123-1", "x").split(b".")[2]
    for request in (
        b"",
        b"a.b.c",
        b"\xff.\x00.\x01",
        b"[" * 100_000,
        forged,
        b".".join([good[0], good[1], other_signature]),
        b".".join([good[0], base64.urlsafe_b64encode(b"[" * 10_000).rstrip(b"="), good[2]]),
    ):
        assert answering.answer(request) is None
    assert answering.granted == 0


def test_keygen_makes_a_pair_the_witness_reads() -> None:
    lines = dict(line.split("=", 1) for line in keygen_lines())
    assert issuer_public(lines["GT_AUTH_ISSUER_SEED"].encode()) == lines["GT_AUTH_ISSUER"]
    settings = load_settings({**lines, "GT_NATS_AUTH_PASSWORD": "p1"})
    assert settings is not None
    assert settings.credential_ttl_s == 7 * 24 * 3600
    assert load_settings({}) is None, "not configured: sessions get the shared credentials"


def test_every_client_has_its_own_inbox_prefix_by_default() -> None:
    from shared.core.config import load

    assert load({"NATS_USER": "operator"}).inbox_prefix == "_INBOX_operator"
    assert load({}).inbox_prefix is None, "no user (gt up): nats-py's own"
    assert load({"NATS_USER": "hq-abc123-1", "NATS_INBOX_PREFIX": "_INBOX_s-hq-abc123-1"}).inbox_prefix == (
        "_INBOX_s-hq-abc123-1"
    )
    assert load({"NATS_USER": "ops.alice"}).inbox_prefix is None, "a user that is no subject token: the default"
    with pytest.raises(ValueError, match="NATS_INBOX_PREFIX"):
        load({"NATS_INBOX_PREFIX": "_INBOX.>"})


def test_the_responder_remembers_which_connections_it_granted_to_cut_them_when_the_session_ends() -> None:
    answering = responder({"hq-abc123-1"})
    request = claims_of(server_request("hq-abc123-1", token()))
    request["nats"]["client_info"] = {"id": 42}
    answering.answer(encode_jwt(request, SERVER_SEED).encode())
    assert answering.connections == {"hq-abc123-1": {(request["nats"]["server_id"]["id"], 42)}}
