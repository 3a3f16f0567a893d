"""The gate runners' service heartbeats (``runner-<name>`` in ``GT_SERVICES``), followed by a watch of the bucket:
what the board (``queries.board``) says of each runner's life. Adapter: reads KV."""

from __future__ import annotations

from shared.bus.connection import Connection
from shared.bus.kv import BucketMirror
from shared.model import heartbeats
from shared.model.gate_jobs import RUNNER_SCOPE_PREFIX
from shared.model.heartbeats import ServiceHeartbeat


class RunnerBeats:
    """The newest heartbeat of every runner process the bucket holds (its key is ``runner.<name>.<instance>``:
    ``heartbeats.key_of``; the heartbeat's service, ``runner-<name>``, is what is matched)."""

    def __init__(self, bucket: str) -> None:
        self.mirror = BucketMirror(bucket)

    async def run(self, nc: Connection) -> None:
        """Follow the bucket until cancelled."""
        await self.mirror.run(nc)

    def beats(self) -> list[ServiceHeartbeat]:
        """The runners' heartbeats as the bucket holds them now (a value that is no heartbeat is left out)."""
        found = []
        for entry in list(self.mirror.entries.values()):
            beat = heartbeats.decode(entry.value)
            if beat is not None and beat.service.startswith(RUNNER_SCOPE_PREFIX):
                found.append(beat)
        return found
