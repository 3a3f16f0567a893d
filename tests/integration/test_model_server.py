"""The scripted model server over real HTTP (a plain standard-library client): non-streaming answers (Claude Code
itself streams), server-sent events, count_tokens, side requests, script failures, faults, the request record."""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gt.model_server import Fault, ModelServer, Script, bash, say, use
from gt.model_server.script import tool_use_id
from tests.helpers import assert_eventually

KEY = "sk-test-key-never-recorded"
TOOLS = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": KEY, **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


async def post(server: ModelServer, path: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, str], Any]:
    status, response_headers, data = await asyncio.to_thread(
        _post, server.base_url + path, body, {name.replace("_", "-"): value for name, value in headers.items()}
    )
    if response_headers.get("content-type", "").startswith("text/event-stream"):
        return status, response_headers, _events(data)
    return status, response_headers, json.loads(data)


def _events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for record in data.decode().split("\n\n"):
        if record.strip():
            lines = dict(line.split(": ", 1) for line in record.splitlines())
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def _ask(*messages: dict[str, Any], stream: bool = False, tools: Any = TOOLS) -> dict[str, Any]:
    return {
        "model": "claude-test-1",
        "max_tokens": 1000,
        "stream": stream,
        "system": [{"type": "text", "text": "You are a test.", "cache_control": {"type": "ephemeral"}}],
        "tools": tools,
        "messages": list(messages),
    }


STORY = Script(name="story", turns=(use(bash("git status", expect="On branch")), say("All done.")))


async def test_non_streaming_and_streaming_answers_follow_the_script() -> None:
    async with ModelServer([STORY]) as server:
        first = _ask({"role": "user", "content": "go"})
        status, _, answer = await post(server, "/v1/messages", first, x_gt_model_script="story")
        assert status == 200
        assert answer["type"] == "message"
        assert answer["model"] == "claude-test-1"
        assert answer["stop_reason"] == "tool_use"
        (tool,) = answer["content"]
        assert tool == {
            "type": "tool_use",
            "id": tool_use_id("story", 0, 0),
            "name": "Bash",
            "input": {"command": "git status"},
        }
        assert set(answer["usage"]) == {
            "input_tokens",
            "output_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        }
        second = _ask(
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": answer["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool["id"], "content": "On branch main"}],
            },
            stream=True,
        )
        status, headers, events = await post(server, "/v1/messages?beta=true", second, x_gt_model_script="story")
        assert status == 200
        assert headers["transfer-encoding"] == "chunked"
        names = [name for name, _ in events]
        assert names == [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        assert events[3][1]["delta"] == {"type": "text_delta", "text": "All done."}
        final_usage = events[5][1]["usage"]
        # The second request re-sends the first one's prompt: that part is read from the cache.
        assert final_usage["cache_read_input_tokens"] == answer["usage"]["cache_creation_input_tokens"]
        assert server.usage("story") == [answer["usage"], final_usage]
        assert [request.turn for request in server.turns("story")] == [0, 1]
        assert server.failures == []
        assert all("x-api-key" not in request.headers for request in server.requests)
        assert server.requests[0].headers["x-gt-model-script"] == "story"


async def test_count_tokens_side_requests_and_unknown_routes_consume_no_turn() -> None:
    async with ModelServer([STORY], keys={KEY: "story"}) as server:
        status, _, counted = await post(server, "/v1/messages/count_tokens", _ask({"role": "user", "content": "go"}))
        assert status == 200
        assert counted["input_tokens"] > 10
        status, _, side = await post(server, "/v1/messages", _ask({"role": "user", "content": "a title?"}, tools=[]))
        assert status == 200
        assert side["content"][0]["type"] == "text"
        status, _, missing = await post(server, "/v1/nothing", {})
        assert status == 404
        assert missing["type"] == "error"
        # The API key chose the script: the first real turn is still turn 0.
        _, _, answer = await post(server, "/v1/messages", _ask({"role": "user", "content": "go"}))
        assert answer["content"][0]["name"] == "Bash"
        assert [request.kind for request in server.requests] == ["count_tokens", "side", "other", "turn"]
        assert server.failures == []


async def test_a_title_request_gets_json_and_a_connectivity_check_is_answered_on_a_kept_alive_connection() -> None:
    title = _ask({"role": "user", "content": "<session>fix it</session>"}, tools=[])
    title["model"] = "claude-haiku-test"
    title["output_config"] = {
        "format": {
            "type": "json_schema",
            "schema": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
        }
    }

    def exchange(port: int) -> tuple[int, int, dict[str, Any]]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("HEAD", "/api/hello")
            hello = connection.getresponse()
            hello.read()
            connection.request("POST", "/v1/messages", json.dumps(title), {"content-type": "application/json"})
            answer = connection.getresponse()
            return hello.status, answer.status, json.loads(answer.read())
        finally:
            connection.close()

    async with ModelServer([STORY], default="story") as server:
        hello_status, status, answer = await asyncio.to_thread(exchange, server.port)
        assert hello_status == 200
        assert status == 200
        assert answer["model"] == "claude-haiku-test"
        assert json.loads(answer["content"][0]["text"]) == {"title": "Scripted session"}
        assert [request.kind for request in server.requests] == ["other", "side"]
        assert server.turns("story") == []


async def test_a_wrong_tool_result_is_a_recorded_script_failure_answered_readably() -> None:
    async with ModelServer([STORY], default="story") as server:
        _, _, answer = await post(server, "/v1/messages", _ask({"role": "user", "content": "go"}))
        wrong = _ask(
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": answer["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": answer["content"][0]["id"], "content": "fatal: no"}],
            },
        )
        _, _, failed = await post(server, "/v1/messages", wrong)
        assert failed["stop_reason"] == "end_turn"
        assert failed["content"][0]["text"].startswith("SCRIPT FAILURE: turn 0: the Bash result does not contain")
        assert len(server.failures) == 1
        assert "fatal: no" in server.failures[0]


