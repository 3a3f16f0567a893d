"""Which NATS credentials a polecat session gets from the witness's environment."""

from __future__ import annotations

from services.witness.effects.agent_creds import agent_nats_credentials, is_credential

WITNESS_OWN = {"NATS_USER": "witness", "NATS_PASSWORD": "witness-secret", "NATS_CREDS": "/run/witness.creds"}


def test_without_agent_credentials_a_session_gets_the_witnesss_as_before() -> None:
    assert agent_nats_credentials({**WITNESS_OWN, "HOME": "/root"}) == WITNESS_OWN
    assert agent_nats_credentials({"HOME": "/root"}) == {}


def test_agent_credentials_replace_every_one_of_the_witnesss() -> None:
    env = {**WITNESS_OWN, "GT_AGENT_NATS_USER": "agent", "GT_AGENT_NATS_PASSWORD": "agent-secret"}
    # Not the witness's creds file either: a session holds the agent user only.
    assert agent_nats_credentials(env) == {"NATS_USER": "agent", "NATS_PASSWORD": "agent-secret"}


def test_an_agent_creds_file_alone_is_enough() -> None:
    env = {**WITNESS_OWN, "GT_AGENT_NATS_CREDS": "/run/agent.creds"}
    assert agent_nats_credentials(env) == {"NATS_CREDS": "/run/agent.creds"}


def test_empty_agent_variables_count_as_unset() -> None:
    assert agent_nats_credentials({**WITNESS_OWN, "GT_AGENT_NATS_USER": ""}) == WITNESS_OWN


def test_an_agent_password_file_is_passed_on_as_a_credential() -> None:
    env = {**WITNESS_OWN, "GT_AGENT_NATS_USER": "agent", "GT_AGENT_NATS_PASSWORD_FILE": "/run/agent.pw"}
    assert agent_nats_credentials(env) == {"NATS_USER": "agent", "NATS_PASSWORD_FILE": "/run/agent.pw"}


def test_credential_variables_are_never_passed_on_by_name() -> None:
    names = ("NATS_PASSWORD", "NATS_PASSWORD_FILE", "GT_AGENT_NATS_PASSWORD", "GT_AGENT_NATS_CREDS")
    assert all(is_credential(k) for k in names)
    assert not is_credential("GT_AGENT_FAULT")
    assert not is_credential("ANTHROPIC_API_KEY")


def test_the_keys_the_witness_mints_and_vouches_with_are_never_passed_on_even_when_named() -> None:
    for key in ("GT_AUTH_ISSUER_SEED", "GT_SESSION_KEY_FILE", "GT_NATS_AUTH_PASSWORD", "NATS_INBOX_PREFIX"):
        assert is_credential(key), key
