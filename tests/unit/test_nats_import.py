"""nats-py is imported without aiohttp (its WebSocket transport) by every process of ours, and a ``ws://`` town gets
the transport back at its connect (shared/bus/nats_import.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
import {module}
import nats.aio.transport as transport
print("aiohttp" in sys.modules, transport.aiohttp is None)
"""


@pytest.mark.parametrize("module", ["gt.cli.main", "gt.agent", "services.witness.__main__", "shared.bus.connection"])
def test_our_processes_import_nats_without_aiohttp(module: str) -> None:
    probe = PROBE.format(module=module)
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "True"], run.stdout + run.stderr


def test_an_http_server_of_ours_still_imports_aiohttp_after_nats() -> None:
    probe = "import shared.bus.connection, aiohttp.web; print(aiohttp.web.__name__)"
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "aiohttp.web", run.stderr


def test_a_websocket_town_gets_the_transport_back_and_a_nats_one_does_not() -> None:
    probe = """
import sys
from shared.bus.nats_import import websockets_for
import nats.aio.transport as transport
websockets_for(["nats://127.0.0.1:4222", "tls://a:4222"])
print(transport.aiohttp is None)
websockets_for(["nats://127.0.0.1:4222", "WS://b:8080"])
print(transport.aiohttp is sys.modules["aiohttp"])
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["True", "True"], run.stdout + run.stderr
