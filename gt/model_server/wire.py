"""The Anthropic Messages API's wire format: response bodies, server-sent events, usage, errors. Pure.

Sources (search tool, docs corpus):
- docs.anthropic.com/en/api/messages-streaming ("Streaming Messages"): every stream is ``message_start`` (a
  Message with empty ``content``), then per content block ``content_block_start``, one or more
  ``content_block_delta`` (``text_delta`` / ``input_json_delta`` with ``partial_json``), ``content_block_stop``,
  then ``message_delta`` (``stop_reason``, cumulative ``usage``) and ``message_stop``; ``ping`` events may come
  anywhere; each SSE record is ``event: <type>`` plus ``data: <json with the same type>``; an overload mid-stream
  is an ``error`` event (HTTP 529 when not streaming).
- docs.anthropic.com/en/api/messages (the Message object: id, type, role, content, model, stop_reason,
  stop_sequence, usage{input_tokens, output_tokens, cache_creation_input_tokens, cache_read_input_tokens}) and
  /en/api/errors (``{"type": "error", "error": {"type": ..., "message": ...}}``; 401 authentication_error,
  429 rate_limit_error with ``retry-after``, 529 overloaded_error).
- /en/api/messages-count-tokens: ``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gt.model_server.script import Turn, tool_use_id

CHARS_PER_TOKEN = 4
"""The estimate of tokens from characters (the usual rule of thumb for English and code)."""
UNCACHED_TAIL_TOKENS = 3
"""Input tokens after the last cache breakpoint (Claude Code marks its newest message, so only a few remain)."""
TEXT_DELTA_CHARS = 24
"""How much text one ``text_delta`` carries: a short answer still streams in several deltas."""

ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error", 404: "not_found_error"}


def estimate_tokens(value: Any) -> int:
    """A deterministic token count of a JSON value: its compact JSON length over CHARS_PER_TOKEN, at least 1."""
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
    return max(1, len(text) // CHARS_PER_TOKEN)


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The input a request carries: its system prompt, tools and messages."""
    return estimate_tokens({key: body.get(key) for key in ("system", "tools", "messages")})


def wants_cache(body: Mapping[str, Any]) -> bool:
    """Whether a request marks cache breakpoints (``cache_control``) anywhere."""
    return "cache_control" in json.dumps(body.get("system")) + json.dumps(body.get("messages"))


def usage(total_input: int, cached_before: int, output_tokens: int, *, cache: bool) -> dict[str, int]:
    """A usage block as the API reports it. With caching, what an earlier request of the session already sent is
    read from the cache, the rest is written to it, and a few tokens after the last breakpoint are plain input;
    without, everything is plain input."""
    if not cache:
        return {
            "input_tokens": total_input,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        }
    read = min(cached_before, total_input)
    return {
        "input_tokens": UNCACHED_TAIL_TOKENS,
        "cache_creation_input_tokens": total_input - read,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
    }


def message_id(*parts: object) -> str:
    return "msg_01" + hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:22]


def content_blocks(turn: Turn, script: str, index: int) -> list[dict[str, Any]]:
    """A turn as the ``content`` of an assistant message."""
    blocks: list[dict[str, Any]] = []
    if turn.text:
        blocks.append({"type": "text", "text": turn.text})
    for position, tool in enumerate(turn.tool_uses):
        blocks.append(
            {"type": "tool_use", "id": tool_use_id(script, index, position), "name": tool.name, "input": tool.input}
        )
    return blocks


def stop_reason(blocks: Sequence[Mapping[str, Any]]) -> str:
    return "tool_use" if any(block["type"] == "tool_use" for block in blocks) else "end_turn"


def message(msg_id: str, model: str, blocks: list[dict[str, Any]], usage_block: dict[str, int]) -> dict[str, Any]:
    """A complete Message: the non-streaming answer."""
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason(blocks),
        "stop_sequence": None,
        "usage": usage_block,
    }


def _chunks(text: str, size: int) -> list[str]:
    return [text[start : start + size] for start in range(0, len(text), size)] or [""]


def stream_events(full: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events that stream the Message ``full``, in order (a ping after message_start, as the API
    sends one)."""
    head_usage = dict(full["usage"], output_tokens=1)
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": dict(full, content=[], stop_reason=None, stop_sequence=None, usage=head_usage),
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(full["content"]):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": part} for part in _chunks(block["text"], TEXT_DELTA_CHARS)]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": part} for part in _chunks(raw, max(1, len(raw) // 3 + 1))
            ]
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        events.extend(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}) for delta in deltas
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": full["stop_reason"], "stop_sequence": None},
                "usage": full["usage"],
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def encode_event(event: str, data: Mapping[str, Any]) -> bytes:
    """One SSE record."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def error_body(status: int, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": text}}
