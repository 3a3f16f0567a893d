"""The scripted model server's pure parts: which turn a request asks for (after a compaction too), which script it
names, the checks on tool results, Claude Code's compaction request and its summary, the server-sent events a
message streams as, and the usage it reports."""

from __future__ import annotations

import json
from typing import Any

from gt.model_server import Fault, Script, Turn, anthropic, bash, edit, exhaust_context, say, use, write
from gt.model_server import script as script
from gt.model_server.anthropic import COMPACTION_PROMPT, answer, stream_events
from gt.model_server.asked import Asked, Reply
from gt.model_server.sse import sse_record
from gt.model_server.tokens import estimate_tokens, usage

STORY = Script(
    name="story",
    turns=(
        use(bash("git status", expect="On branch main")),
        use(write("/r/a.txt", "one\n"), edit("/r/a.txt", "one", "two", expect="updated")),
        say("done"),
    ),
)
TOOLS: list[dict[str, Any]] = [{"name": name, "input_schema": {}} for name in ("Bash", "Write", "Edit")]
PREFIX = anthropic.ID_PREFIX


def asked(body: dict[str, Any]) -> Asked:
    return anthropic.read(anthropic.MESSAGES, body)


def content_blocks(turn: Turn, name: str, index: int) -> list[dict[str, Any]]:
    """Turn ``index`` of a one-turn-deep script named ``name``, as Claude Code gets it."""
    padded = Script(name=name, turns=(*[say("")] * index, turn))
    return anthropic.content_blocks(script.reply(padded, index, {}, PREFIX))


def _result(tool_id: str, text: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": text}


def _request(*messages: dict[str, Any], system: Any = "", tools: Any = TOOLS) -> dict[str, Any]:
    return {"model": "m", "system": system, "tools": tools, "messages": list(messages)}


def _turn(body: dict[str, Any]) -> int:
    return asked(body).turn


def test_the_turn_asked_for_is_the_number_of_assistant_messages_so_a_retry_gets_the_same_turn() -> None:
    first = _request({"role": "user", "content": "go"})
    second = _request(
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": content_blocks(STORY.turns[0], "story", 0)},
        {"role": "user", "content": [_result(script.tool_use_id("story", 0, 0), "On branch main")]},
    )
    assert _turn(first) == 0
    assert _turn(second) == 1
    assert _turn(second) == _turn(dict(second))  # the same request again: the same turn


def test_a_script_is_named_by_header_then_by_marker_in_the_system_prompt_or_first_message() -> None:
    marked_system = _request({"role": "user", "content": "hi"}, system=[{"type": "text", "text": "[model-script:s2]"}])
    marked_prompt = _request({"role": "user", "content": [{"type": "text", "text": "bead [model-script: s3 ] go"}]})
    assert script.script_name({"x-gt-model-script": "s1"}, asked(marked_system)) == "s1"
    assert script.script_name({}, asked(marked_system)) == "s2"
    assert script.script_name({}, asked(marked_prompt)) == "s3"
    assert script.script_name({}, asked(_request({"role": "user", "content": "nothing"}))) is None


def test_requests_without_tools_are_side_requests() -> None:
    assert asked(_request({"role": "user", "content": "title?"}, tools=[])).side
    assert asked({"messages": []}).side
    assert not asked(_request({"role": "user", "content": "go"})).side


def test_tool_results_are_checked_against_what_the_turn_expects() -> None:
    good = _request(
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": []},
        {"role": "user", "content": [_result(script.tool_use_id("story", 0, 0), "On branch main\nnothing to commit")]},
    )
    wrong = _request(
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": []},
        {"role": "user", "content": [_result(script.tool_use_id("story", 0, 0), "fatal: not a git repository")]},
    )
    missing = _request({"role": "user", "content": "go"}, {"role": "assistant", "content": []})
    assert script.check_results(STORY, 1, asked(good), PREFIX) == []
    assert script.check_results(STORY, 0, asked(good), PREFIX) == []  # the first turn follows no tool use
    (failure,) = script.check_results(STORY, 1, asked(wrong), PREFIX)
    assert "does not contain 'On branch main'" in failure
    assert "fatal: not a git repository" in failure
    assert "no tool result came back for Bash" in script.check_results(STORY, 1, asked(missing), PREFIX)[0]


def test_a_turn_may_require_text_in_the_newest_prompt() -> None:
    typed = _request({"role": "user", "content": [{"type": "text", "text": "please write the file"}]})
    assert script.check_prompt(Turn(prompt="write the file"), asked(typed), 0) == []
    assert "does not contain 'commit'" in script.check_prompt(Turn(prompt="commit"), asked(typed), 0)[0]
    # Claude Code's interactive requests end with a system-role message after the typed prompt.
    with_system = _request(
        {"role": "user", "content": [{"type": "text", "text": "please write the file"}]},
        {"role": "system", "content": [{"type": "text", "text": "Today's date is ..."}]},
    )
    assert script.check_prompt(Turn(prompt="write the file"), asked(with_system), 0) == []


def test_faults_are_answered_in_order_then_the_turn() -> None:
    faults = (Fault(kind="rate_limited", times=2), Fault(kind="overloaded"))
    assert [fault.kind if fault else None for fault in (script.fault_for(faults, n) for n in range(4))] == [
        "rate_limited",
        "rate_limited",
        "overloaded",
        None,
    ]
    forever = (Fault(kind="unauthorized", times=None),)
    assert script.fault_for(forever, 99) == forever[0]


def test_a_streamed_message_reassembles_into_the_non_streamed_one() -> None:
    turn = use(write("/r/a.txt", "x" * 100), text="Writing the file now, as asked.")
    blocks = content_blocks(turn, "story", 1)
    reply = Reply(text=turn.text, calls=script.reply(Script(name="story", turns=(turn,)), 0, {}, PREFIX).calls)
    full = answer(reply, model="claude-x", usage=usage(1000, 0, 50, cache=False), answer_id="1")
    events = stream_events(full)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["content"] == []
    assert start["stop_reason"] is None
    rebuilt: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_start":
            rebuilt.append(dict(data["content_block"]))
        elif name == "content_block_delta" and data["delta"]["type"] == "text_delta":
            rebuilt[data["index"]]["text"] += data["delta"]["text"]
        elif name == "content_block_delta":
            partial[data["index"]] = partial.get(data["index"], "") + data["delta"]["partial_json"]
        elif name == "content_block_stop" and data["index"] in partial:
            rebuilt[data["index"]]["input"] = json.loads(partial[data["index"]])
    assert [block["type"] for block in rebuilt] == [block["type"] for block in blocks]
    assert rebuilt == anthropic.content_blocks(reply)
    assert next(data for name, data in events if name == "message_delta")["delta"]["stop_reason"] == "tool_use"
    assert full["stop_reason"] == "tool_use"
    assert answer(Reply(text="hi"), model="x", usage={}, answer_id="m")["stop_reason"] == "end_turn"


def test_an_event_is_encoded_as_one_sse_record() -> None:
    assert sse_record({"type": "ping"}, event="ping") == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert sse_record("[DONE]") == b"data: [DONE]\n\n"


def test_usage_reads_from_the_cache_what_the_session_sent_before() -> None:
    body = _request({"role": "user", "content": "x" * 4000})
    total = estimate_tokens(asked(body).size)
    assert total == estimate_tokens({key: body[key] for key in ("system", "tools", "messages")})
    assert total > 1000
    first = usage(total, 0, 20, cache=True)
    later = usage(total + 100, total, 20, cache=True)
    assert first == {
        "input_tokens": 3,
        "cache_creation_input_tokens": total,
        "cache_read_input_tokens": 0,
        "output_tokens": 20,
    }
    assert later["cache_read_input_tokens"] == total
    assert later["cache_creation_input_tokens"] == 100
    assert usage(total, total, 5, cache=False)["input_tokens"] == total
    assert estimate_tokens(asked(body).size) == total  # deterministic


def test_a_side_request_asking_for_json_gets_the_smallest_value_its_schema_allows() -> None:
    title_schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "tags": {"type": "array"}, "n": {"type": "integer"}},
        "required": ["title", "n"],
        "additionalProperties": False,
    }
    asking = {"output_config": {"effort": "medium", "format": {"type": "json_schema", "schema": title_schema}}}
    assert json.loads(script.side_answer(asked(asking))) == {"title": "Scripted session", "n": 1}
    assert script.side_answer(asked({"messages": []})) == "Scripted session"


