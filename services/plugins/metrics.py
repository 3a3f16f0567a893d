"""The metrics exporter: Prometheus text over HTTP from a fold of the whole log (``gt-plugin-metrics``).

Run: ``python -m services.plugins.metrics --port 9477``, then scrape ``http://127.0.0.1:9477/metrics``.
Its projection lives in memory, so it replays the log from the start each time it starts; lag and
liveness are asked of the services at each scrape.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import msgspec
import structlog

from services.plugins.http import PageServer
from services.plugins.metrics_state import CONTENT_TYPE, LiveFacts, MetricsState, ServiceFacts, apply, render
from shared.bus import log_read, streams
from shared.bus.connection import Connection
from shared.bus.errors import BusError
from shared.bus.query import ask_json
from shared.core.config import TownConfig
from shared.core.errors import EventDecodeError, QueryError
from shared.model.events import decode_envelope
from shared.model.queries import Status
from shared.plugins.position import parse_position
from shared.plugins.process import plugin_parser, positive_float, run_plugin
from shared.plugins.sdk import Delivery, Plugin
from shared.plugins.settings import CONSUMER_PREFIX, PLUGIN_BUCKET, PluginSettings, position_key

log = structlog.get_logger(__name__)

SERVICES = ("mayor", "witness", "refinery", "deacon")
DEFAULT_PORT = 9477


class MetricsOptions(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    """0: any free port (the bound one is logged as ``metrics_listening``)."""
    services: tuple[str, ...] = SERVICES
    status_timeout_s: float = 0.5
    """How long a scrape waits for each service's status answer."""


class MetricsPlugin(Plugin):
    """Folds every event into ``MetricsState`` and serves it with the scrape's facts."""

    def __init__(self, config: TownConfig, options: MetricsOptions, *, name: str = "metrics") -> None:
        # The fold is pure and cannot fail on an event; were it to, a gap in a gauge beats a dead exporter.
        settings = PluginSettings(name=name, replay_from_start=True, batch=512, on_exhausted="skip")
        super().__init__(config, settings)
        if not 0 <= options.port <= 65535:
            raise ValueError(f"port must be from 0 to 65535, got {options.port}")
        self.options = options
        self.state = MetricsState()
        self.server: PageServer | None = None
        self.listening = asyncio.Event()

    async def handle_message(self, delivery: Delivery) -> None:
        try:
            env = decode_envelope(delivery.data)
        except EventDecodeError:
            apply(self.state, delivery.seq, None, None)
            return
        apply(self.state, delivery.seq, env, self.decode_payload(env, delivery.seq))

    def start_background(self, tg: asyncio.TaskGroup) -> None:
        tg.create_task(self._serve_http(), name="http")

    async def _serve_http(self) -> None:
        self.server = PageServer(
            self.scrape,
            host=self.options.host,
            port=self.options.port,
            path="/metrics",
            content_type=CONTENT_TYPE,
        )
        port = await self.server.start()
        log.info("metrics_listening", host=self.options.host, port=port, path="/metrics")
        self.listening.set()
        await self.server.serve_forever()

    async def scrape(self) -> str:
        assert self.nc is not None
        live = await collect_live(
            self.nc,
            self.config.evt_stream,
            self.options.services,
            timeout=self.options.status_timeout_s,
            skip_plugin=self.name,
        )
        return render(self.state, live, plugin=self.name)


async def collect_live(
    nc: Connection,
    stream: str,
    services: Sequence[str],
    *,
    timeout: float,
    skip_plugin: str,
    bucket: str = PLUGIN_BUCKET,
) -> LiveFacts:
    """Ask the town what a scrape reports besides the projection; whatever does not answer is left out
    (a service that does not answer is reported down). Other plugins' positions are their recorded positions
    (``<name>.position.last`` in the marks bucket, read at once by one direct get), or the acknowledged floor of a
    durable consumer ``plugin-<name>`` on the log (a plugin that reads through one: another language's)."""

    async def stream_last_seq() -> int | None:
        try:
            async with asyncio.timeout(timeout * 2):
                return await streams.last_seq(nc, stream)
        except (BusError, TimeoutError) as exc:
            log.warning("metrics_stream_info_failed", error=repr(exc))
            return None

    async def status(service: str) -> ServiceFacts | None:
        try:
            answer = await ask_json(nc, Status(service=service), timeout=timeout)
            return msgspec.convert(answer, ServiceFacts)
        except (QueryError, BusError, TimeoutError, msgspec.ValidationError):
            return None

    async def consumers() -> dict[str, int]:
        try:
            async with asyncio.timeout(timeout * 2):
                floors = await streams.consumer_floors(nc, stream)
        except (BusError, TimeoutError) as exc:
            log.warning("metrics_consumers_info_failed", error=repr(exc))
            return {}
        ours = {name: floor for name, floor in floors.items() if name.startswith(CONSUMER_PREFIX)}
        return {name.removeprefix(CONSUMER_PREFIX): floor for name, floor in ours.items()}

    async def positions() -> dict[str, int]:
        prefix, suffix = f"$KV.{bucket}.", position_key("*").removeprefix("*")
        try:
            found = await log_read.last_per_subject(nc, f"KV_{bucket}", [prefix + position_key("*")], timeout=timeout)
        except (BusError, TimeoutError) as exc:
            log.warning("metrics_positions_read_failed", error=repr(exc))
            return {}
        out = {}
        for subject, stored in found.items():
            seq = parse_position(stored.data)
            if seq is not None:
                out[subject.removeprefix(prefix).removesuffix(suffix)] = seq
        return out

    last, answers, floors, recorded = await asyncio.gather(
        stream_last_seq(), asyncio.gather(*(status(s) for s in services)), consumers(), positions()
    )
    plugin_seqs = {name: seq for name, seq in {**floors, **recorded}.items() if name != skip_plugin}
    return LiveFacts(stream_last_seq=last, services=dict(zip(services, answers, strict=True)), plugins=plugin_seqs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = plugin_parser("metrics", "Serve Prometheus metrics of the town on GET /metrics.")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    parser.add_argument(
        "--services", default=",".join(SERVICES), help="comma-separated services whose status and lag are reported"
    )
    parser.add_argument(
        "--status-timeout", type=positive_float, default=0.5, help="seconds a scrape waits for each service"
    )
    parser.add_argument("--name", default="metrics", help="plugin name: its marks <name>.* (default metrics)")
    args = parser.parse_args(argv)

    def build(config: TownConfig) -> Plugin:
        services = tuple(s.strip() for s in args.services.split(",") if s.strip())
        options = MetricsOptions(
            host=args.host, port=args.port, services=services, status_timeout_s=args.status_timeout
        )
        return MetricsPlugin(config, options, name=args.name)

    return run_plugin(args.name, args, build)


if __name__ == "__main__":
    sys.exit(main())
