"""The service base and its components (docs/architecture.md, "One service"): ``Service`` (``base``) composes the run
skeleton (``lifecycle``, shared with the plugin SDK), the snapshot keeper (``snapshots``), the heartbeat
(``heartbeat``) and the query server (``queries``)."""

from shared.service.base import Service
from shared.service.settings import ServiceSettings

__all__ = ["Service", "ServiceSettings"]
