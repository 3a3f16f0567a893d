"""Town configuration, read from the environment (tests pass ``env=`` instead of patching os.environ)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import msgspec

from shared.core import subjects

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
MAX_REPLICAS = 5
NATS_CREDENTIALS = ("NATS_USER", "NATS_PASSWORD", "NATS_PASSWORD_FILE", "NATS_CREDS")
"""The variables a NATS login is read from; also in scoped forms (``MAYOR_NATS_PASSWORD``, ``GT_AGENT_NATS_USER``)."""
TOWN_SECRET_WORDS = ("PASSWORD", "SEED", "SECRET", "SESSION_KEY", "CREDS", "TOKEN")
"""A ``GT_*`` variable with one of these in its name is a secret of the town (``GT_AUTH_ISSUER_SEED``,
``GT_SESSION_KEY_FILE``, ``GT_NATS_AUTH_PASSWORD``, ``GT_NATS_MAYOR_PASSWORD``, ...)."""


class TownConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Where the town's parts are: NATS, the streams, the town directory. Read by ``load``."""

    nats_url: str = DEFAULT_NATS_URL
    """Comma-separated server URLs (``NATS_URL``)."""
    gt_home: Path = Path("~/.gastown").expanduser()
    """Where the town keeps rigs, the embedded server's store and run files (``GT_HOME``)."""
    evt_stream: str = subjects.DEFAULT_EVT_STREAM
    """Name of the event log stream (``GT_EVT_STREAM``)."""
    cmd_stream: str = subjects.DEFAULT_CMD_STREAM
    """Name of the command intake stream (``GT_CMD_STREAM``)."""
    snapshot_bucket: str = subjects.DEFAULT_SNAPSHOT_BUCKET
    """Object store bucket for projection snapshots (``GT_SNAPSHOT_BUCKET``)."""
    heartbeat_bucket: str = subjects.DEFAULT_HEARTBEAT_BUCKET
    """KV bucket where agents' ``gt heartbeat`` lands, one key per session (``GT_HEARTBEAT_BUCKET``)."""
    service_bucket: str = subjects.DEFAULT_SERVICE_BUCKET
    """KV bucket of service heartbeats, one key per service process (``GT_SERVICE_BUCKET``)."""
    lease_bucket: str = subjects.DEFAULT_LEASE_BUCKET
    """KV bucket of lease renewals, one key per lease (``GT_LEASE_BUCKET``)."""
    active_bucket: str = subjects.DEFAULT_ACTIVE_BUCKET
    """KV bucket holding, per service scope, which instance is the active one (``GT_ACTIVE_BUCKET``)."""
    replicas: int = 1
    """Stream replicas when provisioning (``GT_REPLICAS``; 3 in the cluster)."""
    escalation_stale_after_s: float = 4 * 3600.0
    """An open escalation nobody acknowledged for this long goes one severity up (``GT_ESCALATION_STALE_AFTER``,
    seconds; at most twice)."""
    nats_user: str | None = None
    nats_password: str | None = None
    nats_creds: str | None = None
    """Credentials: ``NATS_USER``/``NATS_PASSWORD`` (or the password in the file ``NATS_PASSWORD_FILE`` names: kept
    off command lines, how a polecat session gets its password) or a creds file (``NATS_CREDS``)."""
    nats_inbox_prefix: str | None = None
    """Where this client's replies, JetStream deliveries and KV watches arrive (``NATS_INBOX_PREFIX``); see
    ``inbox_prefix``."""

    @property
    def inbox_prefix(self) -> str | None:
        """``NATS_INBOX_PREFIX``, else ``_INBOX_<user>`` when a NATS user is set (the only inbox the shipped
        accounts let each user subscribe to: nobody reads another's replies), else None (nats-py's ``_INBOX``)."""
        if self.nats_inbox_prefix:
            return self.nats_inbox_prefix
        if self.nats_user and self.nats_user.replace("_", "").replace("-", "").isalnum():
            return f"_INBOX_{self.nats_user}"
        return None

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]


