"""Service heartbeats: what each service puts in the ``GT_SERVICES`` KV bucket every second. Plain data.

A heartbeat is a cache of liveness, never truth: the deacon turns what it sees into ``service.up``,
``service.down`` and ``service.stopped`` events, which are.
"""

from __future__ import annotations

from datetime import datetime

import msgspec

from shared.decoding import UNDECODABLE


class ServiceHeartbeat(msgspec.Struct, frozen=True, kw_only=True):
    service: str
    """The service scope the process serves (``mayor``, ``witness``, ``witness-east``, ...)."""
    instance: str
    """One process of the service: ``<pid>-<random>`` (a restarted service is a new instance)."""
    pid: int
    host: str
    started_at: datetime
    ts: datetime
    """When this heartbeat was put (the service's clock)."""
    last_seq: int = 0
    caught_up: bool = False
    stopping: bool = False
    """The last heartbeat of a clean stop."""
    standby: bool = False
    """The process follows the log but another instance of its scope is the active one (or it lost that role):
    its beats say nothing about whether the service is up."""


_DECODER = msgspec.json.Decoder(ServiceHeartbeat)


def key_of(service: str, instance: str) -> str:
    return f"{service}.{instance}"


def encode(beat: ServiceHeartbeat) -> bytes:
    return msgspec.json.encode(beat)


def decode(data: bytes) -> ServiceHeartbeat | None:
    """None for a value that is not a heartbeat (logged by the caller, never fatal)."""
    try:
        return _DECODER.decode(data)
    except UNDECODABLE:
        return None
