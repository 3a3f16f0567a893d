"""The OpenAI API's error shape, the same for its Responses and Chat Completions APIs
(platform.openai.com/docs/guides/error-codes): ``{"error": {"message", "type", "param", "code"}}``. Pure."""

from __future__ import annotations

from typing import Any

OVERLOADED = 503
"""What the API answers when it is overloaded (``server_is_overloaded``; Anthropic's 529 has no OpenAI twin)."""
ERRORS = {
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
    500: ("server_error", "server_error"),
    503: ("server_error", "server_is_overloaded"),
}


def error(status: int, text: str) -> dict[str, Any]:
    kind, code = ERRORS.get(status, ("server_error", "server_error"))
    return {"error": {"message": text, "type": kind, "param": None, "code": code}}
