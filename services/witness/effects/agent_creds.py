"""Which NATS credentials a polecat session gets.

With ``GT_AGENT_NATS_USER`` / ``GT_AGENT_NATS_PASSWORD`` / ``GT_AGENT_NATS_CREDS`` set on the witness, the
session gets those as ``NATS_USER`` / ``NATS_PASSWORD`` / ``NATS_CREDS`` and never the witness's own: an agent
runs arbitrary code, so on a secured server it holds the least-privileged ``agent`` user. Without them the
session gets the witness's own (a laptop without auth needs none). A password never goes into the session's
environment as it is: the executor writes it to a private file the session's ``NATS_PASSWORD_FILE`` names
(``GT_AGENT_NATS_PASSWORD_FILE`` / ``NATS_PASSWORD_FILE`` name such a file of the operator's, passed on as is).
The witness reads them once, at start (``WitnessSettings.agent_credentials``): then it removes every secret from
its own environment (``shared.core.config.forget_secrets``), so nothing it starts inherits them.
"""

from __future__ import annotations

from collections.abc import Mapping

CREDENTIAL_VARS = ("NATS_USER", "NATS_PASSWORD", "NATS_PASSWORD_FILE", "NATS_CREDS", "NATS_INBOX_PREFIX")
AGENT_PREFIX = "GT_AGENT_"
AGENT_CREDENTIAL_VARS = tuple(AGENT_PREFIX + key for key in CREDENTIAL_VARS)
WITNESS_SECRETS = tuple(
    name + suffix
    for name in ("GT_AUTH_ISSUER_SEED", "GT_SESSION_KEY", "GT_NATS_AUTH_PASSWORD", "GT_NATS_SYS_PASSWORD")
    for suffix in ("", "_FILE")
)
"""What the witness mints session credentials and answers the auth callout with: no session ever gets them."""


def agent_nats_credentials(environ: Mapping[str, str]) -> dict[str, str]:
    """The session's NATS_* credentials, from the witness's environment ``environ``."""
    own = {key: environ[AGENT_PREFIX + key] for key in CREDENTIAL_VARS if environ.get(AGENT_PREFIX + key)}
    if own:
        return own
    return {key: environ[key] for key in CREDENTIAL_VARS if environ.get(key)}


def is_credential(key: str) -> bool:
    """A variable only ``agent_nats_credentials`` decides about (never passed on by name)."""
    return key in CREDENTIAL_VARS or key in AGENT_CREDENTIAL_VARS or key in WITNESS_SECRETS
