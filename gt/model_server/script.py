"""Scripted conversations: what the fake model answers, turn by turn, and the checks on what it gets back.

Pure: no I/O. A script is data (msgspec Structs, so it also loads from JSON for ``python -m gt.model_server``),
written so that a test reads as the agent's story::

    Script(name="s1", turns=(
        Turn(tool_uses=(bash("git status", expect="On branch"),)),
        Turn(tool_uses=(write("/repo/a.txt", "one\\n", expect="created"),)),
        say("done"),
    ))

Which turn answers a request is derived from the request itself (how many assistant messages its conversation
already holds), never from a counter of requests: a retried request (after a 429, a dropped connection) is
answered with the same turn again, and two requests of the same conversation can never skip a turn.

Tool inputs are those of Claude Code's own tools (Bash, Read, Edit, Write), as declared in the
``sdk-tools.d.ts`` shipped in the ``@anthropic-ai/claude-code`` package: ``BashInput{command, description?,
timeout?}``, ``FileReadInput{file_path, offset?, limit?}``, ``FileEditInput{file_path, old_string, new_string,
replace_all?}``, ``FileWriteInput{file_path, content}``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

FaultKind = Literal["rate_limited", "overloaded", "unauthorized", "stall", "drop"]
"""rate_limited: HTTP 429 with retry-after; overloaded: HTTP 529; unauthorized: HTTP 401; stall: hold the request
unanswered until the server is released (then drop it); drop: close the connection mid-answer (mid-stream when
streaming)."""

SCRIPT_HEADER = "x-gt-model-script"
"""The header that names a session's script (Claude Code sends it when ``ANTHROPIC_CUSTOM_HEADERS`` holds
``x-gt-model-script: <name>``)."""
SCRIPT_MARKER = "[model-script:"
"""A marker in the system prompt or the first user message naming the script: ``[model-script:<name>]``."""


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """A failure answered instead of a turn: ``times`` requests get it, then the turn is answered
    (``times=None``: every request, for ever)."""

    kind: FaultKind
    times: int | None = 1
    retry_after_s: int = 1


class ToolUse(msgspec.Struct, frozen=True, kw_only=True):
    """A ``tool_use`` block the model sends; ``expect`` is text the matching ``tool_result`` must contain."""

    name: str
    input: dict[str, Any]
    expect: str | None = None


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """One assistant message: text and/or tool uses (tool uses make it stop with ``tool_use``).

    ``prompt``: text the newest user prompt must contain when this turn is asked for (a typed prompt, a nudge).
    ``faults``: answered (in order) before the turn is.
    """

    text: str = ""
    tool_uses: tuple[ToolUse, ...] = ()
    prompt: str | None = None
    faults: tuple[Fault, ...] = ()
    context_tokens: int | None = None
    """The size of the conversation this answer's ``usage`` reports (its input, cache reads and writes), instead of
    the request's own: near the model's context window, it makes Claude Code compact the conversation before its
    next request (``exhaust_context``)."""


class Script(msgspec.Struct, frozen=True, kw_only=True):
    """A session's conversation. ``faults`` apply to every request of the session (side requests too)."""

    name: str
    turns: tuple[Turn, ...]
    faults: tuple[Fault, ...] = ()
    model: str | None = None


# --- the story helpers ---------------------------------------------------------------------------------------


def bash(command: str, *, expect: str | None = None, description: str = "") -> ToolUse:
    tool_input: dict[str, Any] = {"command": command}
    if description:
        tool_input["description"] = description
    return ToolUse(name="Bash", input=tool_input, expect=expect)


def read(file_path: str, *, expect: str | None = None) -> ToolUse:
    return ToolUse(name="Read", input={"file_path": file_path}, expect=expect)


def write(file_path: str, content: str, *, expect: str | None = None) -> ToolUse:
    return ToolUse(name="Write", input={"file_path": file_path, "content": content}, expect=expect)


def edit(file_path: str, old_string: str, new_string: str, *, expect: str | None = None) -> ToolUse:
    return ToolUse(
        name="Edit",
        input={"file_path": file_path, "old_string": old_string, "new_string": new_string},
        expect=expect,
    )


def say(text: str, *, prompt: str | None = None) -> Turn:
    return Turn(text=text, prompt=prompt)


