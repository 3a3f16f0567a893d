"""The OpenAI Chat Completions API (OpenCode with ``@ai-sdk/openai-compatible``): reading a request, writing its
answer and its stream, errors. Pure.

Sources: platform.openai.com/docs/api-reference/chat (create, the chat completion object, the chunk object) and
what OpenCode 1.18 sends (../shared/research/runtimes.md): ``POST {baseURL}/chat/completions`` with ``messages``
(``system``, ``user``, ``assistant`` with ``tool_calls`` [{id, type: function, function {name, arguments}}],
``tool`` {tool_call_id, content}), ``tools`` ([{type: function, function {name, parameters}}]), ``stream: true``
and ``stream_options.include_usage``. A stream is ``chat.completion.chunk`` records (``data:`` lines, no event
names): the role, content deltas, ``tool_calls`` deltas by index (id and name first, then the arguments in
pieces), a chunk with ``finish_reason`` (``stop`` or ``tool_calls``), a chunk with ``usage`` and no choices when
asked, then ``data: [DONE]``. Usage: ``prompt_tokens`` (cached included, ``prompt_tokens_details.cached_tokens``),
``completion_tokens``, ``total_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gt.model_server.asked import Asked, Reply, ToolResult
from gt.model_server.sse import chunks, sse_record
from gt.model_server.tokens import all_input
from gt.model_server.turns import count_turns

NAME = "openai-chat"
PATHS = ("/v1/chat/completions", "/chat/completions")
ID_PREFIX = "call_"
TEXT_DELTA_CHARS = 24


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


def read(path: str, body: Mapping[str, Any]) -> Asked:
    messages = _messages(body)
    last_answer = max((n for n, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    first_answer = next((n for n, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    newest = messages[last_answer + 1 :]
    tools: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name"):
            tools[str(function["name"])] = function.get("parameters") or {}
    response_format = body.get("response_format")
    schema = (response_format.get("json_schema") or {}).get("schema") if isinstance(response_format, dict) else None
    return Asked(
        turn=count_turns((m.get("role") == "assistant", _text(m.get("content"))) for m in messages),
        results=tuple(
            ToolResult(call_id=str(m.get("tool_call_id", "")), text=_text(m.get("content")))
            for m in newest
            if m.get("role") == "tool"
        ),
        prompt="\n".join(_text(m.get("content")) for m in newest if m.get("role") == "user"),
        marker_texts=tuple(
            _text(m.get("content")) for m in messages[:first_answer] if m.get("role") in ("system", "user")
        ),
        context=tuple(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer", "user")),
        tools=tools,
        json_schema=dict(schema) if isinstance(schema, dict) else None,
        model=str(body.get("model") or ""),
        stream=bool(body.get("stream")),
        size={key: body.get(key) for key in ("tools", "messages")},
    )


def _usage(usage: Mapping[str, int]) -> dict[str, Any]:
    prompt = all_input(dict(usage))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage["output_tokens"],
        "total_tokens": prompt + usage["output_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage["cache_read_input_tokens"]},
    }


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.input)}}
        for call in reply.calls
    ]


def _finish(reply: Reply) -> str:
    return "tool_calls" if reply.calls else "stop"


def answer(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.calls:
        message["tool_calls"] = _tool_calls(reply)
    return {
        "id": f"chatcmpl-{answer_id[:29]}",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
        "usage": _usage(usage),
    }


def stream(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> list[bytes]:
    head = {"id": f"chatcmpl-{answer_id[:29]}", "object": "chat.completion.chunk", "created": 0, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return dict(head, choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

    records = [chunk({"role": "assistant", "content": ""})]
    if reply.text:
        records.extend(chunk({"content": piece}) for piece in chunks(reply.text, TEXT_DELTA_CHARS))
    for index, call in enumerate(_tool_calls(reply)):
        function = call["function"]
        records.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": function["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        arguments = function["arguments"]
        records.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in chunks(arguments, max(1, len(arguments) // 3 + 1))
        )
    records.append(chunk({}, _finish(reply)))
    records.append(dict(head, choices=[], usage=_usage(usage)))
    return [sse_record(record) for record in records] + [sse_record("[DONE]")]
