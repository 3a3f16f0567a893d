"""The Gemini API (Gemini CLI): reading a ``generateContent`` / ``streamGenerateContent`` request, writing its
answer and its stream, errors. Pure.

Sources: ai.google.dev/api/generate-content. GenerateContentRequest: ``contents`` [{role: user|model, parts:
[{text} | {functionCall {name, args, id?}} | {functionResponse {name, id?, response}}]}], ``systemInstruction``,
``tools`` [{functionDeclarations [{name, parameters | parametersJsonSchema}]}], ``generationConfig``
{responseMimeType, responseSchema | responseJsonSchema}. GenerateContentResponse: ``candidates`` [{content,
finishReason, index}], ``usageMetadata`` {promptTokenCount, candidatesTokenCount, totalTokenCount,
cachedContentTokenCount}, ``modelVersion``. Errors (ai.google.dev/gemini-api/docs/troubleshooting):
``{"error": {"code", "message", "status"}}``, 401 UNAUTHENTICATED, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE.
What Gemini CLI 0.61 sends (../shared/research/runtimes.md): a routing request without tools asking JSON, then
``POST /v1beta/models/<model>:streamGenerateContent?alt=sse`` (``data:`` records, each a GenerateContentResponse
carrying a piece; the last with ``finishReason`` and the usage).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from gt.model_server.asked import Asked, Reply, ToolResult
from gt.model_server.sse import chunks, sse_record
from gt.model_server.tokens import all_input
from gt.model_server.turns import count_turns

NAME = "gemini"
PATH = re.compile(r"^/v1(?:beta|alpha)?/models/(?P<model>[^:/]+):(?P<method>generateContent|streamGenerateContent)$")
COUNT_PATH = re.compile(r"^/v1(?:beta|alpha)?/models/(?P<model>[^:/]+):countTokens$")
OVERLOADED = 503
ID_PREFIX = "gt-call-"
TEXT_DELTA_CHARS = 24
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}


def _parts(content: Any) -> list[dict[str, Any]]:
    parts = content.get("parts") if isinstance(content, dict) else None
    return [part for part in parts if isinstance(part, dict)] if isinstance(parts, list) else []


def _text(content: Any) -> str:
    return "\n".join(str(part["text"]) for part in _parts(content) if isinstance(part.get("text"), str))


def _contents(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    contents = body.get("contents")
    return [c for c in contents if isinstance(c, dict)] if isinstance(contents, list) else []


def _response_text(response: Any) -> str:
    """A functionResponse's ``response``: Gemini CLI sends ``{"output": ...}`` (or ``{"error": ...}``)."""
    if isinstance(response, dict):
        for key in ("output", "error", "content"):
            if isinstance(response.get(key), str):
                return str(response[key])
    return json.dumps(response)


def read(path: str, body: Mapping[str, Any]) -> Asked:
    found = PATH.match(path)
    contents = _contents(body)
    last_answer = max((n for n, c in enumerate(contents) if c.get("role") == "model"), default=-1)
    first_answer = next((n for n, c in enumerate(contents) if c.get("role") == "model"), len(contents))
    newest = contents[last_answer + 1 :]
    results = []
    for content in newest:
        for part in _parts(content):
            response = part.get("functionResponse")
            if isinstance(response, dict):
                payload = response.get("response")
                results.append(
                    ToolResult(
                        call_id=str(response.get("id") or ""),
                        text=_response_text(payload),
                        is_error=isinstance(payload, dict) and "error" in payload,
                    )
                )
    tools: dict[str, Any] = {}
    for tool in body.get("tools") or []:
        for declaration in (tool.get("functionDeclarations") or []) if isinstance(tool, dict) else []:
            if isinstance(declaration, dict) and declaration.get("name"):
                tools[str(declaration["name"])] = (
                    declaration.get("parametersJsonSchema") or declaration.get("parameters") or {}
                )
    config = body.get("generationConfig")
    config = config if isinstance(config, dict) else {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    return Asked(
        turn=count_turns((c.get("role") == "model", _text(c)) for c in contents),
        results=tuple(results),
        prompt="\n".join(_text(c) for c in newest if c.get("role") == "user"),
        marker_texts=(
            _text(body.get("systemInstruction")),
            *(_text(c) for c in contents[:first_answer] if c.get("role") == "user"),
        ),
        context=(_text(body.get("systemInstruction")), *(_text(c) for c in contents if c.get("role") == "user")),
        tools=tools,
        json_schema=dict(schema) if isinstance(schema, dict) else None,
        model=found.group("model") if found else "",
        stream=bool(found and found.group("method") == "streamGenerateContent"),
        size={key: body.get(key) for key in ("systemInstruction", "tools", "contents")},
    )


def _usage(usage: Mapping[str, int]) -> dict[str, int]:
    prompt = all_input(dict(usage))
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": usage["output_tokens"],
        "totalTokenCount": prompt + usage["output_tokens"],
        "cachedContentTokenCount": usage["cache_read_input_tokens"],
    }


def _response(parts: list[dict[str, Any]], model: str, answer_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0, **extra}],
        "modelVersion": model,
        "responseId": answer_id[:24],
    }


def _parts_of(reply: Reply) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"text": reply.text}] if reply.text else []
    parts.extend({"functionCall": {"id": call.id, "name": call.name, "args": call.input}} for call in reply.calls)
    return parts


def answer(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> dict[str, Any]:
    full = _response(_parts_of(reply), model, answer_id, finishReason="STOP")
    full["usageMetadata"] = _usage(usage)
    return full


def stream(reply: Reply, *, model: str, usage: dict[str, int], answer_id: str) -> list[bytes]:
    """Text in pieces, then the calls whole (the API never splits a functionCall), the last record with the
    finish reason and the usage."""
    records = [_response([{"text": piece}], model, answer_id) for piece in chunks(reply.text, TEXT_DELTA_CHARS)]
    if not reply.text:
        records = []
    calls = _parts_of(Reply(calls=reply.calls))
    last = _response(calls, model, answer_id, finishReason="STOP")
    if not calls and records:
        last = records.pop()
        last["candidates"][0]["finishReason"] = "STOP"
    last["usageMetadata"] = _usage(usage)
    records.append(last)
    return [sse_record(record) for record in records]


def error(status: int, text: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": text, "status": STATUS.get(status, "INTERNAL")}}
