"""The scripted model server's dialects (OpenAI Responses for Codex CLI, Chat Completions for OpenCode, Gemini for
Gemini CLI): a script's conversation played through each, as its runtime sends it back (its own tools, ids and
result shapes); streams that reassemble into the whole answer; usage, errors and side requests in each API's
words. Pure."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest

from gt.model_server import Script, bash, edit, read, say, script, use, write
from gt.model_server.asked import Reply
from gt.model_server.dialects import GEMINI, OPENAI_CHAT, OPENAI_RESPONSES, Dialect, dialect_for
from gt.model_server.tokens import usage
from gt.model_server.tools import concrete

STORY = Script(
    name="story",
    turns=(
        use(bash("git status", expect="On branch main")),
        use(write("/r/a.txt", "one\n"), edit("/r/a.txt", "one", "two"), read("/r/a.txt", expect="two")),
        say("done"),
    ),
)
BEACON = "[gastown] You are polecat p1. Your hook: bead gt-1: Feature [model-script:story]."
USAGE = usage(1200, 0, 40, cache=False)


def _schema(*names: str) -> dict[str, Any]:
    return {"type": "object", "properties": {name: {"type": "string"} for name in names}, "required": list(names)}


CODEX_TOOLS = {
    "exec_command": _schema("cmd", "workdir", "yield_time_ms", "login"),
    "write_stdin": _schema("session_id", "chars"),
}
GEMINI_TOOLS = {
    "run_shell_command": _schema("command", "description", "dir_path"),
    "write_file": _schema("file_path", "content"),
    "replace": _schema("file_path", "instruction", "old_string", "new_string"),
    "read_file": _schema("file_path"),
}
OPENCODE_TOOLS = {
    "bash": _schema("command", "timeout", "workdir", "description"),
    "write": _schema("filePath", "content"),
    "edit": _schema("filePath", "oldString", "newString"),
    "read": _schema("filePath"),
}


class Client:
    """A runtime's side of a conversation: its first request, and how it sends an answer back with its tools'
    results (as the CLI does, ../shared/research/runtimes.md)."""

    def __init__(self, dialect: Dialect, tools: dict[str, Any]) -> None:
        self.dialect = dialect
        self.tools = tools
        self.conversation: list[dict[str, Any]] = []

    def path(self) -> str:
        return {
            OPENAI_RESPONSES.name: "/v1/responses",
            OPENAI_CHAT.name: "/v1/chat/completions",
            GEMINI.name: "/v1beta/models/gemini-3.8-flash:streamGenerateContent",
        }[self.dialect.name]

    def request(self) -> dict[str, Any]:
        if self.dialect is OPENAI_RESPONSES:
            return {
                "model": "gpt-5.5",
                "instructions": "You are Codex.",
                "input": self.conversation,
                "tools": [{"type": "function", "name": n, "parameters": p} for n, p in self.tools.items()],
                "stream": True,
            }
        if self.dialect is OPENAI_CHAT:
            return {
                "model": "gpt-5",
                "messages": self.conversation,
                "tools": [
                    {"type": "function", "function": {"name": n, "parameters": p}} for n, p in self.tools.items()
                ],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        return {
            "contents": self.conversation,
            "systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]},
            "tools": [
                {"functionDeclarations": [{"name": n, "parametersJsonSchema": p} for n, p in self.tools.items()]}
            ],
        }

    def prompt(self, text: str) -> None:
        if self.dialect is OPENAI_RESPONSES:
            self.conversation.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "# AGENTS.md ..."}]}
            )
            self.conversation.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
            )
        elif self.dialect is OPENAI_CHAT:
            self.conversation.append({"role": "system", "content": "You are opencode."})
            self.conversation.append({"role": "user", "content": [{"type": "text", "text": text}]})
        else:
            self.conversation.append({"role": "user", "parts": [{"text": "<session_context> ..."}, {"text": text}]})

    def calls(self, answer: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        """(id, tool, arguments) of each call an answer makes."""
        if self.dialect is OPENAI_RESPONSES:
            return [
                (item["call_id"], item["name"], json.loads(item["arguments"]))
                for item in answer["output"]
                if item["type"] == "function_call"
            ]
        if self.dialect is OPENAI_CHAT:
            return [
                (call["id"], call["function"]["name"], json.loads(call["function"]["arguments"]))
                for call in answer["choices"][0]["message"].get("tool_calls") or []
            ]
        parts = answer["candidates"][0]["content"]["parts"]
        return [
            (p["functionCall"]["id"], p["functionCall"]["name"], p["functionCall"]["args"])
            for p in parts
            if "functionCall" in p
        ]

    def text(self, answer: dict[str, Any]) -> str:
        if self.dialect is OPENAI_RESPONSES:
            return "".join(
                part["text"] for item in answer["output"] if item["type"] == "message" for part in item["content"]
            )
        if self.dialect is OPENAI_CHAT:
            return str(answer["choices"][0]["message"]["content"] or "")
        return "".join(p.get("text", "") for p in answer["candidates"][0]["content"]["parts"])

    def answered(self, answer: dict[str, Any], outputs: list[str]) -> None:
        calls = self.calls(answer)
        if self.dialect is OPENAI_RESPONSES:
            self.conversation.extend(answer["output"])
            self.conversation.extend(
                {"type": "function_call_output", "call_id": call_id, "output": out}
                for (call_id, _, _), out in zip(calls, outputs, strict=True)
            )
        elif self.dialect is OPENAI_CHAT:
            self.conversation.append(answer["choices"][0]["message"])
            self.conversation.extend(
                {"role": "tool", "tool_call_id": call_id, "content": out}
                for (call_id, _, _), out in zip(calls, outputs, strict=True)
            )
        else:
            self.conversation.append(answer["candidates"][0]["content"])
            if calls:
                self.conversation.append(
                    {
                        "role": "user",
                        "parts": [
                            {"functionResponse": {"id": call_id, "name": name, "response": {"output": out}}}
                            for (call_id, name, _), out in zip(calls, outputs, strict=True)
                        ],
                    }
                )


RUNTIMES = [
    pytest.param(OPENAI_RESPONSES, CODEX_TOOLS, id="codex"),
    pytest.param(OPENAI_CHAT, OPENCODE_TOOLS, id="opencode"),
    pytest.param(GEMINI, GEMINI_TOOLS, id="gemini"),
]


def _play(client: Client, outputs: Callable[[str, dict[str, Any]], str]) -> list[dict[str, Any]]:
    """The story played to its end: each request read, checked and answered as the server does."""
    client.prompt(BEACON)
    answers = []
    for expected_turn in range(len(STORY.turns)):
        asked = client.dialect.read(client.path(), client.request())
        assert asked.turn == expected_turn
        assert not asked.side
        assert script.script_name({}, asked) == "story"
        assert any(BEACON in text for text in asked.context), "the beacon is context, whatever came after it"
        assert not any("On branch main" in text for text in asked.context), "a tool's result is not context"
        assert script.check_results(STORY, asked.turn, asked, client.dialect.id_prefix) == []
        reply = script.reply(STORY, asked.turn, asked.tools, client.dialect.id_prefix)
        answer = client.dialect.answer(reply, model="m", usage=USAGE, answer_id=f"a{expected_turn}")
        answers.append(answer)
        client.answered(answer, [outputs(name, arguments) for _, name, arguments in client.calls(answer)])
    return answers


def _results(name: str, arguments: dict[str, Any]) -> str:
    """What a runtime's tool prints for the story's calls."""
    command = str(arguments.get("cmd") or arguments.get("command") or "")
    if command == "git status":
        return "Process exited with code 0\nOutput:\nOn branch main\nnothing to commit"
    if ("/r/a.txt" in command and command.startswith("cat")) or name in ("read_file", "read"):
        return "two\n"
    return "ok"


@pytest.mark.parametrize(("dialect", "tools"), RUNTIMES)
def test_a_script_plays_through_each_runtime_s_api_in_its_own_tools(dialect: Dialect, tools: dict[str, Any]) -> None:
    client = Client(dialect, tools)
    first, second, last = _play(client, _results)
    (call,) = client.calls(first)
    shell = {"exec_command": "cmd", "run_shell_command": "command", "bash": "command"}
    assert call[1] in shell
    assert call[1] in tools
    assert call[2][shell[call[1]]] == "git status"
    assert [name in tools for _, name, _ in client.calls(second)] == [True, True, True]
    assert client.text(last) == "done"
    assert client.calls(last) == []


@pytest.mark.parametrize(("dialect", "tools"), RUNTIMES)
def test_a_wrong_or_missing_tool_result_is_a_script_failure(dialect: Dialect, tools: dict[str, Any]) -> None:
    client = Client(dialect, tools)
    client.prompt(BEACON)
    reply = script.reply(STORY, 0, tools, dialect.id_prefix)
    answer = dialect.answer(reply, model="m", usage=USAGE, answer_id="a0")
    client.answered(answer, ["fatal: not a git repository"])
    (failure,) = script.check_results(STORY, 1, dialect.read(client.path(), client.request()), dialect.id_prefix)
    assert "does not contain 'On branch main'" in failure
    assert "fatal: not a git repository" in failure
    bare = Client(dialect, tools)
    bare.prompt(BEACON)
    bare.conversation.extend(
        answer["output"]
        if dialect is OPENAI_RESPONSES
        else [answer["choices"][0]["message"]]
        if dialect is OPENAI_CHAT
        else [answer["candidates"][0]["content"]]
    )
    asked = dialect.read(bare.path(), bare.request())
    assert asked.turn == 1
    assert "no tool result came back" in script.check_results(STORY, 1, asked, dialect.id_prefix)[0]


def test_each_use_is_sent_in_the_runtime_s_own_tool_its_required_parameters_filled() -> None:
    edit_use = STORY.turns[1].tool_uses[1]
    assert concrete(edit_use.name, edit_use.input, GEMINI_TOOLS) == (
        "replace",
        {"file_path": "/r/a.txt", "old_string": "one", "new_string": "two", "instruction": "Edit as the script says"},
    )
    assert concrete(edit_use.name, edit_use.input, OPENCODE_TOOLS) == (
        "edit",
        {"filePath": "/r/a.txt", "oldString": "one", "newString": "two"},
    )
    # Codex offers no write tool of this shape: the content goes through its shell, base64-encoded.
    write_use = STORY.turns[1].tool_uses[0]
    tool, arguments = concrete(write_use.name, write_use.input, CODEX_TOOLS)
    assert tool == "exec_command"
    encoded = base64.b64encode(b"one\n").decode()
    assert f"printf %s {encoded} | base64 -d > /r/a.txt" in arguments["cmd"]
    assert arguments["yield_time_ms"] == 30_000
    assert "$(" not in arguments["cmd"]
    assert "`" not in arguments["cmd"], "Gemini CLI refuses a command with a substitution"
    assert arguments["cmd"].startswith("mkdir -p /r && ")
    # A relative path is the worktree's (its commands run there): its directory is ".", not the file itself.
    _, relative = concrete("Write", {"file_path": "CHANGELOG.md", "content": "x"}, CODEX_TOOLS)
    assert relative["cmd"].startswith("mkdir -p . && ")
    _, nested = concrete("Write", {"file_path": "docs/a.md", "content": "x"}, CODEX_TOOLS)
    assert nested["cmd"].startswith("mkdir -p docs && ")


def test_a_tool_result_without_an_id_is_matched_by_its_position() -> None:
    """Gemini's functionResponse ``id`` is optional: a CLI that leaves it out is matched by order."""
    client = Client(GEMINI, GEMINI_TOOLS)
    client.prompt(BEACON)
    client.conversation.append(
        {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {}}}]}
    )
    client.conversation.append(
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "run_shell_command", "response": {"output": "On branch main"}}}],
        }
    )
    asked = GEMINI.read(client.path(), client.request())
    assert script.check_results(STORY, 1, asked, GEMINI.id_prefix) == []


