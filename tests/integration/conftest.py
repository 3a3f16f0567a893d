"""Fixtures for tests that run against both the pure model and a real mayor, and the secured town's (a town on the
shipped accounts: tests/secured_town.py)."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client

from shared.bus.connection import close_quietly
from shared.core.config import TownConfig
from tests.compose_stack import shipped_account_limits
from tests.conftest import REPO_ROOT
from tests.drivers import Driver, MemoryDriver, nats_driver
from tests.helpers import connect_within
from tests.secured_town import callout, passwords, secured, st  # noqa: F401 (fixtures of the secured town)
from tests.witness_town import PolecatTown, polecat_town

STALE_AFTER = timedelta(hours=4)


@pytest_asyncio.fixture(params=["memory", "nats"])
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    """The mayor, as pure logic over an in-memory log, or as the service on a real nats-server."""
    if request.param == "memory":
        yield MemoryDriver(STALE_AFTER)
        return
    town = request.getfixturevalue("town")  # a fresh server, only for this kind
    nc = await connect_within(town.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        async with nats_driver(town, nc) as driver:
            yield driver
    finally:
        await close_quietly(nc)


@pytest.fixture
def account_limits() -> dict[str, str]:
    """The JetStream limits a server with the shipped accounts.conf starts with (test_permissions.py's ``secured``):
    the shipped ones. A test module may override this fixture."""
    return shipped_account_limits(REPO_ROOT)


@pytest.fixture
async def pt(town: TownConfig, nc: Client, tmp_path: Path) -> AsyncIterator[PolecatTown]:
    """A town with real parts and its agents in tmux (tests/witness_town.py); a module needing other settings
    defines its own."""
    async with polecat_town(town, nc, tmp_path) as handle:
        yield handle


@pytest.fixture
def git_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every git process this test's services run, logged (subcommand and the word after it) by a git on PATH."""
    shim_dir, log = tmp_path / "shim", tmp_path / "git-calls.log"
    shim_dir.mkdir()
    real = shutil.which("git")
    assert real is not None
    shim = shim_dir / "git"
    # The subcommand and the word after it, past the `-c name=value` pairs every service git begins with.
    shim.write_text(
        "#!/bin/sh\n"
        'words=""; skip=0; n=0\n'
        'for arg in "$@"; do\n'
        "  if [ $skip = 1 ]; then skip=0; continue; fi\n"
        '  if [ "$arg" = "-c" ] && [ $n = 0 ]; then skip=1; continue; fi\n'
        '  n=$((n + 1)); words="${words:+$words }$arg"; [ $n = 2 ] && break\n'
        "done\n"
        f'echo "$words" >> {log}\n'
        f'exec {real} "$@"\n'
    )
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{shim_dir}{os.pathsep}{os.environ['PATH']}")
    return log
