"""A town on the shipped accounts (ops/nats/accounts.conf): each service, the operator, agents and plugins
connect as their own users through the auth callout. Its fixtures (``passwords``, ``callout``, ``secured``,
``st``) are every integration test's (tests/integration/conftest.py): the permission tests
(tests/integration/test_permissions.py) and those that attack the town from an agent's or a plugin's account."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from services.deacon.service import DeaconService
from services.mayor.service import MayorService
from services.refinery.service import RefineryService
from services.witness.service import WitnessService
from services.witness.settings import WitnessSettings
from shared.bus.auth_callout import CalloutSettings, Responder, issuer_public, new_issuer_seed
from shared.bus.connection import close_quietly, connect
from shared.bus.permissions import guarded
from shared.bus.query import ask
from shared.core.config import TownConfig
from shared.core.errors import PermissionDeniedError
from shared.core.subjects import SessionOrigin, session_inbox_prefix
from shared.model.queries import Digest
from shared.model.session_identity import SessionBuckets, mint
from shared.service import Service
from tests.conftest import REPO_ROOT
from tests.helpers import gt_run
from tests.witness_town import FAST, PolecatTown, make_origin, tmux_socket

ACCOUNTS = REPO_ROOT / "ops" / "nats" / "accounts.conf"
USERS = ("mayor", "witness", "refinery", "deacon", "operator", "admin", "plugin", "runner", "auth", "sys")
EXIT_DENIED = 4
FAIL_FAST_S = 4.0
"""A refusal is reported well before the 5 s a JetStream publish waits for its acknowledgement."""


@pytest.fixture
def passwords() -> dict[str, str]:
    # nats-server reads an environment variable like a value of its config: letters and digits, starting with
    # a letter, always read as the same string (docs/deployment.md).
    return {user: f"p{secrets.token_hex(16)}" for user in USERS}


@pytest.fixture
def callout(passwords: dict[str, str]) -> CalloutSettings:
    """The witness's side of per-session identities: a fresh issuer key, session key, the auth user's password."""
    return CalloutSettings(
        issuer_seed=new_issuer_seed().encode(),
        session_key=secrets.token_hex(32).encode(),
        auth_password=passwords["auth"],
        sys_password=passwords["sys"],
    )


@pytest.fixture
def secured(
    tmp_path: Path, passwords: dict[str, str], callout: CalloutSettings, account_limits: dict[str, str]
) -> Iterator[EmbeddedServer]:
    """A nats-server with the shipped accounts.conf, included as it is; the passwords, the auth callout's
    issuer and the account's JetStream limits in its environment."""
    env = {**os.environ, **{f"GT_NATS_{user.upper()}_PASSWORD": pw for user, pw in passwords.items()}}
    env["GT_AUTH_ISSUER"] = issuer_public(callout.issuer_seed)
    env.update(account_limits)
    server = EmbeddedServer(tmp_path / "nats", include=ACCOUNTS, env=env)
    server.start()
    try:
        yield server
    finally:
        server.kill()


