"""The credentials of a town `gt up` runs on its embedded NATS server: the same users and per-session identities as
the compose stack (ops/nats/accounts.conf), generated once into ``GT_HOME/secrets/`` (directory 0700, files 0600)
and kept, so a town restarted keeps its logins and its sessions' minted credentials.

Each service gets only its own password (as a file's path, never the password in its environment); the witness also
the auth callout's issuer seed, session key and the ``auth``/``sys`` passwords; the embedded server the passwords of
every user (it checks them) and the issuer's public key. The operator's `gt` finds ``operator``'s password here by
itself (``operator_login``). Anything running as the same OS user can read these files too: docs/deployment.md,
"On a laptop: `gt up`", says what that leaves an agent, and how agents run as another user.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import NamedTuple

import msgspec

from shared.bus.auth_callout import issuer_public, new_issuer_seed
from shared.core.config import TownConfig

USERS = ("mayor", "witness", "refinery", "deacon", "operator", "admin", "plugin", "runner", "auth", "sys")
"""The users of ops/nats/accounts.conf (sessions come through the auth callout, with no password of their own)."""
SERVICES = ("mayor", "witness", "refinery", "deacon")
ISSUER_SEED = "auth-issuer.seed"
SESSION_KEY = "session.key"
DEFAULT_MAX_FILE = "100GB"
"""The town's JetStream storage limit on a laptop (accounts.conf's GT_NATS_MAX_FILE), unless set."""
DEFAULT_MAX_MEM = "256MB"


def secrets_dir(gt_home: Path) -> Path:
    return gt_home / "secrets"


def password_file(gt_home: Path, user: str) -> Path:
    return secrets_dir(gt_home) / "nats" / f"{user}.password"


class TownSecrets(NamedTuple):
    """Where a town's credentials are (``ensure`` made them)."""

    home: Path

    def password(self, user: str) -> str:
        return password_file(self.home, user).read_text().strip()

    def password_path(self, user: str) -> Path:
        return password_file(self.home, user)

    @property
    def issuer_seed_path(self) -> Path:
        return secrets_dir(self.home) / ISSUER_SEED

    @property
    def session_key_path(self) -> Path:
        return secrets_dir(self.home) / SESSION_KEY

    def server_env(self, env: dict[str, str]) -> dict[str, str]:
        """The embedded server's environment: ``env`` with every user's password, the callout's issuer and the
        town's JetStream limits (accounts.conf reads them; GT_NATS_MAX_FILE/MAX_MEM from ``env`` when set)."""
        out = {**env}
        for user in USERS:
            out[f"GT_NATS_{user.upper()}_PASSWORD"] = self.password(user)
        out["GT_AUTH_ISSUER"] = issuer_public(self.issuer_seed_path.read_text().strip().encode())
        out.setdefault("GT_NATS_MAX_FILE", DEFAULT_MAX_FILE)
        out.setdefault("GT_NATS_MAX_MEM", DEFAULT_MAX_MEM)
        return out

    def service_env(self, env: dict[str, str], service: str) -> dict[str, str]:
        """A service's environment: ``env`` without any other login, with its own user and password file (and
        the witness's per-session identity settings, each as a file)."""
        out = {k: v for k, v in env.items() if not _is_login(k)}
        out["NATS_USER"] = service
        out["NATS_PASSWORD_FILE"] = str(self.password_path(service))
        if service == "witness":
            out["GT_AUTH_ISSUER_SEED_FILE"] = str(self.issuer_seed_path)
            out["GT_SESSION_KEY_FILE"] = str(self.session_key_path)
            out["GT_NATS_AUTH_PASSWORD_FILE"] = str(self.password_path("auth"))
            out["GT_NATS_SYS_PASSWORD_FILE"] = str(self.password_path("sys"))
        return out


def _is_login(name: str) -> bool:
    """A variable that names a NATS login or a town secret (a service gets its own, never the caller's)."""
    if name.startswith("NATS_") and name != "NATS_URL":
        return True
    if name.endswith(("_NATS_USER", "_NATS_PASSWORD", "_NATS_PASSWORD_FILE", "_NATS_CREDS")):
        return True
    secret_words = ("PASSWORD", "SEED", "SESSION_KEY", "SECRET")
    return name.startswith("GT_") and any(word in name for word in secret_words)


def _write_new(path: Path, text: str) -> None:
    """Create ``path`` (0600) with ``text``, unless it is there: a second `gt up` racing keeps the first's. Written
    aside and linked into place, so an interrupted write never leaves an empty credential behind."""
    if path.exists():
        return
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (text + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)
    except FileExistsError:
        pass
    finally:
        temp.unlink(missing_ok=True)


DASHBOARD_TOKEN = "dashboard.token"  # noqa: S105 (its file's name)


def dashboard_token(gt_home: Path) -> str:
    """The token ``gt dashboard`` asks of every request (made the first time, kept: a restarted dashboard takes the
    pages still open): without it, whoever reaches the port on loopback (an agent too) would read the town."""
    directory = secrets_dir(gt_home)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    _write_new(directory / DASHBOARD_TOKEN, secrets.token_urlsafe(24))
    return (directory / DASHBOARD_TOKEN).read_text().strip()


def ensure(gt_home: Path) -> TownSecrets:
    """The town's credentials, made now for any that are missing (kept otherwise)."""
    nats_dir = password_file(gt_home, "x").parent
    for directory in (secrets_dir(gt_home), nats_dir):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    for user in USERS:
        # nats-server reads a password from its environment like a config value: letters and digits, from a
        # letter (accounts.conf).
        _write_new(password_file(gt_home, user), f"p{secrets.token_hex(24)}")
    _write_new(secrets_dir(gt_home) / ISSUER_SEED, new_issuer_seed())
    _write_new(secrets_dir(gt_home) / SESSION_KEY, secrets.token_hex(32))
    return TownSecrets(gt_home)


def operator_login(gt_home: Path) -> tuple[str, str] | None:
    """The operator's user and password of the town `gt up` runs in ``gt_home``; None when it has none."""
    path = password_file(gt_home, "operator")
    try:
        password = path.read_text().strip()
    except OSError:
        return None
    return ("operator", password) if password else None


def as_operator(config: TownConfig) -> TownConfig:
    """``config`` logged in as the operator of the town `gt up` runs in its GT_HOME, when it names no login of its
    own (NATS_USER, NATS_CREDS) and the town has credentials; else ``config`` as it is."""
    if config.nats_user or config.nats_creds:
        return config
    login = operator_login(config.gt_home)
    if login is None:
        return config
    user, password = login
    return msgspec.structs.replace(config, nats_user=user, nats_password=password)


def as_user(config: TownConfig, user: str) -> TownConfig:
    """``config`` logged in as ``user`` of the town's own credentials (the supervisor's admin login)."""
    return msgspec.structs.replace(config, nats_user=user, nats_password=TownSecrets(config.gt_home).password(user))