def _compaction_request(*conversation: dict[str, Any]) -> dict[str, Any]:
    """Claude Code's summary request (2.1.332): the conversation with its tools, the newest user message carrying
    the summary instruction after its tool results."""
    *earlier, newest = conversation
    asking = {
        "type": "text",
        "text": f"CRITICAL: Respond with TEXT ONLY.\n\nYour task is to {COMPACTION_PROMPT}, ...",
    }
    return _request(*earlier, {"role": "user", "content": [*newest["content"], asking]})


def test_a_compaction_request_is_recognised_and_the_turns_after_it_count_on_from_its_summary() -> None:
    before = (
        {"role": "user", "content": [{"type": "text", "text": "bead [model-script:story] go"}]},
        {"role": "assistant", "content": content_blocks(STORY.turns[0], "story", 0)},
        {"role": "user", "content": [_result(script.tool_use_id("story", 0, 0), "On branch main")]},
    )
    compacting = _compaction_request(*before)
    assert asked(compacting).compaction
    assert not asked(_request(*before)).compaction
    assert not asked(compacting).side, "it offers the tools like a turn"
    summary = script.compaction_summary("story", _turn(compacting))
    assert "<summary>" in summary
    assert "[model-turns:1]" in summary
    # What Claude Code sends next: the summary's content first, then the newest exchange it kept verbatim.
    after = _request(
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>git status</system-reminder>"},
                {"type": "text", "text": f"This session is being continued ...\n{summary}"},
            ],
        },
        {"role": "assistant", "content": content_blocks(STORY.turns[1], "story", 1)},
        {
            "role": "user",
            "content": [
                _result(script.tool_use_id("story", 1, 0), "ok"),
                _result(script.tool_use_id("story", 1, 1), "updated"),
            ],
        },
    )
    assert _turn(after) == 2, "one turn summarised, one kept: the next is turn 2"
    assert script.check_results(STORY, 2, asked(after), PREFIX) == []
    assert script.script_name({}, asked(after)) == "story", "the summary names the script the beacon named"
    # Compacted again later: the newest summary counts.
    again = _request(
        {"role": "user", "content": [{"type": "text", "text": script.compaction_summary("story", 5)}]},
        {"role": "assistant", "content": []},
    )
    assert _turn(again) == 6


def test_a_turn_can_report_a_conversation_that_fills_the_context_window() -> None:
    turn = exhaust_context(use(bash("make")))
    assert turn.context_tokens == script.EXHAUSTED_CONTEXT
    assert turn.tool_uses == use(bash("make")).tool_uses
    assert 967_000 < script.EXHAUSTED_CONTEXT < 1_000_000, (
        "past Claude Code's auto-compact threshold, within the window"
    )
