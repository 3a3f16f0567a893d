"""Scripted conversations: what the fake model answers, turn by turn, and the checks on what it gets back.

Pure: no I/O. A script is data (msgspec Structs, so it also loads from JSON for ``python -m gt.model_server``),
written so that a test reads as the agent's story::

    Script(name="s1", turns=(
        Turn(tool_uses=(bash("git status", expect="On branch"),)),
        Turn(tool_uses=(write("/repo/a.txt", "one\\n", expect="created"),)),
        say("done"),
    ))

Which turn answers a request is derived from the request itself (``turns``), never from a counter of requests.

Tool inputs are those of Claude Code's own tools (Bash, Read, Edit, Write), as declared in the
``sdk-tools.d.ts`` shipped in the ``@anthropic-ai/claude-code`` package: ``BashInput{command, description?,
timeout?}``, ``FileReadInput{file_path, offset?, limit?}``, ``FileEditInput{file_path, old_string, new_string,
replace_all?}``, ``FileWriteInput{file_path, content}``. Another runtime gets them in its own tools (``tools``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from gt.model_server.asked import Asked, Call, Reply, schema_instance
from gt.model_server.tools import concrete
from gt.model_server.turns import TURNS_MARKER, call_id

ANTHROPIC_ID_PREFIX = "toolu_01"

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


# --- answering ---------------------------------------------------------------------------------------------


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


def script_name(headers: Mapping[str, str], asked: Asked) -> str | None:
    """The script a request names: the ``x-gt-model-script`` header, else a ``[model-script:<name>]`` marker in
    its system prompt or a user message before the first answer. ``None`` when it names none (the caller may fall
    back to the API key)."""
    named = headers.get(SCRIPT_HEADER)
    if named:
        return named.strip()
    for text in asked.marker_texts:
        start = text.find(SCRIPT_MARKER)
        if start >= 0:
            end = text.find("]", start)
            if end > start:
                return text[start + len(SCRIPT_MARKER) : end].strip()
    return None


SIDE_ANSWER = "Scripted session"
"""What a side request (a title, a summary, a routing or quota check) is answered with."""


def side_answer(asked: Asked) -> str:
    """The answer to a side request: text, or when it asks for JSON output (Claude Code's session title, Gemini
    CLI's model router) the smallest JSON value its schema allows, strings filled with SIDE_ANSWER."""
    if asked.json_schema is not None:
        return json.dumps(schema_instance(asked.json_schema, SIDE_ANSWER))
    return SIDE_ANSWER


def tool_use_id(script: str, turn: int, position: int) -> str:
    """A tool call's id in the shape Anthropic's API uses (``toolu_01`` and 22 characters)."""
    return call_id(ANTHROPIC_ID_PREFIX, script, turn, position)


def reply(script: Script, index: int, offered: Mapping[str, Any], id_prefix: str) -> Reply:
    """Turn ``index`` of ``script`` as an answer, its tool uses in the tools the request ``offered``."""
    turn = script.turns[index]
    calls = []
    for position, tool in enumerate(turn.tool_uses):
        name, arguments = concrete(tool.name, tool.input, offered)
        calls.append(Call(id=call_id(id_prefix, script.name, index, position), name=name, input=arguments))
    return Reply(text=turn.text, calls=tuple(calls))


def check_results(script: Script, index: int, asked: Asked, id_prefix: str) -> list[str]:
    """What is wrong with the tool results a request for turn ``index`` carries back for turn ``index - 1``: each
    found by the id its call was given, or by its position when the wire format carries no ids."""
    if index == 0 or index > len(script.turns):
        return []
    previous = script.turns[index - 1]
    if not previous.tool_uses:
        return []
    by_id = {result.call_id: result for result in asked.results if result.call_id}
    failures = []
    for position, tool in enumerate(previous.tool_uses):
        got = by_id.get(call_id(id_prefix, script.name, index - 1, position))
        if got is None and position < len(asked.results) and not asked.results[position].call_id:
            got = asked.results[position]
        if got is None:
            failures.append(f"turn {index - 1}: no tool result came back for {tool.name} {tool.input}")
        elif tool.expect is not None and tool.expect not in got.text:
            failures.append(
                f"turn {index - 1}: the {tool.name} result does not contain {tool.expect!r}: {got.text[:500]!r}"
            )
    return failures


def check_prompt(turn: Turn, asked: Asked, index: int) -> list[str]:
    if turn.prompt is None or turn.prompt in asked.prompt:
        return []
    return [f"turn {index}: the newest prompt does not contain {turn.prompt!r}: {asked.prompt[:500]!r}"]


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