def use(
    *tool_uses: ToolUse,
    text: str = "",
    prompt: str | None = None,
    faults: Sequence[Fault] = (),
    context_tokens: int | None = None,
) -> Turn:
    return Turn(
        text=text, tool_uses=tuple(tool_uses), prompt=prompt, faults=tuple(faults), context_tokens=context_tokens
    )


CONTEXT_WINDOW = 1_000_000
"""The context window Claude Code counts with for its default model (``claude-opus-5-5``): 1M tokens. Claude Code
compacts automatically when the conversation (the newest answer's ``usage``: input, cache reads and writes, output)
nears its auto-compact window, by default the model's context window (code.claude.com/docs/en/env-vars,
``CLAUDE_CODE_AUTO_COMPACT_WINDOW``, ``CLAUDE_AUTOCOMPACT_PCT_OVERRIDE``). Observed with 2.1.332 and no such
setting: an answer reporting 960,000 tokens leaves it alone, one reporting 968,000 makes it compact before its next
request (the window less 33,000 tokens kept for the summary and a margin)."""
EXHAUSTED_CONTEXT = CONTEXT_WINDOW - 30_000
"""A conversation past that threshold, below the window itself (where the API would refuse the request)."""


def exhaust_context(turn: Turn, tokens: int = EXHAUSTED_CONTEXT) -> Turn:
    """``turn`` answered with a usage saying the conversation fills the context window (``tokens``): Claude Code
    compacts it (its summary request, answered by the server) before it asks for the next turn."""
    return msgspec.structs.replace(turn, context_tokens=tokens)


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


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


TURNS_MARKER = "[model-turns:"
"""A marker in a compaction summary (``[model-turns:<n>]``): the conversation it replaces held ``n`` turns."""


