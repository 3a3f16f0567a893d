"""One error tree for the project. Errors carry typed attributes; their message is built from them.

What the code around an error does with it is data on the error's class (docs/failure-behaviour.md, "Errors"):
``retryable`` (a loop that retries reads it, through ``retryable()``), ``infrastructure`` (the command intake
reads it, through ``infrastructure_failure()``), ``exit_code`` and ``hint`` (`gt` reads them, in one ``except``).
"""

from __future__ import annotations

EXIT_REJECTED = 1
"""`gt`'s exit code when the town (or `gt` itself, before sending) refused what was asked."""
EXIT_USAGE = 2
"""`gt`'s exit code for a command line or configuration that cannot be used as written."""
EXIT_UNREACHABLE = 3
"""`gt`'s exit code when NATS, JetStream or the town did not answer (or is not provisioned)."""
EXIT_DENIED = 4
"""`gt`'s exit code when the NATS server refused the connection's user a publish or a subscription."""


class GastownError(Exception):
    """Root of every error this project raises on purpose."""

    retryable: bool = False
    """Trying the same operation again, a moment later, may succeed: a transient failure of NATS, of the
    connection or of a race, not of what was asked. The loops that retry read it (``retryable()``)."""
    infrastructure: bool = False
    """A failure of the server, the connection, the deployment or this instance's standing, not of the work in
    hand: the command intake leaves a command that met it for redelivery and never sets it aside as poison
    (``infrastructure_failure()``)."""
    exit_code: int | None = None
    """What `gt` exits with when this error ends a call (``EXIT_*``); None: not one `gt` expects, it propagates."""
    hint: str = ""
    """What a person can do about it: `gt` says it after the error."""

    def explained(self) -> str:
        """The error and what to do about it, in one line (what `gt` prints after ``gt: ``)."""
        return f"{self}; {self.hint}" if self.hint else str(self)


def retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is worth trying again after a pause: one of the project's errors that says so, or a timeout
    (an ``asyncio.timeout`` or ``wait_for`` running out)."""
    return exc.retryable if isinstance(exc, GastownError) else isinstance(exc, TimeoutError)


def infrastructure_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of the infrastructure (``GastownError.infrastructure``) or a timeout, rather
    than something the work in hand caused."""
    return exc.infrastructure if isinstance(exc, GastownError) else isinstance(exc, TimeoutError)


class NatsUnavailableError(GastownError):
    """The NATS server could not be reached."""

    retryable = True
    infrastructure = True
    exit_code = EXIT_UNREACHABLE

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

    infrastructure = True
    exit_code = EXIT_DENIED
    hint = (
        "the NATS server refused it and nothing was sent. Use the credentials of a user allowed to (NATS_USER, "
        "NATS_PASSWORD or NATS_CREDS; see docs/deployment.md)"
    )

    def __init__(self, subject: str, user: str, operation: str = "publish") -> None:
        self.subject = subject
        self.user = user
        self.operation = operation
        """``publish`` or ``subscribe``."""
        super().__init__(f"permission denied: NATS user {user} may not {operation} to {subject}")

    def explained(self) -> str:
        return f"{self}: {self.hint}"


class BusError(GastownError):
    """NATS failed: the connection, the server or JetStream (``shared.bus.errors`` turns the NATS client's errors
    into this one and its subclasses; nothing outside the bus sees the client's own)."""

    infrastructure = True

    def __init__(self, detail: str, *, kind: str = "") -> None:
        self.detail = detail
        self.kind = kind
        """How the NATS client named the failure (its error class's name)."""
        super().__init__(detail)


class ConnectionLostError(BusError):
    """The connection is closed, reconnecting, stale or its buffer full: what was under way may or may not have
    reached the server, and a retry after the reconnect is the way forward."""

    retryable = True


