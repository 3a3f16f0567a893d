"""Ask a service a question: request/reply on ``gt.q.<service>.<what>``, answered from its projection.

The reply is ``{"ok": true, "result": ...}`` or ``{"ok": false, "code": ..., "message": ...}``.
"""

from __future__ import annotations

from typing import Any

import msgspec
import nats.errors
from nats.aio.client import Client

from shared import subjects
from shared.errors import QueryError

_JSON = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder()


async def query(
    nc: Client, service: str, what: str, body: dict[str, Any] | None = None, *, timeout: float = 15.0
) -> Any:
    """Ask ``gt.q.<service>.<what>``.

    Raises:
        QueryError: the service answered with an error, is not running (``unavailable``) or timed out.
    """
    try:
        reply = await nc.request(subjects.query_subject(service, what), _JSON.encode(body or {}), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise QueryError("unavailable", f"the {service} is not running (nobody answers {service} queries)") from None
    except (TimeoutError, nats.errors.TimeoutError):
        raise QueryError("timeout", f"the {service} did not answer within {timeout}s") from None
    answer = _DECODE.decode(reply.data)
    if not answer.get("ok"):
        raise QueryError(answer.get("code", "error"), answer.get("message", "query failed"))
    return answer["result"]
