"""One error tree for the project. Errors carry typed attributes; their message is built from them."""

from __future__ import annotations


class GastownError(Exception):
    """Root of every error this project raises on purpose."""

    retryable: bool = False


class NatsUnavailableError(GastownError):
    """The NATS server could not be reached."""

    retryable = True

    def __init__(self, url: str, detail: str, *, refused: bool = False) -> None:
        self.url = url
        self.detail = detail
        self.refused = refused
        """The server answered and refused the credentials."""
        super().__init__(f"NATS is unreachable at {url}: {detail}")


class PermissionDeniedError(GastownError):
    """The NATS server refused a publish or a subscription: the connection's user lacks the permission.

    Nothing was sent (a refused publish is dropped by the server, so nothing is stored).
    """

    def __init__(self, subject: str, user: str, operation: str = "publish") -> None:
        self.subject = subject
        self.user = user
        self.operation = operation
        """``publish`` or ``subscribe``."""
        super().__init__(f"permission denied: NATS user {user} may not {operation} to {subject}")


class NatsNotAnsweringError(GastownError):
    """NATS took a request and nothing answered it (JetStream not enabled, or the town not up)."""

    retryable = True

    def __init__(self, what: str) -> None:
        self.what = what
        """How the NATS client named it (``NoRespondersError``, ``TimeoutError``, ``ServiceUnavailableError``)."""
        super().__init__(f"NATS did not answer ({what})")


class NoStreamError(GastownError):
    """No stream takes the subject a message was published to (the town is not provisioned yet, or its intake is
    still opening): nothing was stored."""

    def __init__(self) -> None:
        super().__init__("no stream takes the subject; nothing was stored")


class NotProvisionedError(GastownError):
    """JetStream has no such stream, consumer or bucket: the town was not provisioned (``gt init``, ``gt up``)."""

    def __init__(self, description: str) -> None:
        self.description = description
        """The server's words for what is missing."""
        super().__init__(f"not found: {description}")


class EventLogLostError(GastownError):
    """The town's event log is missing, or is not the log this town had (shorter than, or another stream than, a
    snapshot of it): a service refuses to start as an empty town over it (docs/failure-behaviour.md, "The log
    lost")."""

    def __init__(self, stream: str, why: str) -> None:
        self.stream = stream
        self.why = why
        super().__init__(
            f"the event log {stream} is lost: {why}. Refusing to start as an empty town. Restore the stream from a "
            f"backup (nats stream restore, as the admin user), or, to start this town over on purpose, remove what "
            f'is left of it as the admin user (docs/failure-behaviour.md, "The log lost")'
        )


EXIT_LOG_LOST = 3
"""A service's exit code when it refused to start over a lost log (``EventLogLostError``): restarting it would only
refuse again, so `gt up` does not, and escalates instead."""


class StreamConfigMismatchError(GastownError):
    """An existing stream has a configuration this project cannot work with; it is never changed silently."""

    def __init__(self, stream: str, differences: dict[str, tuple[object, object]]) -> None:
        self.stream = stream
        self.differences = differences
        parts = ", ".join(f"{k}: have {have!r}, need {need!r}" for k, (have, need) in sorted(differences.items()))
        super().__init__(
            f"stream {stream} exists with an incompatible configuration ({parts}); "
            "fix or recreate it by hand, gastown-nats will not change it"
        )


class AppendConflictError(GastownError):
    """Optimistic concurrency failed: the aggregate moved since the writer loaded it."""

    retryable = True

    def __init__(self, subject: str, expected: int | None, actual: int | None, detail: str = "") -> None:
        self.subject = subject
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"append to {subject} expected last sequence {expected}, stream has {actual}"
            + (f" ({detail})" if detail else "")
        )


STORAGE_FULL_CODES = frozenset({10002, 10023, 10028, 10047})
"""nats-server's answers to a write that would cross a storage limit (server/errors.json): the account's JetStream
limit (10002, "resource limits exceeded for account"), the server's own store (10023, "insufficient
resources"), a reservation above what is left (10028 memory, 10047 storage)."""

STORAGE_FULL_HINT = (
    "the town's NATS account is out of JetStream storage: nothing more can be stored until space is freed or "
    "the limit raised (GT_NATS_MAX_FILE, the account's max_file; docs/deployment.md, Limits: floods and storage). "
    "Nothing already stored is lost"
)


class AppendFailedError(GastownError):
    """The server refused an append for a reason other than a concurrency conflict."""

    def __init__(self, subject: str, code: int | None, err_code: int | None, description: str) -> None:
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"append to {subject} refused: {description} (code {code}, err_code {err_code})")

    @property
    def storage_full(self) -> bool:
        """Refused for want of storage (the account's limit or the server's store): the write is fine, the town
        is full. Sending it again once space is back stores it."""
        return self.err_code in STORAGE_FULL_CODES


class AppendTimeoutError(GastownError):
    """No acknowledgement within the deadline; the append may or may not be stored."""

    retryable = True

    def __init__(self, subject: str, attempts: int) -> None:
        self.subject = subject
        self.attempts = attempts
        super().__init__(f"append to {subject} not acknowledged after {attempts} attempts")


class StreamGapError(GastownError):
    """A reader saw a jump in stream sequence: messages were dropped between server and callback."""

    retryable = True

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"stream gap: expected sequence {expected}, got {got}")


class CommandError(GastownError):
    """A command cannot be carried out; ``code`` is one of the reason codes (docs/architecture.md, "Commands: from a
    body to events")."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class QueryError(GastownError):
    """A query was answered with an error."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class EventDecodeError(GastownError):
    """A stored message is not a readable event envelope or payload."""

    def __init__(self, detail: str) -> None:
        self.detail = detail
        super().__init__(f"cannot decode event: {detail}")


class UnknownEventTypeError(GastownError):
    """An event type (or a version of it) this code does not know: logged and skipped, never fatal."""

    def __init__(self, type_: str, v: int) -> None:
        self.type = type_
        self.v = v
        super().__init__(f"unknown event type {type_!r} v{v}")


class ActivityLostError(GastownError):
    """This instance is no longer the active one of its service scope (another took the key over, or it could
    not renew it in time): it must stop acting at once. Fatal on purpose: the process exits and its supervisor
    starts it again, as a standby."""

    def __init__(self, identity: str, why: str) -> None:
        self.identity = identity
        self.why = why
        super().__init__(f"{identity}: this instance is no longer the active one ({why}); it stops acting")