class NatsNotAnsweringError(BusError):
    """NATS took a request and nothing answered it (JetStream not enabled, or the town not up)."""

    retryable = True
    exit_code = EXIT_UNREACHABLE
    hint = "is JetStream enabled and the town up?"

    def __init__(self, what: str) -> None:
        self.what = what
        """How the NATS client named it (``NoRespondersError``, ``TimeoutError``, ``ServiceUnavailableError``)."""
        super().__init__(f"NATS did not answer ({what})", kind=what)


class BusTimeoutError(NatsNotAnsweringError, TimeoutError):
    """No answer within the deadline: what was asked may or may not have been done. A ``TimeoutError`` too, as
    the NATS client's is, so that code waiting on the bus with a deadline of its own catches both alike."""


class JetStreamUnavailableError(NatsNotAnsweringError):
    """JetStream answered that it cannot serve now (starting, electing a leader): nothing was done."""


class NoStreamError(BusError):
    """No stream takes the subject a message was published to (the town is not provisioned yet, or its intake is
    still opening): nothing was stored."""

    retryable = True
    exit_code = EXIT_UNREACHABLE
    hint = "run `gt init` or `gt up`, then retry"

    def __init__(self) -> None:
        super().__init__("no stream takes the subject; nothing was stored", kind="NoStreamResponseError")

    def explained(self) -> str:
        # Said in the words of the commands `gt` sends, which are what a person meets it with.
        return f"no stream takes commands yet (nothing was stored); {self.hint}"


class JetStreamApiError(BusError):
    """JetStream answered a request with an error (server/errors.json names the codes)."""

    def __init__(
        self, description: str, *, code: int | None, err_code: int | None, kind: str = "APIError", message: str = ""
    ) -> None:
        self.description = description
        """The server's words."""
        self.code = code
        """The HTTP-like status (400, 404, 503...)."""
        self.err_code = err_code
        """nats-server's error code (``10071`` and so on)."""
        super().__init__(message or f"JetStream refused: {description} (code {code}, err_code {err_code})", kind=kind)


class NotProvisionedError(JetStreamApiError):
    """JetStream has no such stream, consumer or bucket: the town was not provisioned (``gt init``, ``gt up``)."""

    exit_code = EXIT_UNREACHABLE
    hint = "run `gt init` (or `gt up`) first"

    def __init__(self, description: str, *, code: int | None = 404, err_code: int | None = None) -> None:
        super().__init__(
            description, code=code, err_code=err_code, kind="NotFoundError", message=f"not found: {description}"
        )


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

    exit_code = EXIT_REJECTED

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

    infrastructure = True
    exit_code = EXIT_REJECTED

    def __init__(self, subject: str, code: int | None, err_code: int | None, description: str) -> None:
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description
        self.hint = STORAGE_FULL_HINT if self.storage_full else ""
        super().__init__(f"append to {subject} refused: {description} (code {code}, err_code {err_code})")

    @property
    def storage_full(self) -> bool:
        """Refused for want of storage (the account's limit or the server's store): the write is fine, the town
        is full. Sending it again once space is back stores it."""
        return self.err_code in STORAGE_FULL_CODES

    def explained(self) -> str:
        return f"{self}: {self.hint}" if self.hint else str(self)


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
    infrastructure = True

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"stream gap: expected sequence {expected}, got {got}")


class CommandError(GastownError):
    """A command cannot be carried out; ``code`` is one of the reason codes (docs/architecture.md, "Commands: from a
    body to events")."""

    exit_code = EXIT_REJECTED

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")

    def explained(self) -> str:
        # Raised before sending (a field over its limit, a command too large): nothing was stored.
        return f"refused ({self.code}): {self.message}; nothing was sent"


class QueryError(GastownError):
    """A query was answered with an error."""

    UNANSWERED_CODES = frozenset({"unavailable", "timeout"})
    """The codes that say the service did not answer (rather than answered no)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        self.exit_code = EXIT_UNREACHABLE if code in self.UNANSWERED_CODES else EXIT_REJECTED
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

    infrastructure = True

    def __init__(self, identity: str, why: str) -> None:
        self.identity = identity
        self.why = why
        super().__init__(f"{identity}: this instance is no longer the active one ({why}); it stops acting")