class SecuredTown:
    """The server, the passwords, and helpers to act as each user."""

    def __init__(
        self,
        server: EmbeddedServer,
        passwords: dict[str, str],
        home: Path,
        gt_env: dict[str, str],
        callout: CalloutSettings,
    ) -> None:
        self.server = server
        self.passwords = passwords
        self.home = home
        self._gt_env = gt_env
        self.callout = callout

    def callout_env(self) -> dict[str, str]:
        """What the witness's environment holds to give sessions their own identities (as under compose)."""
        return {
            "GT_AUTH_ISSUER_SEED": self.callout.issuer_seed.decode(),
            "GT_SESSION_KEY": self.callout.session_key.decode(),
            "GT_NATS_AUTH_PASSWORD": self.callout.auth_password,
            "GT_NATS_SYS_PASSWORD": self.callout.sys_password or "",
        }

    def witness_env(self) -> dict[str, str]:
        """The environment the witness runs in (as under compose): its own login, and ``callout_env``."""
        return {"NATS_USER": "witness", "NATS_PASSWORD": self.passwords["witness"], **self.callout_env()}

    def session_config(self, origin: SessionOrigin, bead: str, *, expires_in_s: float = 3600.0) -> TownConfig:
        """A polecat session's own login, as the witness mints it: user = session id, its own inbox prefix."""
        password = mint(
            self.callout.session_key,
            session=origin.session,
            rig=origin.rig,
            polecat=origin.polecat,
            bead=bead,
            expires_at=int(time.time() + expires_in_s),
        )
        return TownConfig(
            nats_url=self.server.url,
            gt_home=self.home,
            nats_user=origin.session,
            nats_password=password,
            nats_inbox_prefix=session_inbox_prefix(origin.session),
        )

    def config(self, user: str) -> TownConfig:
        return TownConfig(
            nats_url=self.server.url, gt_home=self.home, nats_user=user, nats_password=self.passwords[user]
        )

    def cli_env(self, user: str) -> dict[str, str]:
        env = {**self._gt_env, "NATS_URL": self.server.url, "GT_HOME": str(self.home), "NATS_USER": user}
        env["NATS_PASSWORD"] = self.passwords[user]
        env.pop("NATS_CREDS", None)
        return env

    async def gt(self, user: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The real `gt` CLI as ``user``, without blocking the services on this event loop."""
        return await self._run_gt(self.cli_env(user), args)

    async def gt_in_session(self, origin: SessionOrigin, bead: str, *args: str) -> subprocess.CompletedProcess[str]:
        """The real `gt` CLI inside polecat session ``origin`` working on ``bead``, logged in as the session
        itself (as the witness sets it up: its own user, credential and inbox); it sends on its own subjects."""
        return await self._run_gt(self.session_env(origin, bead), args)

    def session_env(self, origin: SessionOrigin, bead: str) -> dict[str, str]:
        """The environment of a `gt` inside polecat session ``origin`` working on ``bead``."""
        config = self.session_config(origin, bead)
        env = {**self.cli_env("operator"), "NATS_USER": origin.session, "NATS_PASSWORD": config.nats_password or ""}
        env.update(
            NATS_INBOX_PREFIX=config.nats_inbox_prefix or "",
            GT_RIG=origin.rig,
            GT_POLECAT=origin.polecat,
            GT_SESSION=origin.session,
            GT_BEAD=bead,
            GT_WORKTREE=str(self.home / "worktree"),
            GT_BRANCH=f"polecat/{origin.polecat}/{bead}",
        )
        return env

    async def _run_gt(self, env: dict[str, str], args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(gt_run, env, *args)

    async def connect(self, user: str) -> Client:
        return await connect(self.config(user), name=f"test-{user}")

    def violations(self) -> list[str]:
        """The refusals the server logged (one line each, naming the user and the subject)."""
        return [line for line in self.server.log_file.read_text().splitlines() if "Violation" in line]


@pytest.fixture
def st(
    secured: EmbeddedServer, passwords: dict[str, str], tmp_path: Path, gt_env: dict[str, str], callout: CalloutSettings
) -> SecuredTown:
    return SecuredTown(secured, passwords, tmp_path / "home", gt_env, callout)


@contextlib.asynccontextmanager
async def responder_for(st: SecuredTown, live: Callable[[str], bool]) -> AsyncIterator[Responder]:
    """The auth callout responder on its own (no witness): ``live`` says which sessions may log in."""
    buckets = SessionBuckets("GT_EVT", "GT_HEARTBEATS", "GT_LEASES")
    responder = Responder(st.callout, buckets, live)
    config = TownConfig(nats_url=st.server.url, nats_user="auth", nats_password=st.passwords["auth"])
    nc = await connect(config, name="test-auth-callout")
    serving = asyncio.create_task(responder.serve(nc))
    try:
        await asyncio.wait_for(responder.serving.wait(), 30)
        yield responder
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await close_quietly(nc)


@contextlib.asynccontextmanager
async def services_as_themselves(st: SecuredTown, root: Path, *names: str) -> AsyncIterator[PolecatTown]:
    """The named services in this process, each connected as its own user; helpers read as the operator."""
    nc = await st.connect("operator")
    handle = PolecatTown(st.config("operator"), nc, make_origin(root), tmux_socket())
    try:
        for name in names:
            service = build_service(name, st.config(name), handle.socket)
            setattr(handle, name, service)
            await handle.start(name, service)
        yield handle
    finally:
        await handle.stop_all()
        handle.tmux.kill_server()
        await close_quietly(nc)


def build_service(name: str, config: TownConfig, socket: str) -> Service[Any]:
    if name == "mayor":
        return MayorService(config, FAST)
    if name == "witness":
        return WitnessService(config, FAST, witness=WitnessSettings(kill_grace_s=1.0, tmux_socket=socket))
    if name == "refinery":
        return RefineryService(config, FAST)
    assert name == "deacon"
    return DeaconService(config, FAST)


class Snapshot(msgspec.Struct, frozen=True):
    """What a refused attempt must leave as it was."""

    evt_last_seq: int
    cmd_last_seq: int
    cmd_messages: int
    cmd_consumers: tuple[str, ...]
    digests: tuple[tuple[str, str], ...]


async def snapshot(nc: Client, *services: str) -> Snapshot:
    js = nc.jetstream()
    evt = await js.stream_info("GT_EVT")
    cmd = await js.stream_info("GT_CMD")
    consumers = tuple(sorted(str(c.name) for c in await js.consumers_info("GT_CMD")))
    digests = []
    for service in services:
        found = await ask(nc, Digest(service=service, min_seq=int(evt.state.last_seq)))
        digests.append((service, found.sha256))
    return Snapshot(
        evt_last_seq=int(evt.state.last_seq),
        cmd_last_seq=int(cmd.state.last_seq),
        cmd_messages=int(cmd.state.messages),
        cmd_consumers=consumers,
        digests=tuple(digests),
    )


async def refused(nc: Client, op: Awaitable[Any], subject: str) -> PermissionDeniedError:
    """Run ``op`` as the project's code does (``guarded``); it must be refused at once, for ``subject``."""
    started = time.monotonic()
    with pytest.raises(PermissionDeniedError) as caught:
        await guarded(nc, op)
    assert time.monotonic() - started < FAIL_FAST_S, "a refusal is reported at once, not after a timeout"
    assert caught.value.subject == subject
    return caught.value


def denied_by_cli(done: subprocess.CompletedProcess[str], user: str, subject: str) -> None:
    assert done.returncode == EXIT_DENIED, (done.returncode, done.stdout, done.stderr)
    assert f"NATS user {user} may not publish to {subject}" in done.stderr
    assert "nothing was sent" in done.stderr
    assert done.stdout == ""


# ---- each role can do its work -----------------------------------------------------------------
