"""The bus's error boundary (shared/bus/errors.py): each error of the NATS client becomes the project's, with the
typed attributes and the retryability the loops read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import nats.errors
import nats.js.errors
import pytest

from shared.bus.errors import map_errors, retryable, translate
from shared.core.errors import (
    BusError,
    BusTimeoutError,
    ConnectionLostError,
    GastownError,
    JetStreamApiError,
    JetStreamUnavailableError,
    NatsNotAnsweringError,
    NoStreamError,
    NotProvisionedError,
)


def api_error(cls: type[nats.js.errors.APIError], code: int, err_code: int, description: str) -> BaseException:
    return cls(code=code, err_code=err_code, description=description)


@pytest.mark.parametrize(
    ("raised", "becomes", "is_retryable"),
    [
        (nats.errors.TimeoutError(), BusTimeoutError, True),
        (nats.errors.FlushTimeoutError(), BusTimeoutError, True),
        (nats.errors.NoRespondersError(), NatsNotAnsweringError, True),
        (nats.errors.ConnectionClosedError(), ConnectionLostError, True),
        (nats.errors.ConnectionReconnectingError(), ConnectionLostError, True),
        (nats.errors.OutboundBufferLimitError(), ConnectionLostError, True),
        (nats.errors.UnexpectedEOF(), ConnectionLostError, True),
        (nats.js.errors.NoStreamResponseError(), NoStreamError, True),
        (api_error(nats.js.errors.ServiceUnavailableError, 503, 0, "unavailable"), JetStreamUnavailableError, True),
        (api_error(nats.js.errors.NotFoundError, 404, 10059, "stream not found"), NotProvisionedError, False),
        (api_error(nats.js.errors.BadRequestError, 400, 10058, "name in use"), JetStreamApiError, False),
        (nats.errors.ConnectionDrainingError(), BusError, False),
        (nats.errors.MaxPayloadError(), BusError, False),
    ],
)
def test_each_error_of_the_client_becomes_the_projects(
    raised: BaseException, becomes: type[BusError], is_retryable: bool
) -> None:
    translated = translate(raised)
    assert type(translated) is becomes
    assert isinstance(translated, GastownError)
    assert not isinstance(translated, nats.errors.Error)
    assert translated.infrastructure, "a failure of NATS is never the command's"
    assert translated.retryable is is_retryable
    assert retryable(raised) is is_retryable, "the bus's own loops read the flag through the translation"


def test_a_timeout_stays_a_timeout_and_the_api_error_keeps_its_codes() -> None:
    timeout = translate(nats.errors.TimeoutError())
    assert isinstance(timeout, TimeoutError), "code waiting with a deadline of its own catches both alike"
    refused = translate(api_error(nats.js.errors.BadRequestError, 400, 10058, "stream name already in use"))
    assert isinstance(refused, JetStreamApiError)
    assert (refused.code, refused.err_code, refused.description) == (400, 10058, "stream name already in use")
    assert refused.kind == "BadRequestError"
    missing = translate(api_error(nats.js.errors.BucketNotFoundError, 404, 10059, "bucket not found"))
    assert isinstance(missing, NotProvisionedError)
    assert str(missing) == "not found: bucket not found"


def test_what_is_not_the_clients_passes_as_it_is() -> None:
    error = ValueError("bad")
    assert translate(error) is error
    assert retryable(TimeoutError()), "an asyncio deadline is worth another try"
    assert not retryable(ValueError())


async def test_a_wrapped_port_raises_the_projects_error_caused_by_the_clients() -> None:
    @map_errors
    async def port() -> None:
        raise nats.errors.NoRespondersError

    with pytest.raises(NatsNotAnsweringError) as caught:
        await port()
    assert isinstance(caught.value.__cause__, nats.errors.NoRespondersError)


async def test_a_wrapped_async_generator_yields_then_raises_the_projects_error() -> None:
    closed: list[bool] = []

    @map_errors
    async def items() -> AsyncGenerator[int]:
        try:
            yield 1
            raise nats.js.errors.NoStreamResponseError
        finally:
            closed.append(True)

    got: list[int] = []

    async def read_all() -> None:
        async for item in items():
            got.append(item)

    with pytest.raises(NoStreamError):
        await read_all()
    assert got == [1]
    assert closed == [True]


async def test_a_wrapped_port_leaves_cancellation_and_its_own_errors_alone() -> None:
    @map_errors
    async def waits() -> None:
        await asyncio.sleep(10)

    task = asyncio.ensure_future(waits())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    @map_errors
    async def refuses() -> None:
        raise NoStreamError

    with pytest.raises(NoStreamError):
        await refuses()


def test_only_coroutines_and_async_generators_are_ports() -> None:
    def plain() -> None: ...

    with pytest.raises(TypeError):
        map_errors(plain)  # type: ignore[arg-type]
