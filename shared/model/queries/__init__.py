"""Every question a client may ask a service, as typed queries (``gt.q.<service>.<name>``, the struct's fields its
body), with the typed replies of those whose answers a caller reads field by field; ``shared.bus.query.ask``
sends them (docs/architecture.md, "Sending a command and asking a query").

One module per service (``mayor``, ``witness``, ``refinery``, ``deacon``); ``Status`` and ``Digest`` every
service answers.
"""

from __future__ import annotations

from shared.model.queries.base import Digest, DigestReply, Query, ServiceStatus, Status, reply_type

__all__ = ["Digest", "DigestReply", "Query", "ServiceStatus", "Status", "reply_type"]