def _reassembled_responses(records: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r["item"] for r in records if r["type"] == "response.output_item.done"]
    completed = records[-1]
    assert completed["type"] == "response.completed"
    assert completed["response"]["output"] == done
    texts = "".join(r["delta"] for r in records if r["type"] == "response.output_text.delta")
    arguments = "".join(r["delta"] for r in records if r["type"] == "response.function_call_arguments.delta")
    assert texts == "".join(p["text"] for i in done if i["type"] == "message" for p in i["content"])
    assert arguments == "".join(i["arguments"] for i in done if i["type"] == "function_call")
    assert [r["sequence_number"] for r in records] == list(range(len(records)))
    return dict(completed["response"])


def _reassembled_chat(records: list[Any]) -> dict[str, Any]:
    assert records[-1] == "[DONE]"
    *chunks, usage_chunk, _ = records
    assert usage_chunk["choices"] == []
    assert "usage" in usage_chunk
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        (choice,) = chunk["choices"]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            slot = calls.setdefault(call["index"], {"function": {"arguments": ""}})
            if "id" in call:
                slot.update(id=call["id"], type=call["type"])
                slot["function"]["name"] = call["function"]["name"]
            slot["function"]["arguments"] += call["function"].get("arguments", "")
        finish = choice["finish_reason"] or finish
    if calls:
        message["tool_calls"] = [calls[n] for n in sorted(calls)]
    message["content"] = message["content"] or None
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage_chunk["usage"]}


