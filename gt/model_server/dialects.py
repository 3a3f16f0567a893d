"""The model APIs the server speaks, each a ``Dialect``, and which one a request's route is in. Pure.

| dialect | routes | runtimes |
|---|---|---|
| anthropic | ``POST /v1/messages`` (+ ``/count_tokens``) | Claude Code |
| openai-responses | ``POST /v1/responses`` | Codex CLI |
| openai-chat | ``POST /v1/chat/completions`` | OpenCode |
| gemini | ``POST /v1beta/models/<model>:generateContent``, ``:streamGenerateContent`` (+ count) | Gemini CLI |
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gt.model_server import anthropic, gemini, openai_chat, openai_errors, openai_responses
from gt.model_server.asked import Asked, Reply
from gt.model_server.tokens import estimate_tokens

Writer = Callable[..., Any]


@dataclass(frozen=True, kw_only=True)
class Dialect:
    """One model API: how its requests read (``read(path, body)``), how its answers, streams and errors are
    written, the status it answers an overload with, and the shape of its tool call ids."""

    name: str
    read: Callable[[str, Mapping[str, Any]], Asked]
    answer: Callable[..., dict[str, Any]]
    """``answer(reply, model=, usage=, answer_id=)``: the whole answer, as JSON."""
    stream: Callable[..., list[bytes]]
    """The same as server-sent event records, in order."""
    error: Callable[[int, str], dict[str, Any]]
    overloaded: int
    id_prefix: str

    def dropped_head(self, model: str) -> list[bytes]:
        """The start of a stream a dropped connection cuts short."""
        records = self.stream(
            Reply(text="..."),
            model=model,
            usage=dict.fromkeys(
                ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"), 0
            ),
            answer_id="dropped",
        )
        return records[: max(1, len(records) // 2)]


ANTHROPIC = Dialect(
    name=anthropic.NAME,
    read=anthropic.read,
    answer=anthropic.answer,
    stream=anthropic.stream,
    error=anthropic.error,
    overloaded=anthropic.OVERLOADED,
    id_prefix=anthropic.ID_PREFIX,
)
OPENAI_RESPONSES = Dialect(
    name=openai_responses.NAME,
    read=openai_responses.read,
    answer=openai_responses.answer,
    stream=openai_responses.stream,
    error=openai_errors.error,
    overloaded=openai_errors.OVERLOADED,
    id_prefix=openai_responses.ID_PREFIX,
)
OPENAI_CHAT = Dialect(
    name=openai_chat.NAME,
    read=openai_chat.read,
    answer=openai_chat.answer,
    stream=openai_chat.stream,
    error=openai_errors.error,
    overloaded=openai_errors.OVERLOADED,
    id_prefix=openai_chat.ID_PREFIX,
)
GEMINI = Dialect(
    name=gemini.NAME,
    read=gemini.read,
    answer=gemini.answer,
    stream=gemini.stream,
    error=gemini.error,
    overloaded=gemini.OVERLOADED,
    id_prefix=gemini.ID_PREFIX,
)


def dialect_for(path: str) -> Dialect | None:
    """The dialect whose conversation route ``path`` (no query) is, or None."""
    if path == anthropic.MESSAGES:
        return ANTHROPIC
    if path in openai_responses.PATHS:
        return OPENAI_RESPONSES
    if path in openai_chat.PATHS:
        return OPENAI_CHAT
    if gemini.PATH.match(path):
        return GEMINI
    return None


def counting(path: str) -> Callable[[Mapping[str, Any]], dict[str, Any]] | None:
    """The token-counting route ``path`` is (Anthropic's ``count_tokens``, Gemini's ``countTokens``): a function
    from the request body to the answer, or None."""
    if path == anthropic.COUNT_TOKENS:
        return lambda body: {"input_tokens": estimate_tokens(anthropic.read(path, body).size)}
    if gemini.COUNT_PATH.match(path):
        return lambda body: {"totalTokens": estimate_tokens(gemini.read(path, body).size)}
    return None


def unrouted_error(path: str) -> Callable[[int, str], dict[str, Any]]:
    """The error shape an unknown route is answered in: Gemini's for a path in its style, else Anthropic's."""
    return gemini.error if path.startswith("/v1beta") or ":" in path else anthropic.error
