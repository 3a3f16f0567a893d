"""NATS connections a client helper's worker keeps from one ``gt`` call to the next (shared/bus/kept.py): calls share
them, and none is used that the server closed, that a call changed (a subscription left) or that idled out; a
call that leaves a task running makes its worker unfit. Against a nats-server of the test's own, which the test
restarts."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from gt.embedded_nats import EmbeddedServer
from shared.bus.connection import Connection, connect, connection_key
from shared.bus.kept import CHECK_AFTER_S, KeptConnections
from shared.core.config import TownConfig
from tests.integration.test_client_helper import Shell, helper_ready
from tests.integration.test_client_helper import mayor as mayor
from tests.integration.test_client_helper import runtime_dir as runtime_dir
from tests.integration.test_client_helper import shell as shell
from tests.service_process import ServiceProcess

CALLS = 12


@pytest.fixture
def nats_server(own_nats_server: EmbeddedServer) -> EmbeddedServer:
    """This module's tests restart their server: one of their own, never the one tests share."""
    return own_nats_server


def _cli_connections(server: EmbeddedServer) -> list[dict[str, Any]]:
    """Every connection (open or closed) a `gt` call made to ``server``, as its monitoring port lists them."""
    url = f"http://127.0.0.1:{server.http_port}/connz?state=all&limit=100000"
    with urllib.request.urlopen(url, timeout=5) as answer:
        listed: list[dict[str, Any]] = json.load(answer).get("connections") or []
    return [c for c in listed if c.get("name") == "gt-cli"]


async def test_calls_through_the_helper_share_their_workers_connections(
    shell: Shell, mayor: ServiceProcess, nats_server: EmbeddedServer
) -> None:
    assert (await shell("ready")).code == 0
    helper = await helper_ready(shell)
    before = len(_cli_connections(nats_server))
    for i in range(CALLS):
        run = await shell("bead", "create", f"kept {i}") if i % 2 else await shell("ready")
        assert (run.code, run.err) == (0, ""), run
    made = len(_cli_connections(nats_server)) - before
    workers = len(helper.children())
    assert 1 <= made <= workers < CALLS, (made, workers)  # one per worker at most, not one per call
    listed = await shell("bead", "list", "--json")
    assert [b["title"] for b in json.loads(listed.out)] == [f"kept {i}" for i in range(1, CALLS, 2)]


async def test_a_call_after_the_server_restarted_connects_afresh_and_says_nothing_of_it(
    shell: Shell, mayor: ServiceProcess, nats_server: EmbeddedServer
) -> None:
    assert (await shell("ready")).code == 0
    await helper_ready(shell)
    for _ in range(3):
        assert (await shell("ready")).code == 0  # each worker now keeps a connection
    nats_server.restart()
    for i in range(4):
        run = await shell("bead", "create", f"after the restart {i}")
        assert run.code == 0, run
        # No word of the kept connection that was found closed (that the mayor, reconnecting too, has not answered
        # yet may be said: the command is stored, its id on stdout).
        said = [line for line in run.err.splitlines() if not line.startswith("gt: stored: ")]
        assert said == [], run.err


@pytest.fixture
def clock() -> list[float]:
    """The kept connections' clock, moved by the test."""
    return [0.0]


@pytest.fixture
def kept(clock: list[float]) -> Iterator[KeptConnections]:
    connections = KeptConnections(keep_idle_s=60.0, clock=lambda: clock[0])
    yield connections
    connections.close()


def _lend(kept: KeptConnections, town: TownConfig) -> Connection:
    async def lend() -> Connection:
        return await kept.connect(connection_key(town), lambda: connect(town, name="gt-cli"))

    return kept.run(lend())


def _made_afresh(kept: KeptConnections, town: TownConfig, earlier: Connection) -> Connection:
    """A connection lent where ``earlier`` (the first one made) must not be: the second one made."""
    nc = _lend(kept, town)
    assert nc is not earlier
    assert kept.made == 2
    return nc