def _prompt_text(content: Any) -> str:
    """The text blocks of a message's content (not its tool results)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", "")) for block in content if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def _turns_before(text: str) -> int | None:
    start = text.rfind(TURNS_MARKER)
    if start < 0:
        return None
    end = text.find("]", start)
    digits = text[start + len(TURNS_MARKER) : end] if end > start else ""
    return int(digits) if digits.isdigit() else None


def turn_index(body: Mapping[str, Any]) -> int:
    """Which turn of the script this request asks for: the assistant messages its conversation already holds. After
    a compaction the conversation starts with the summary, which says how many turns it replaced
    (``TURNS_MARKER``); the assistant messages Claude Code kept after it count on from there."""
    turns = 0
    for message in _messages(body):
        if message.get("role") == "assistant":
            turns += 1
        elif message.get("role") == "user":
            summarised = _turns_before(_prompt_text(message.get("content")))
            if summarised is not None:
                turns = summarised
    return turns


COMPACTION_PROMPT = "create a detailed summary of the conversation so far"
"""Text of the instruction Claude Code appends to its conversation's newest user message when it compacts the
conversation (``/compact``, or automatically near the context window; observed with 2.1.332): the request carries
the conversation and its tools like a turn, but asks for a text summary in ``<summary>`` tags."""


def is_compaction_request(body: Mapping[str, Any]) -> bool:
    """Claude Code asking for the summary that replaces its conversation (not a step of the conversation)."""
    return COMPACTION_PROMPT in last_prompt(body)


def compaction_summary(script: str, turns: int) -> str:
    """The answer to a compaction request: a summary in the shape Claude Code asks for (an ``<analysis>`` block,
    then a ``<summary>`` block, whose content Claude Code puts at the start of the compacted conversation). It
    names the script (``SCRIPT_MARKER``: the beacon that named it is gone from the conversation) and how many turns
    it replaces (``TURNS_MARKER``), so the requests after it are given the turns after those."""
    return (
        f"<analysis>Scripted conversation {script}, compacted after {turns} turns.</analysis>\n"
        f"<summary>\n{SCRIPT_MARKER}{script}] {TURNS_MARKER}{turns}]\n"
        f"1. Primary Request and Intent: the scripted work of {script}.\n"
        f"8. Current Work: {turns} turns of script {script} were answered.\n"
        "9. Optional Next Step: go on with the current step.\n</summary>"
    )


def is_side_request(body: Mapping[str, Any]) -> bool:
    """A request that is not a step of the session's conversation: Claude Code's title/summary generation and
    quota checks come without tools (the main conversation always offers its tools)."""
    tools = body.get("tools")
    return not (isinstance(tools, list) and tools)


def _newest_user_content(body: Mapping[str, Any]) -> Any:
    """The content of the newest ``user`` message (Claude Code may send ``system`` messages after it)."""
    for message in reversed(_messages(body)):
        if message.get("role") == "user":
            return message.get("content")
        if message.get("role") == "assistant":
            return None
    return None


def tool_results(body: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """The ``tool_result`` blocks of the newest user message: tool_use_id -> (its text, is_error)."""
    content = _newest_user_content(body)
    if not isinstance(content, list):
        return {}
    results = {}
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            results[str(block.get("tool_use_id"))] = (_text_of(block.get("content", "")), bool(block.get("is_error")))
    return results


def last_prompt(body: Mapping[str, Any]) -> str:
    """The text of the newest user message (its text blocks: what a person typed, plus Claude Code's reminders)."""
    return _prompt_text(_newest_user_content(body))


def script_name(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The script a request names: the ``x-gt-model-script`` header, else a ``[model-script:<name>]`` marker in
    the system prompt or the first user message. ``None`` when it names none (the caller may fall back to the
    API key)."""
    named = headers.get(SCRIPT_HEADER)
    if named:
        return named.strip()
    texts = [_text_of(body.get("system", ""))]
    messages = _messages(body)
    if messages:
        texts.append(_text_of(messages[0].get("content", "")))
    for text in texts:
        start = text.find(SCRIPT_MARKER)
        if start >= 0:
            end = text.find("]", start)
            if end > start:
                return text[start + len(SCRIPT_MARKER) : end].strip()
    return None


SIDE_ANSWER = "Scripted session"
"""What a side request (a title, a summary, a quota check) is answered with."""


def side_answer(body: Mapping[str, Any]) -> str:
    """The answer to a side request: text, or when it asks for JSON output (Claude Code's session title asks
    ``output_config.format`` = ``{"type": "json_schema", "schema": {... "title": string}}``) the smallest JSON
    value its schema allows, strings filled with SIDE_ANSWER."""
    output = body.get("output_config")
    fmt = output.get("format") if isinstance(output, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return json.dumps(_instance(fmt["schema"]))
    return SIDE_ANSWER


def _instance(schema: Mapping[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {
            name: _instance(properties.get(name) or {})
            for name in schema.get("required") or list(properties)
            if isinstance(name, str)
        }
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return SIDE_ANSWER


def tool_use_id(script: str, turn: int, position: int) -> str:
    """A deterministic id in the shape the API uses (``toolu_`` and 24 characters)."""
    digest = hashlib.sha256(f"{script}/{turn}/{position}".encode()).hexdigest()
    return f"toolu_01{digest[:22]}"


def check_results(script: Script, index: int, body: Mapping[str, Any]) -> list[str]:
    """What is wrong with the tool results a request for turn ``index`` carries back for turn ``index - 1``."""
    if index == 0 or index > len(script.turns):
        return []
    asked = script.turns[index - 1]
    if not asked.tool_uses:
        return []
    results = tool_results(body)
    failures = []
    for position, tool in enumerate(asked.tool_uses):
        got = results.get(tool_use_id(script.name, index - 1, position))
        if got is None:
            failures.append(f"turn {index - 1}: no tool_result came back for {tool.name} {tool.input}")
        elif tool.expect is not None and tool.expect not in got[0]:
            failures.append(
                f"turn {index - 1}: the {tool.name} result does not contain {tool.expect!r}: {got[0][:500]!r}"
            )
    return failures


def check_prompt(turn: Turn, body: Mapping[str, Any], index: int) -> list[str]:
    if turn.prompt is None or turn.prompt in last_prompt(body):
        return []
    return [f"turn {index}: the newest prompt does not contain {turn.prompt!r}: {last_prompt(body)[:500]!r}"]


def fault_for(faults: Sequence[Fault], attempt: int) -> Fault | None:
    """The fault answering the ``attempt``-th request (0-based) given ``faults`` in order, else ``None``."""
    passed = 0
    for fault in faults:
        if fault.times is None:
            return fault
        if attempt < passed + fault.times:
            return fault
        passed += fault.times
    return None
