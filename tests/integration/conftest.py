"""Fixtures for tests that run against both the pure model and a real mayor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import pytest_asyncio

from shared.bus.connection import close_quietly
from tests.compose_stack import shipped_account_limits
from tests.conftest import REPO_ROOT
from tests.drivers import Driver, MemoryDriver, nats_driver
from tests.helpers import connect_within

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