async def test_faults_rate_limit_overload_unauthorized_then_the_turn() -> None:
    faults = (
        Fault(kind="rate_limited", retry_after_s=7),
        Fault(kind="overloaded"),
        Fault(kind="unauthorized"),
    )
    script = Script(name="faulty", turns=(use(bash("true"), faults=faults),))
    async with ModelServer([script], default="faulty") as server:
        ask = _ask({"role": "user", "content": "go"})
        answers = [await post(server, "/v1/messages", ask) for _ in range(4)]
        assert [status for status, _, _ in answers] == [429, 529, 401, 200]
        assert answers[0][1]["retry-after"] == "7"
        assert [body["error"]["type"] for _, _, body in answers[:3]] == [
            "rate_limit_error",
            "overloaded_error",
            "authentication_error",
        ]
        assert [answer.fault for answer in server.answers] == ["rate_limited", "overloaded", "unauthorized", None]


async def test_a_stalled_request_is_held_until_released_then_dropped() -> None:
    script = Script(name="stall", turns=(say("late"),), faults=(Fault(kind="stall"),))
    async with ModelServer([script], default="stall") as server:
        pending = asyncio.ensure_future(post(server, "/v1/messages", _ask({"role": "user", "content": "go"})))
        await assert_eventually(lambda: server.stalled == 1)
        assert not pending.done()
        server.release()
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError, urllib.error.URLError)):
            await asyncio.wait_for(pending, 30)
        assert server.stalled == 0
        # The fault was for one request: the retry is answered.
        _, _, answer = await post(server, "/v1/messages", _ask({"role": "user", "content": "go"}))
        assert answer["content"][0]["text"] == "late"


async def test_the_module_serves_scripts_from_a_json_file(tmp_path: Path, python: str) -> None:
    scripts = tmp_path / "scripts.json"
    scripts.write_bytes(msgspec.json.encode([STORY]))
    process = await asyncio.create_subprocess_exec(
        python, "-m", "gt.model_server", str(scripts), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        base_url = json.loads(line)["base_url"]
        status, _, data = await asyncio.to_thread(
            _post, base_url + "/v1/messages", _ask({"role": "user", "content": "go"})
        )
        assert status == 200
        assert json.loads(data)["content"][0]["input"] == {"command": "git status"}
    finally:
        process.terminate()
        await process.wait()


async def test_a_session_fault_counts_the_session_s_requests_not_each_turn_s() -> None:
    script = Script(
        name="once",
        turns=(use(bash("true")), say("done")),
        faults=(Fault(kind="overloaded", times=1),),
    )
    async with ModelServer([script], default="once") as server:
        first = _ask({"role": "user", "content": "go"})
        statuses = [(await post(server, "/v1/messages", first))[0] for _ in range(2)]
        _, _, answer = await post(server, "/v1/messages", first)
        second = _ask(
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": answer["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": answer["content"][0]["id"], "content": ""}],
            },
        )
        status, _, done = await post(server, "/v1/messages", second)
        assert statuses == [529, 200]
        assert status == 200
        assert done["content"][0]["text"] == "done"
