"""The four services (mayor, witness, refinery, deacon), the gate runner and the plugins. Imports ``shared`` first
(nats-py without its WebSocket transport: ``shared.bus.nats_import``)."""

from shared.bus import nats_import as _nats_import  # noqa: F401  (first: shared.bus.nats_import)
