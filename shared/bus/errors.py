"""The failures of NATS, as code outside the bus catches them.

Every port of the bus raises ``BusError`` (or the builtin ``TimeoutError``) when the connection, the server or
JetStream fails; what a port expects (a key or a message that is not there, a compare-and-set that lost) it
answers as a value instead (None, False). The few failures a person is told about in words of their own are
turned into the project's errors by ``translated``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import nats.errors
import nats.js.errors

from shared.bus.append import RETRYABLE_ERRORS, TRANSIENT_ERRORS
from shared.errors import NatsNotAnsweringError, NoStreamError, NotProvisionedError

__all__ = ["RETRYABLE_ERRORS", "TRANSIENT_ERRORS", "BusError", "translated"]

BusError = nats.errors.Error
"""Any failure of the connection, the server or JetStream (an error answer of the JetStream API too)."""


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Raise, instead of the NATS client's errors that say the town is not there (nothing answers, no stream takes
    the subject, no such stream or bucket), the project's own: ``NatsNotAnsweringError``, ``NoStreamError``,
    ``NotProvisionedError``."""
    try:
        yield
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
        raise NatsNotAnsweringError(type(exc).__name__) from exc
    except nats.js.errors.NoStreamResponseError as exc:
        raise NoStreamError() from exc
    except nats.js.errors.NotFoundError as exc:
        raise NotProvisionedError(f"{exc.description}") from exc
