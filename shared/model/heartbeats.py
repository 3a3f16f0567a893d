"""Heartbeats, plain data: what each service puts in the ``GT_SERVICES`` KV bucket every second
(``ServiceHeartbeat``), and what an agent's ``gt heartbeat`` puts under its session in ``GT_HEARTBEATS``
(``AgentHeartbeat``). One encoder and one decoder each.

A heartbeat is a cache of liveness, never truth: the deacon turns what it sees into ``service.up``,
``service.down`` and ``service.stopped`` events, which are.
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from shared.core import subjects
from shared.core.decoding import UNDECODABLE


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
    """``<service>.<instance>`` (a gate runner's scope as ``runner.<name>``: ``subjects.scope_tokens``)."""
    return f"{subjects.scope_tokens(service)}.{instance}"


def encode(beat: ServiceHeartbeat) -> bytes:
    return msgspec.json.encode(beat)


def decode(data: bytes) -> ServiceHeartbeat | None:
    """None for a value that is not a heartbeat (logged by the caller, never fatal)."""
    try:
        return _DECODER.decode(data)
    except UNDECODABLE:
        return None


class AgentHeartbeat(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's ``gt heartbeat``: it is alive and working (a long step is not a stall). The value of its session's
    key in the agent heartbeat bucket."""

    ts: datetime
    """When the agent said so (its clock). A naive time (none is written, but the key is the agent's) is UTC."""
    session: str = ""
    note: str = ""
    """What the agent says it is doing (at most ``AGENT_NOTE_CHARS``)."""


AGENT_NOTE_CHARS = 500
_AGENT_DECODER = msgspec.json.Decoder(AgentHeartbeat)


def agent_heartbeat(session: str, note: str, now: datetime) -> AgentHeartbeat:
    return AgentHeartbeat(ts=now, session=session, note=note[:AGENT_NOTE_CHARS])


def encode_agent(beat: AgentHeartbeat) -> bytes:
    """``{"ts": iso, "session": ..., "note": ...}``: what every version wrote (its time in RFC 3339, which
    ``datetime.fromisoformat`` and this module's decoder both read)."""
    return msgspec.json.encode(beat)


def decode_agent(data: bytes | None) -> AgentHeartbeat | None:
    """The heartbeat in an agent's key, its ``ts`` timezone-aware; None for a value that is not one (the key is
    the agent's to write: never fatal)."""
    if not data:
        return None
    try:
        beat = _AGENT_DECODER.decode(data)
    except UNDECODABLE:
        return None
    if beat.ts.tzinfo is None:
        return msgspec.structs.replace(beat, ts=beat.ts.replace(tzinfo=UTC))
    return beat
