"""Connecting to NATS with reconnects that never give up, and mapping connect failures to our errors."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import structlog
from nats.aio.client import Client

from shared.config import TownConfig
from shared.errors import NatsUnavailableError

log = structlog.get_logger(__name__)


async def connect(config: TownConfig, *, name: str, connect_attempts: int = 1) -> Client:
    """Connect once (or ``connect_attempts`` times); after that the client reconnects forever."""

    async def on_error(exc: Exception) -> None:
        log.warning("nats_client_error", error=repr(exc))

    async def on_disconnect() -> None:
        log.warning("nats_disconnected")

    async def on_reconnect() -> None:
        log.info("nats_reconnected")

    options: dict[str, Any] = {
        "servers": config.servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": 0.25,
        "connect_timeout": 2,
        "error_cb": on_error,
        "disconnected_cb": on_disconnect,
        "reconnected_cb": on_reconnect,
        "pending_size": 64 * 1024 * 1024,
    }
    if config.nats_creds:
        options["user_credentials"] = config.nats_creds
    elif config.nats_user:
        options["user"] = config.nats_user
        options["password"] = config.nats_password or ""
    last_error: Exception | None = None
    for attempt in range(max(1, connect_attempts)):
        try:
            return await nats.connect(**options)
        except (OSError, nats.errors.Error, asyncio.TimeoutError) as exc:
            last_error = exc
            if attempt + 1 < connect_attempts:
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
    raise NatsUnavailableError(config.nats_url, repr(last_error))
