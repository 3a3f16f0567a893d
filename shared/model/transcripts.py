"""What an agent said and did last, read from the transcript its runtime keeps: a few one-line entries
(``assistant: ...``, ``tool Bash: gt prime``, ``result: ...``), recorded by the witness when it cleans an ended
session (``session.cleaned``'s ``transcript_tail``), so ``gt seance`` shows a dead session's last words from the log
long after its files are gone. Pure: the witness reads the file's end (``TRANSCRIPT_READ_BYTES``).

Claude Code writes one JSONL line per message (``{"type": "assistant"|"user", "message": {"content": ...}}``; a
content is a string or blocks: ``text``, ``tool_use``, ``tool_result``). Codex CLI's rollout has a
``{"type": "response_item", "payload": ...}`` line per item: a ``message`` (its role, ``input_text`` or
``output_text`` parts), a ``function_call`` (its ``arguments`` JSON, the shell command as ``cmd``) or a
``function_call_output``. Anything else (metadata, usage, a line cut short by a crash) is skipped, never raised on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from shared.core.decoding import UNDECODABLE

TRANSCRIPT_READ_BYTES = 256 * 1024
"""How much of a transcript's end the witness reads: far more than the last entries take (a tool's output is
cut to ``ENTRY_CHARS``), never the whole of a file an agent can grow without end."""
TAIL_ENTRIES = 12
ENTRY_CHARS = 300
TAIL_CHARS = 3000
"""The most a recorded tail holds: it goes into an event, and every view of the session carries it."""

EntriesOf = Callable[[dict[str, Any]], list[str]]
"""One decoded transcript line -> its entries (none for a line that records no message)."""

_DECODE = msgspec.json.Decoder().decode
_CONTROL = {c: " " for c in range(32) if c not in (9,)} | {127: " "}


def entry(who: str, text: str) -> str:
    """One line: ``who: text``, whitespace runs and control characters as one space, cut to ``ENTRY_CHARS``."""
    flat = " ".join(text.translate(_CONTROL).split())
    line = f"{who}: {flat}"
    return line if len(line) <= ENTRY_CHARS else line[: ENTRY_CHARS - 1] + "…"


def _text_of(content: object) -> str:
    """A content's text: a string, or the ``text`` of its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Only text that is text: ``str()`` of an agent's nested list recurses as deep as it was written.
        return " ".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _tool_input(value: object) -> str:
    """A tool call's input as a reader wants it: the shell command when there is one, else compact JSON."""
    if isinstance(value, dict):
        for key in ("command", "cmd"):
            if isinstance(value.get(key), str):
                return str(value[key])
        return msgspec.json.encode(value)[:ENTRY_CHARS].decode("utf-8", "replace")
    return str(value)


def claude_entries(record: dict[str, Any]) -> list[str]:
    """Claude Code's transcript line -> its entries."""
    role = record.get("type")
    message = record.get("message")
    if role not in ("user", "assistant") or not isinstance(message, dict):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [entry(role, content)] if content.strip() else []
    out = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and str(block.get("text", "")).strip():
            out.append(entry(role, str(block["text"])))
        elif kind == "tool_use":
            out.append(entry(f"tool {block.get('name', '?')}", _tool_input(block.get("input"))))
        elif kind == "tool_result":
            out.append(entry("result", _text_of(block.get("content"))))
    return out


def codex_entries(record: dict[str, Any]) -> list[str]:
    """Codex CLI's rollout line -> its entries (its developer instructions and environment context left out)."""
    payload = record.get("payload")
    if record.get("type") != "response_item" or not isinstance(payload, dict):
        return []
    kind = payload.get("type")
    if kind == "message":
        role, text = payload.get("role"), _text_of(payload.get("content"))
        if role not in ("user", "assistant") or not text.strip() or text.lstrip().startswith("<environment_context>"):
            return []
        return [entry(str(role), text)]
    if kind == "function_call":
        try:
            arguments: object = _DECODE(str(payload.get("arguments", "")))
        except UNDECODABLE:
            arguments = payload.get("arguments", "")
        return [entry(f"tool {payload.get('name', '?')}", _tool_input(arguments))]
    if kind == "function_call_output":
        return [entry("result", _text_of(payload.get("output")))]
    return []