def _give_back(kept: KeptConnections, nc: Connection) -> None:
    kept.run(kept.give_back(nc))


def test_a_connection_is_lent_again_only_as_it_was_made(kept: KeptConnections, town: TownConfig) -> None:
    first = _lend(kept, town)
    kept.run(first.request("$JS.API.INFO", b"", timeout=5))  # a request: nats-py's own reply subscription made
    _give_back(kept, first)
    assert kept.tidy()
    again = _lend(kept, town)
    assert again is first
    assert kept.made == 1
    # A call that leaves a subscription (a watch, a consumer) behind: its connection is closed, not lent again.
    kept.run(again.subscribe("gt.test.left"))
    _give_back(kept, again)
    assert again.is_closed
    assert kept.tidy()
    _give_back(kept, _made_afresh(kept, town, first))


def test_no_connection_the_server_closed_is_lent(
    kept: KeptConnections, town: TownConfig, nats_server: EmbeddedServer
) -> None:
    first = _lend(kept, town)
    _give_back(kept, first)
    nats_server.restart()
    second = _made_afresh(kept, town, first)
    assert kept.run(second.flush(timeout=5)) is None  # the fresh one works
    _give_back(kept, second)


def test_different_servers_or_logins_never_share_a_connection(
    kept: KeptConnections, town: TownConfig, nats_server: EmbeddedServer
) -> None:
    first = _lend(kept, town)
    _give_back(kept, first)
    other = TownConfig(nats_url=f"nats://localhost:{nats_server.port}", gt_home=town.gt_home)
    _give_back(kept, _made_afresh(kept, other, first))
    assert _lend(kept, town) is first


def test_a_connection_idle_too_long_is_closed(kept: KeptConnections, town: TownConfig, clock: list[float]) -> None:
    first = _lend(kept, town)
    _give_back(kept, first)
    clock[0] += 30.0
    kept.expire()
    assert not first.is_closed  # 30 s of the 60 allowed
    clock[0] += 30.0
    kept.expire()
    assert first.is_closed
    assert kept.fds() == frozenset()


def test_a_task_a_call_left_running_is_cancelled_and_the_worker_unfit(kept: KeptConnections, town: TownConfig) -> None:
    left: list[asyncio.Task[None]] = []

    async def call() -> None:
        nc = await kept.connect(connection_key(town), lambda: connect(town, name="gt-cli"))
        left.append(asyncio.get_running_loop().create_task(asyncio.sleep(3600)))
        await kept.give_back(nc)

    kept.run(call())
    assert not kept.tidy()
    assert left[0].cancelled()
    assert kept.fds() == frozenset()  # every connection closed with it


def test_a_connection_unused_for_a_while_is_lent_only_once_its_server_answers(
    kept: KeptConnections, town: TownConfig, nats_server: EmbeddedServer, clock: list[float]
) -> None:
    """A server cut off without closing its connections (a partition, a host gone: a stopped server here) leaves
    nothing on the socket to see: a connection unused for over ``CHECK_AFTER_S`` is asked for a PONG first."""
    first = _lend(kept, town)
    _give_back(kept, first)
    clock[0] += CHECK_AFTER_S + 1
    assert _lend(kept, town) is first  # its server answered
    _give_back(kept, first)
    clock[0] += CHECK_AFTER_S + 1
    assert nats_server.proc is not None
    server = psutil.Process(nats_server.proc.pid)
    server.suspend()
    made_while_stopped: list[bool] = []

    async def make() -> Connection:
        made_while_stopped.append(server.status() == psutil.STATUS_STOPPED)
        server.resume()
        return await connect(town, name="gt-cli")

    async def lend() -> Connection:
        return await kept.connect(connection_key(town), make)

    try:
        second = kept.run(lend())
    finally:
        server.resume()
    assert made_while_stopped == [True], "the silent connection was dropped for a fresh one"
    assert second is not first
    assert first.is_closed
    _give_back(kept, second)