def load(env: Mapping[str, str] | None = None, *, service: str | None = None) -> TownConfig:
    """Read the config; ``<SERVICE>_NATS_URL`` (e.g. ``MAYOR_NATS_URL``) wins over ``NATS_URL``.

    Raises:
        ValueError: a setting has a value that cannot be used (the message names it).
    """
    env = os.environ if env is None else env

    def get(key: str) -> str | None:
        if service:
            scoped = env.get(f"{service.upper()}_{key}")
            if scoped:
                return scoped
        value = env.get(key)
        return value or None

    replicas_text = get("GT_REPLICAS") or "1"
    if not replicas_text.isdigit() or not 1 <= int(replicas_text) <= MAX_REPLICAS:
        raise ValueError(f"GT_REPLICAS must be a whole number from 1 to {MAX_REPLICAS}, got {replicas_text!r}")
    home = get("GT_HOME")
    stale_text = get("GT_ESCALATION_STALE_AFTER") or "14400"
    try:
        stale_after = float(stale_text)
    except ValueError:
        stale_after = -1.0
    if stale_after <= 0:
        raise ValueError(f"GT_ESCALATION_STALE_AFTER must be a positive number of seconds, got {stale_text!r}")
    return TownConfig(
        nats_url=get("NATS_URL") or DEFAULT_NATS_URL,
        gt_home=Path(home).expanduser() if home else Path("~/.gastown").expanduser(),
        evt_stream=get("GT_EVT_STREAM") or subjects.DEFAULT_EVT_STREAM,
        cmd_stream=get("GT_CMD_STREAM") or subjects.DEFAULT_CMD_STREAM,
        snapshot_bucket=get("GT_SNAPSHOT_BUCKET") or subjects.DEFAULT_SNAPSHOT_BUCKET,
        heartbeat_bucket=get("GT_HEARTBEAT_BUCKET") or subjects.DEFAULT_HEARTBEAT_BUCKET,
        service_bucket=get("GT_SERVICE_BUCKET") or subjects.DEFAULT_SERVICE_BUCKET,
        lease_bucket=get("GT_LEASE_BUCKET") or subjects.DEFAULT_LEASE_BUCKET,
        active_bucket=get("GT_ACTIVE_BUCKET") or subjects.DEFAULT_ACTIVE_BUCKET,
        replicas=int(replicas_text),
        escalation_stale_after_s=stale_after,
        nats_user=get("NATS_USER"),
        nats_password=get("NATS_PASSWORD") or _password_from_file(get("NATS_PASSWORD_FILE")),
        nats_creds=get("NATS_CREDS"),
        nats_inbox_prefix=_inbox_prefix(get("NATS_INBOX_PREFIX")),
    )


def _inbox_prefix(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.replace("_", "").replace("-", "").isalnum() or not value.startswith("_INBOX"):
        # The services answer queries only to inboxes (shared.core.subjects.is_inbox).
        raise ValueError(
            f"NATS_INBOX_PREFIX must be one subject token (letters, digits, _ and -) starting with _INBOX "
            f"(e.g. _INBOX_ann), got {value!r}"
        )
    return value


def _password_from_file(path: str | None) -> str | None:
    """The password in the file ``NATS_PASSWORD_FILE`` names (its first line), None when it names none."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            return file.readline().rstrip("\r\n") or None
    except OSError as exc:
        raise ValueError(f"NATS_PASSWORD_FILE {path!r} cannot be read: {exc.strerror}") from exc


def env_number(env: Mapping[str, str], key: str, default: float, *, minimum: float, whole: bool = False) -> float:
    """``env[key]`` as a number of at least ``minimum`` (``default`` when unset or empty).

    Raises:
        ValueError: naming the variable, when its value is not such a number.
    """
    text = env.get(key)
    if not text:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        kind = "whole number" if whole else "number"
        raise ValueError(f"{key} must be a {kind} of at least {minimum:g}, got {text!r}")
    return value


def is_secret(name: str) -> bool:
    """``name`` is a NATS login (``NATS_USER``, ``NATS_PASSWORD``, ``NATS_PASSWORD_FILE``, ``NATS_CREDS``, or a scoped
    form of one such as ``REFINERY_NATS_PASSWORD``) or a secret of the town (``GT_*`` with ``PASSWORD``, ``SEED``,
    ``SECRET``, ``SESSION_KEY``, ``CREDS`` or ``TOKEN`` in its name); ``forget_secrets`` removes these."""
    if any(name == key or name.endswith("_" + key) for key in NATS_CREDENTIALS):
        return True
    return name.startswith("GT_") and any(word in name for word in TOWN_SECRET_WORDS)


def forget_secrets(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Remove every secret (``is_secret``) from ``environ`` (this process's environment by default), once the
    process has read its configuration: nothing it starts from then on (git and its hooks, a gate, an automation,
    tmux, an agent) can inherit them, whatever environment the process itself was started with. The values live
    on in the loaded configuration only (``TownConfig``, the witness's settings), which reconnects use. The names
    removed, sorted."""
    environ = os.environ if environ is None else environ
    names = sorted(name for name in environ if is_secret(name))
    for name in names:
        del environ[name]
    return names


def town_mark(config: TownConfig) -> str:
    """What marks a town's tmux sessions (``shared.host.tmux.TOWN_OPTION``): a digest of its directory and its event
    stream, the same for every witness of the town (and `gt`) and across restarts; two towns of one OS user never
    share a ``GT_HOME`` (their rigs and worktrees are there)."""
    home = os.path.realpath(config.gt_home)
    return hashlib.sha256(f"{home}\0{config.evt_stream}".encode()).hexdigest()[:16]