def tail(lines: Iterable[bytes], entries_of: EntriesOf) -> str:
    """The last entries (at most ``TAIL_ENTRIES``, ``TAIL_CHARS``) of a transcript's ``lines``, one per line;
    "" when it recorded none."""
    found: list[str] = []
    for raw in lines:
        try:
            record = _DECODE(raw)
        except UNDECODABLE:  # a line cut short (the read began mid-line, a crash mid-write), or an agent's nesting
            continue
        if isinstance(record, dict):
            try:
                found += entries_of(record)
            except (RecursionError, TypeError, ValueError):  # an agent's line built to break a reader: skipped
                continue
    kept: list[str] = []
    size = 0
    for line in reversed(found[-TAIL_ENTRIES:]):
        size += len(line) + 1
        if size > TAIL_CHARS:
            break
        kept.append(line)
    return "\n".join(reversed(kept))


# ---- a turn's answer (the town agents: docs/mayor-agent.md) ------------------------------------------------------

PROMPT = "prompt"
TURN_END = "end"
TurnMark = tuple[str, str]
"""``(PROMPT, text)``: a prompt typed in (the turn's start); ``(TURN_END, text)``: the turn ended, these its last
words."""
MarksOf = Callable[[dict[str, Any]], TurnMark | None]


def claude_mark(record: dict[str, Any]) -> TurnMark | None:
    """A prompt is a user message whose content is text (a tool's result is a list of ``tool_result`` blocks); a
    turn ends with an assistant message that stopped with ``end_turn``."""
    message = record.get("message")
    if not isinstance(message, dict) or record.get("isSidechain"):
        return None  # a subagent's conversation (Task): never the turn's own prompt or last words
    content = message.get("content")
    if record.get("type") == "user" and isinstance(content, str):
        return (PROMPT, content)
    if record.get("type") == "assistant" and message.get("stop_reason") == "end_turn":
        return (TURN_END, _text_of(content))
    return None


def codex_mark(record: dict[str, Any]) -> TurnMark | None:
    """A prompt is a user ``message`` item; a turn ends with the ``task_complete`` event, which carries the last
    agent message."""
    payload = record.get("payload")
    if not isinstance(payload, dict):
        return None
    if record.get("type") == "response_item" and payload.get("type") == "message" and payload.get("role") == "user":
        return (PROMPT, _text_of(payload.get("content")))
    if record.get("type") == "event_msg" and payload.get("type") == "task_complete":
        return (TURN_END, str(payload.get("last_agent_message") or ""))
    return None


def answer_to(lines: Iterable[bytes], prompt: str, marks_of: MarksOf) -> str | None:
    """The last words of the turn that ``prompt`` (typed into the agent) began, once that turn ended; None while it
    runs, or when the transcript's ``lines`` hold no such prompt. Its newest typing counts (a request typed again
    into a restarted agent)."""
    probe = _squeezed(prompt)[-200:]
    answer: str | None = None
    asked = False
    for raw in lines:
        try:
            record = _DECODE(raw)
        except UNDECODABLE:
            continue
        try:
            mark = marks_of(record) if isinstance(record, dict) else None
        except (RecursionError, TypeError, ValueError):  # an agent's line built to break a reader: skipped
            continue
        if mark is None:
            continue
        kind, text = mark
        if kind == PROMPT:
            if probe and probe in _squeezed(text):
                asked, answer = True, None
        elif asked and answer is None:
            answer = text.strip()
    return answer


def heard(lines: Iterable[bytes], prompt: str, marks_of: MarksOf) -> tuple[bool, bool]:
    """(the agent's runtime took ``prompt`` in: a prompt holding it is in ``lines``; a turn ended in ``lines``)."""
    probe = _squeezed(prompt)[-200:]
    took = ended = False
    for raw in lines:
        try:
            record = _DECODE(raw)
            mark = marks_of(record) if isinstance(record, dict) else None
        except (msgspec.DecodeError, RecursionError, TypeError, ValueError):
            continue
        if mark is not None:
            took = took or (mark[0] == PROMPT and bool(probe) and probe in _squeezed(mark[1]))
            ended = ended or mark[0] == TURN_END
    return took, ended


def _squeezed(text: str) -> str:
    return "".join(text.split())