def _reassembled_gemini(records: list[dict[str, Any]]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for record in records:
        for part in record["candidates"][0]["content"]["parts"]:
            if "text" in part and parts and "text" in parts[-1]:
                parts[-1] = {"text": parts[-1]["text"] + part["text"]}
            else:
                parts.append(part)
    assert records[-1]["candidates"][0]["finishReason"] == "STOP"
    assert all("finishReason" not in r["candidates"][0] for r in records[:-1])
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}}],
        "usageMetadata": records[-1]["usageMetadata"],
    }


def _records(raw: list[bytes], *, named: bool) -> list[Any]:
    decoded: list[Any] = []
    for record in raw:
        lines = record.decode().strip("\n").split("\n")
        if named:
            assert lines[0].startswith("event: ")
        data = lines[-1].removeprefix("data: ")
        decoded.append(data if data == "[DONE]" else json.loads(data))
        if named:
            assert decoded[-1]["type"] == lines[0].removeprefix("event: ")
    return decoded


@pytest.mark.parametrize("reply", [Reply(text="All done, the tests pass now."), None], ids=["text", "calls"])
@pytest.mark.parametrize(("dialect", "tools"), RUNTIMES)
def test_a_streamed_answer_reassembles_into_the_whole_answer(
    dialect: Dialect, tools: dict[str, Any], reply: Reply | None
) -> None:
    if reply is None:
        base = script.reply(STORY, 1, tools, dialect.id_prefix)
        reply = Reply(text="Writing the file, then checking it.", calls=base.calls)
    whole = dialect.answer(reply, model="m", usage=USAGE, answer_id="x")
    streamed = dialect.stream(reply, model="m", usage=USAGE, answer_id="x")
    if dialect is OPENAI_RESPONSES:
        assert _reassembled_responses(_records(streamed, named=True)) == whole
    elif dialect is OPENAI_CHAT:
        rebuilt = _reassembled_chat(_records(streamed, named=False))
        assert rebuilt["choices"] == whole["choices"]
        assert rebuilt["usage"] == whole["usage"]
    else:
        rebuilt = _reassembled_gemini(_records(streamed, named=False))
        assert rebuilt["candidates"][0]["content"] == whole["candidates"][0]["content"]
        assert rebuilt["usageMetadata"] == whole["usageMetadata"]


