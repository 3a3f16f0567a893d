"""nats-py imported without its WebSocket transport, which the town never needs: nats-py's transport module imports
aiohttp, when installed, for ``ws://`` servers at its import, and aiohttp's import builds two TLS contexts from the
system's CA bundle. That was 0.4-0.5 s of CPU in every process that imports nats (each `gt` call outside a helper,
each session's helper, each service), about half of the `gt` client's whole import.

Each of our packages (``shared``, ``services``, ``gt``) installs the import hook here first thing; it costs nothing
until nats is imported (`gt`'s thin client, which forwards a call to its helper, never imports nats). aiohttp is
hidden only while nats's transport module runs, so the HTTP servers that use aiohttp (the dashboard, the metrics
plugin, the model server) import it as usual. A town whose servers are ``ws://`` or ``wss://`` gets the transport
back at its connect (``websockets_for``)."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys

TYPE_CHECKING = False  # typing's own import is 10-25 ms of `gt`'s thin client, which needs none of this
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.abc import Loader, MetaPathFinder
    from types import ModuleType
else:  # importlib.abc imports importlib.resources: 50 ms more
    Loader = MetaPathFinder = object

TRANSPORT = "nats.aio.transport"


class _AiohttpHidden(Loader):
    """Runs the transport module's own loader with aiohttp unimportable (``None`` in ``sys.modules``)."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        sys.modules["aiohttp"] = None  # type: ignore[assignment]  # its import raises ImportError meanwhile
        try:
            self.loader.exec_module(module)
        finally:
            if sys.modules.get("aiohttp", 0) is None:
                del sys.modules["aiohttp"]


class TransportWithoutAiohttp(MetaPathFinder):
    """Finds nats-py's transport module as the path finder does, with a loader that hides aiohttp from it (unless a
    process imported aiohttp already: then hiding it saves nothing)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRANSPORT or "aiohttp" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _AiohttpHidden(spec.loader)
        return spec


def install() -> None:
    """Put the finder first on the import path, once per process."""
    if not any(isinstance(finder, TransportWithoutAiohttp) for finder in sys.meta_path):
        sys.meta_path.insert(0, TransportWithoutAiohttp())


def websockets_for(servers: Sequence[str]) -> None:
    """Give nats-py its WebSocket transport (aiohttp) when one of ``servers`` is a ``ws://`` or ``wss://`` URL."""
    transport = sys.modules.get(TRANSPORT)
    if transport is None or getattr(transport, "aiohttp", None) is not None:
        return
    if any(server.lower().startswith(("ws://", "wss://")) for server in servers):
        transport.aiohttp = importlib.import_module("aiohttp")  # type: ignore[attr-defined]


install()
