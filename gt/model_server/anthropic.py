"""The Anthropic Messages API (Claude Code): reading a request, writing its answer, server-sent events, errors.
Pure.

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

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gt.model_server.asked import Asked, Reply, ToolResult
from gt.model_server.sse import chunks, sse_record
from gt.model_server.turns import turns_before

NAME = "anthropic"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
OVERLOADED = 529
ID_PREFIX = "toolu_01"
TEXT_DELTA_CHARS = 24
"""How much text one ``text_delta`` carries: a short answer still streams in several deltas."""
ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error", 529: "overloaded_error", 404: "not_found_error"}
COMPACTION_PROMPT = "create a detailed summary of the conversation so far"
"""Text of the instruction Claude Code appends to its conversation's newest user message when it compacts the
conversation (``/compact``, or automatically near the context window; observed with 2.1.332): the request carries
the conversation and its tools like a turn, but asks for a text summary in ``<summary>`` tags."""


# --- reading a request -----------------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    """The text of a message's or a tool_result's ``content`` (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
                elif block.get("type") == "tool_result":
                    parts.append(_text_of(block.get("content", "")))
        return "\n".join(parts)
    return ""


def _prompt_text(content: Any) -> str:
    """The text blocks of a message's content (not its tool results)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", "")) for block in content if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def turn_index(body: Mapping[str, Any]) -> int:
    """Which turn of the script this request asks for: the assistant messages its conversation already holds. After
    a compaction the conversation starts with the summary, which says how many turns it replaced; the assistant
    messages Claude Code kept after it count on from there."""
    turns = 0
    for message in _messages(body):
        if message.get("role") == "assistant":
            turns += 1
        elif message.get("role") == "user":
            summarised = turns_before(_prompt_text(message.get("content")))
            if summarised is not None:
                turns = summarised
    return turns


def _newest_user_content(body: Mapping[str, Any]) -> Any:
    """The content of the newest ``user`` message (Claude Code may send ``system`` messages after it)."""
    for message in reversed(_messages(body)):
        if message.get("role") == "user":
            return message.get("content")
        if message.get("role") == "assistant":
            return None
    return None


def tool_results(body: Mapping[str, Any]) -> tuple[ToolResult, ...]:
    """The ``tool_result`` blocks of the newest user message."""
    content = _newest_user_content(body)
    if not isinstance(content, list):
        return ()
    return tuple(
        ToolResult(
            call_id=str(block.get("tool_use_id")),
            text=_text_of(block.get("content", "")),
            is_error=bool(block.get("is_error")),
        )
        for block in content
        if isinstance(block, dict) and block.get("type") == "tool_result"
    )


def last_prompt(body: Mapping[str, Any]) -> str:
    """The text of the newest user message (its text blocks: what a person typed, plus Claude Code's reminders)."""
    return _prompt_text(_newest_user_content(body))


def _json_schema(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Claude Code's session title asks ``output_config.format`` = ``{"type": "json_schema", "schema": ...}``."""
    output = body.get("output_config")
    fmt = output.get("format") if isinstance(output, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return dict(fmt["schema"])
    return None


def read(path: str, body: Mapping[str, Any]) -> Asked:
    messages = _messages(body)
    tools = body.get("tools")
    return Asked(
        turn=turn_index(body),
        results=tool_results(body),
        prompt=last_prompt(body),
        marker_texts=(_text_of(body.get("system", "")), _text_of(messages[0].get("content", "")) if messages else ""),
        context=(
            _text_of(body.get("system", "")),
            *(_prompt_text(m.get("content")) for m in messages if m.get("role") in ("user", "system")),
        ),
        tools={
            str(tool.get("name")): tool.get("input_schema") or {}
            for tool in (tools if isinstance(tools, list) else [])
            if isinstance(tool, dict)
        },
        compaction=COMPACTION_PROMPT in last_prompt(body),
        json_schema=_json_schema(body),
        model=str(body.get("model") or ""),
        stream=bool(body.get("stream")),
        size={key: body.get(key) for key in ("system", "tools", "messages")},
        cache="cache_control" in json.dumps(body.get("system")) + json.dumps(body.get("messages")),
    )


# --- writing the answer ----------------------------------------------------------------------------------------


def content_blocks(reply: Reply) -> list[dict[str, Any]]:
    """A reply as the ``content`` of an assistant message."""
    blocks: list[dict[str, Any]] = []
    if reply.text:
        blocks.append({"type": "text", "text": reply.text})
    blocks.extend({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input} for call in reply.calls)
    return blocks


def stop_reason(blocks: Sequence[Mapping[str, Any]]) -> str:
    return "tool_use" if any(block["type"] == "tool_use" for block in blocks) else "end_turn"


def answer(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> dict[str, Any]:
    """A complete Message: the non-streaming answer."""
    blocks = content_blocks(reply)
    return {
        "id": f"msg_01{answer_id[:22]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason(blocks),
        "stop_sequence": None,
        "usage": usage,
    }


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
            deltas = [{"type": "text_delta", "text": part} for part in chunks(block["text"], TEXT_DELTA_CHARS)]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            raw = json.dumps(block["input"])
            deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                {"type": "input_json_delta", "partial_json": part} for part in chunks(raw, max(1, len(raw) // 3 + 1))
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


def stream(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> list[bytes]:
    full = answer(reply, model=model, usage=usage, answer_id=answer_id)
    return [sse_record(data, event=event) for event, data in stream_events(full)]


def error(status: int, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": text}}