def test_usage_is_reported_in_each_api_s_words_cached_input_included_in_the_prompt() -> None:
    cached = usage(1000, 800, 30, cache=True)
    responses = OPENAI_RESPONSES.answer(Reply(text="x"), model="m", usage=cached, answer_id="u")["usage"]
    chat = OPENAI_CHAT.answer(Reply(text="x"), model="m", usage=cached, answer_id="u")["usage"]
    gemini = GEMINI.answer(Reply(text="x"), model="m", usage=cached, answer_id="u")["usageMetadata"]
    prompt = cached["input_tokens"] + cached["cache_creation_input_tokens"] + cached["cache_read_input_tokens"]
    assert responses["input_tokens"] == chat["prompt_tokens"] == gemini["promptTokenCount"] == prompt
    assert responses["input_tokens_details"]["cached_tokens"] == 800
    assert chat["prompt_tokens_details"]["cached_tokens"] == 800
    assert gemini["cachedContentTokenCount"] == 800
    assert responses["output_tokens"] == chat["completion_tokens"] == gemini["candidatesTokenCount"] == 30
    assert responses["total_tokens"] == chat["total_tokens"] == gemini["totalTokenCount"] == prompt + 30


def test_errors_and_overload_are_in_each_api_s_shape() -> None:
    assert OPENAI_RESPONSES.error(429, "slow down")["error"]["code"] == "rate_limit_exceeded"
    assert OPENAI_CHAT.error(401, "no")["error"] == {
        "message": "no",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert GEMINI.error(429, "quota")["error"] == {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}
    assert GEMINI.error(503, "busy")["error"]["status"] == "UNAVAILABLE"
    assert {OPENAI_RESPONSES.overloaded, OPENAI_CHAT.overloaded, GEMINI.overloaded} == {503}


def test_routes_name_their_dialect() -> None:
    assert dialect_for("/v1/responses") is OPENAI_RESPONSES
    assert dialect_for("/v1/chat/completions") is OPENAI_CHAT
    assert dialect_for("/v1beta/models/gemini-3.8-flash:streamGenerateContent") is GEMINI
    assert dialect_for("/v1beta/models/gemini-3.5-flash-lite:generateContent") is GEMINI
    assert dialect_for("/v1beta/models/x:embedContent") is None
    assert dialect_for("/v1/models") is None
    asked = GEMINI.read("/v1beta/models/gemini-3.8-flash:streamGenerateContent", {"contents": []})
    assert (asked.model, asked.stream) == ("gemini-3.8-flash", True)
    assert not GEMINI.read("/v1beta/models/g:generateContent", {}).stream


def test_gemini_cli_s_routing_request_gets_json_its_schema_accepts() -> None:
    """Gemini CLI asks a small model to pick the main one (a request without tools, asking JSON): a
    ``complexity_score`` outside 1-100 is refused (../shared/research/runtimes.md)."""
    routing = {
        "contents": [{"role": "user", "parts": [{"text": "route this"}]}],
        "generationConfig": {
            "responseMimeType": "application/json",
            "responseJsonSchema": {
                "type": "object",
                "properties": {
                    "reasoning": {"type": "string"},
                    "complexity_score": {"type": "integer", "minimum": 1, "maximum": 100},
                    "model_choice": {"type": "string", "enum": ["flash", "pro"]},
                },
                "required": ["reasoning", "complexity_score"],
            },
        },
    }
    asked = GEMINI.read("/v1beta/models/gemini-3.5-flash-lite:generateContent", routing)
    assert asked.side
    assert json.loads(script.side_answer(asked)) == {"reasoning": "Scripted session", "complexity_score": 1}
    upper = {
        "generationConfig": {
            "responseSchema": {"type": "OBJECT", "properties": {"k": {"type": "STRING", "enum": ["a"]}}}
        }
    }
    assert json.loads(script.side_answer(GEMINI.read("/v1beta/models/g:generateContent", upper))) == {"k": "a"}


def test_codex_s_title_request_is_a_side_request_though_it_offers_a_tool() -> None:
    title = {
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TITLE}]},
        ],
        "tools": [{"type": "custom", "name": "apply_patch"}],
    }
    assert OPENAI_RESPONSES.read("/v1/responses", title).side


TITLE = "Generate a concise, single-line task title of at most 36 characters and under five words"


def test_a_title_request_without_tools_is_a_side_request_in_every_dialect() -> None:
    responses = OPENAI_RESPONSES.read("/v1/responses", {"input": "Generate a concise, single-line task title"})
    chat = OPENAI_CHAT.read("/v1/chat/completions", {"messages": [{"role": "user", "content": "title?"}]})
    assert responses.side
    assert chat.side
    assert responses.prompt == "Generate a concise, single-line task title"
