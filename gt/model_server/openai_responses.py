"""The OpenAI Responses API (Codex CLI; OpenCode with ``@ai-sdk/openai``): reading a request, writing its answer
and its server-sent events, errors. Pure.

Sources: platform.openai.com/docs/api-reference/responses (create, the response object, streaming events) and
what Codex CLI 0.171 sends (../shared/research/runtimes.md): ``POST {base_url}/responses`` with ``instructions``,
``input`` (items: ``message`` {role, content [input_text|output_text]}, ``function_call`` {call_id, name,
arguments}, ``function_call_output`` {call_id, output}, ``reasoning``, ``custom_tool_call`` and its output),
``tools`` (``{"type": "function", "name", "parameters"}`` or a freeform ``{"type": "custom", "name"}``),
``stream: true``. A stream is ``response.created``, per output item ``response.output_item.added``, its deltas
(``response.output_text.delta``, ``response.function_call_arguments.delta``) and ``response.output_item.done``,
then ``response.completed`` with the whole response and its usage (``input_tokens``,
``input_tokens_details.cached_tokens``, ``output_tokens``, ``total_tokens``); each record ``event: <type>`` plus
its data. Errors: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gt.model_server.asked import Asked, Reply, ToolResult
from gt.model_server.sse import chunks, sse_record
from gt.model_server.tokens import all_input
from gt.model_server.turns import count_turns

NAME = "openai-responses"
PATHS = ("/v1/responses", "/responses")
ID_PREFIX = "call_"
TEXT_DELTA_CHARS = 24
ANSWER_ITEMS = frozenset(
    {"function_call", "custom_tool_call", "reasoning", "local_shell_call", "web_search_call", "compaction"}
)
"""Input items that are the model's own output sent back (with ``message`` items of role ``assistant``)."""
TITLE_REQUEST = "Generate a concise, single-line task title"
"""Codex CLI's TUI asks for a thread title in a request of its own, offering only ``apply_patch`` (observed with
0.171): a side request, not a step."""
RESULT_ITEMS = frozenset({"function_call_output", "custom_tool_call_output", "local_shell_call_output"})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
        )
    if isinstance(content, dict):  # a function_call_output's structured output
        return _text(content.get("content", ""))
    return ""


def _items(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    items = body.get("input")
    if isinstance(items, str):
        return [{"type": "message", "role": "user", "content": items}]
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _is_answer(item: Mapping[str, Any]) -> bool:
    kind = item.get("type", "message")
    return kind in ANSWER_ITEMS or (kind == "message" and item.get("role") == "assistant")


def _is_user_message(item: Mapping[str, Any]) -> bool:
    return item.get("type", "message") == "message" and item.get("role") == "user"


def read(path: str, body: Mapping[str, Any]) -> Asked:
    items = _items(body)
    last_answer = max((n for n, item in enumerate(items) if _is_answer(item)), default=-1)
    first_answer = next((n for n, item in enumerate(items) if _is_answer(item)), len(items))
    newest = items[last_answer + 1 :]
    results = tuple(
        ToolResult(call_id=str(item.get("call_id", "")), text=_text(item.get("output", "")))
        for item in newest
        if item.get("type") in RESULT_ITEMS
    )
    user_texts = [_text(item.get("content")) for item in newest if _is_user_message(item)]
    tools: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        if isinstance(tool, dict) and tool.get("name"):
            tools[str(tool["name"])] = tool.get("parameters") or {}
    text_format = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    schema = text_format.get("schema") if isinstance(text_format, dict) else None
    return Asked(
        turn=count_turns((_is_answer(item), _text(item.get("content"))) for item in items),
        results=results,
        prompt="\n".join(user_texts),
        marker_texts=(
            _text(body.get("instructions", "")),
            *(_text(item.get("content")) for item in items[:first_answer] if _is_user_message(item)),
        ),
        context=(
            _text(body.get("instructions", "")),
            *(
                _text(item.get("content"))
                for item in items
                if item.get("type", "message") == "message" and item.get("role") in ("user", "developer", "system")
            ),
        ),
        tools={} if any(TITLE_REQUEST in text for text in user_texts) else tools,
        json_schema=dict(schema) if isinstance(schema, dict) else None,
        model=str(body.get("model") or ""),
        stream=bool(body.get("stream")),
        size={key: body.get(key) for key in ("instructions", "tools", "input")},
    )


def _usage(usage: Mapping[str, int]) -> dict[str, Any]:
    prompt = all_input(dict(usage))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": usage["cache_read_input_tokens"]},
        "output_tokens": usage["output_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + usage["output_tokens"],
    }


def _output(reply: Reply, answer_id: str) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if reply.text:
        output.append(
            {
                "type": "message",
                "id": f"msg_{answer_id[:24]}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for call in reply.calls:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{call.id.removeprefix(ID_PREFIX)}",
                "status": "completed",
                "call_id": call.id,
                "name": call.name,
                "arguments": json.dumps(call.input),
            }
        )
    return output


def answer(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> dict[str, Any]:
    return {
        "id": f"resp_{answer_id[:32]}",
        "object": "response",
        "created_at": 0,
        "status": "completed",
        "model": model,
        "output": _output(reply, answer_id),
        "usage": _usage(usage),
        "error": None,
        "incomplete_details": None,
    }


def stream(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> list[bytes]:
    full = answer(reply, model=model, usage=usage, answer_id=answer_id)
    head = dict(full, status="in_progress", output=[], usage=None)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": head},
        {"type": "response.in_progress", "response": head},
    ]
    for index, item in enumerate(full["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append({"type": "response.output_item.added", "output_index": index, "item": dict(item, content=[])})
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append({"type": "response.content_part.added", **where, "part": part})
            events.extend(
                {"type": "response.output_text.delta", **where, "delta": piece}
                for piece in chunks(text, TEXT_DELTA_CHARS)
            )
            events.append({"type": "response.output_text.done", **where, "text": text})
            events.append({"type": "response.content_part.done", **where, "part": dict(part, text=text)})
        else:
            arguments = item["arguments"]
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": dict(item, arguments="")}
            )
            where = {"item_id": item["id"], "output_index": index}
            events.extend(
                {"type": "response.function_call_arguments.delta", **where, "delta": piece}
                for piece in chunks(arguments, max(1, len(arguments) // 3 + 1))
            )
            events.append({"type": "response.function_call_arguments.done", **where, "arguments": arguments})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": full})
    return [sse_record(dict(event, sequence_number=n), event=event["type"]) for n, event in enumerate(events)]
