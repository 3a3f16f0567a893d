"""What a request asks for and what the server answers, in no vendor's words: each dialect (``anthropic``,
``openai_responses``, ``openai_chat``, ``gemini``) reads its request body into an ``Asked`` and writes a ``Reply``
in its own wire format, so the script, its checks and its faults are the same for every agent runtime. Pure."""

from __future__ import annotations

from typing import Any

import msgspec


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """A tool's result the client sends back: for ``call_id`` (the id the server gave the call; empty when the
    wire format carries none, then it is matched by position), its text, whether the client marked it an error."""

    call_id: str
    text: str
    is_error: bool = False


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """A request for the next step of a conversation, as every dialect reads it."""

    turn: int
    """Which turn of the script it asks for: the assistant turns its conversation already holds (after a
    compaction, counted on from the summary's ``[model-turns:n]``)."""
    results: tuple[ToolResult, ...] = ()
    """The tool results of its newest user input, in order."""
    prompt: str = ""
    """The text of its newest user message (what a person typed or a nudge, plus the runtime's reminders)."""
    marker_texts: tuple[str, ...] = ()
    """Where a ``[model-script:<name>]`` marker may stand: its system prompt and the user messages before the
    first answer (the beacon is the first prompt; a runtime may send its instruction files before it)."""
    context: tuple[str, ...] = ()
    """Every text of its conversation that is neither the model's nor a tool's: system prompts, instructions, user
    prompts, what the runtime's hooks added."""
    tools: dict[str, Any] = msgspec.field(default_factory=dict)
    """The tools it offers: name -> the JSON schema of its parameters (``{}`` for a freeform tool)."""
    compaction: bool = False
    """It asks for a summary that replaces the conversation (a runtime compacting its context)."""
    json_schema: dict[str, Any] | None = None
    """The JSON schema its answer must follow (a title or routing request asking for JSON output), or None."""
    model: str = ""
    stream: bool = False
    size: Any = None
    """What the request carries (system, tools, conversation), for the token estimate."""
    cache: bool = False
    """It marks cache breakpoints (Anthropic's ``cache_control``)."""

    @property
    def side(self) -> bool:
        """Not a step of the conversation: a title, summary or routing request, a quota check (the conversation
        always offers its tools)."""
        return not self.tools


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call of the answer, in the runtime's own tool: ``input`` its arguments (a string for a freeform
    tool)."""

    id: str
    name: str
    input: dict[str, Any]


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """An answer: text and/or tool calls."""

    text: str = ""
    calls: tuple[Call, ...] = ()


def schema_instance(schema: Any, fill: str) -> Any:
    """A small value a JSON schema allows (OpenAPI's upper-case type names too): objects with their required
    properties (all, when it names none), the first of an ``enum``, numbers at their ``minimum`` (else 1: a
    score "from 1 to 100" may say so only in its description, as Gemini CLI's router does), strings ``fill``."""
    if not isinstance(schema, dict):
        return fill
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    kind = str(kind or "").lower()
    if kind == "object":
        properties = schema.get("properties") or {}
        required = schema.get("required") or list(properties)
        return {name: schema_instance(properties.get(name) or {}, fill) for name in required if isinstance(name, str)}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 1))
        low = low if isinstance(low, int | float) and not isinstance(low, bool) else 1
        return int(low) + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return fill
