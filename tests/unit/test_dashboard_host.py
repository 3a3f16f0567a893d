"""The dashboard's Host check (DNS rebinding): which names a request may reach it by."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gt.dashboard.server import Dashboard
from shared.core.config import TownConfig


def dashboard(host: str = "127.0.0.1", allowed: tuple[str, ...] = ()) -> Dashboard:
    return Dashboard(cast(Any, None), TownConfig(), host=host, port=8765, allowed_hosts=allowed, token="t")


@pytest.mark.parametrize(
    "header", ["127.0.0.1:8765", "127.0.0.1", "localhost:8765", "LocalHost", "[::1]:8765", "10.1.2.3:8765"]
)
def test_ip_addresses_and_localhost_on_its_port_are_answered(header: str) -> None:
    assert dashboard().host_allowed(header)


@pytest.mark.parametrize(
    "header",
    [None, "", "evil.example", "evil.example:8765", "localhost.evil.example", "127.0.0.1:8766", "localhost:x", "[::1"],
)
def test_other_names_ports_and_garbage_are_refused(header: str | None) -> None:
    assert not dashboard().host_allowed(header)


def test_the_bound_name_and_names_allowed_on_the_command_line_are_answered() -> None:
    served = dashboard(host="gt.lan", allowed=("Dash.Example",))
    assert served.host_allowed("gt.lan:8765")
    assert not served.host_allowed("gt.lan:9000")
    assert served.host_allowed("dash.example")
    assert served.host_allowed("dash.example:443"), "behind a reverse proxy the port is the proxy's"
    assert not served.host_allowed("evil.example")
