"""The scripted model server: the Anthropic Messages API over HTTP/1.1 on a loopback port, asyncio streams only.

Routes: ``POST /v1/messages`` (JSON, or server-sent events when ``"stream": true``, chunked so that a dropped
connection is a visible error to the client), ``POST /v1/messages/count_tokens``; anything else is recorded and
answered 404 in the API's error shape. Connections are kept alive as HTTP/1.1 clients expect.

A request belongs to a session's script by (first match): the ``x-gt-model-script`` header, a
``[model-script:<name>]`` marker in the system prompt or first user message, the API key (``x-api-key``, or a
bearer token) registered for a script, else the default script. Requests without tools are side requests
(Claude Code's title and summary generation, quota checks): answered with a short text, recorded, never
consuming a turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import structlog

from gt.model_server import wire
from gt.model_server.script import (
    Fault,
    Script,
    Turn,
    check_prompt,
    check_results,
    compaction_summary,
    fault_for,
    is_compaction_request,
    is_side_request,
    script_name,
    side_answer,
    turn_index,
)

log = structlog.get_logger(__name__)

SECRET_HEADERS = frozenset({"x-api-key", "authorization"})
MAX_HEADER_BYTES = 64 * 1024
HEALTH_PATHS = frozenset({"/", "/api/hello"})
"""Answered 200: Claude Code's connectivity check (``HEAD /api/hello``) when non-essential traffic is on."""
_STATUS_TEXT = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}
_FAULT_STATUS = {"rate_limited": 429, "overloaded": 529, "unauthorized": 401}


class RecordedRequest(msgspec.Struct, kw_only=True):
    """A request as it arrived (its key headers left out), and how it was classified."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    script: str | None = None
    kind: str = "other"
    """turn, side, count_tokens or other."""
    turn: int | None = None
    received_at: float = 0.0
    """When it arrived (``time.time()``)."""


class SentAnswer(msgspec.Struct, kw_only=True):
    """What the server answered to a request (the usage it reported, for assertions on recorded costs)."""

    script: str | None
    kind: str
    turn: int | None
    status: int
    stream: bool
    model: str = ""
    usage: dict[str, int] | None = None
    fault: str | None = None


class _Http(msgspec.Struct, kw_only=True):
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ModelServer:
    """A scripted model on ``127.0.0.1:<port>``; ``async with ModelServer(scripts) as server: server.base_url``."""

    def __init__(
        self,
        scripts: Iterable[Script] = (),
        *,
        keys: Mapping[str, str] | None = None,
        default: str | None = None,
    ) -> None:
        self.scripts: dict[str, Script] = {script.name: script for script in scripts}
        self.keys: dict[str, str] = dict(keys or {})
        """API key -> script name."""
        self.default = default
        self.requests: list[RecordedRequest] = []
        self.answers: list[SentAnswer] = []
        self.failures: list[str] = []
        """Script failures: a tool result or prompt that did not match, an unknown script, a script run out."""
        self.stalled = 0
        """Requests held unanswered right now (a ``stall`` fault)."""
        self._attempts: dict[tuple[object, ...], int] = {}
        self._cached: dict[str, int] = {}
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    # --- life cycle --------------------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> ModelServer:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "the model server is not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` is set to."""
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.close()
        # Aborting the transports ends each connection's reader with an error its task handles (cancelling the
        # tasks instead makes asyncio's own stream callback raise on Python 3.11).
        for writer in list(self._connections.values()):
            writer.transport.abort()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()

    async def __aenter__(self) -> ModelServer:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def add(self, script: Script, *, key: str | None = None) -> None:
        """Register ``script`` (chosen by its name, or by ``key`` when it is the request's API key)."""
        self.scripts[script.name] = script
        if key is not None:
            self.keys[key] = script.name

    def release(self) -> None:
        """Let every stalled request go (each is then dropped: the client sees a network error and retries).
        A later stall holds again."""
        self._release.set()
        self._release = asyncio.Event()

    # --- reading views for tests -------------------------------------------------------------------------------

    def turns(self, script: str) -> list[RecordedRequest]:
        """The requests that asked ``script`` for a turn, in arrival order."""
        return [request for request in self.requests if request.script == script and request.kind == "turn"]

    def usage(self, script: str) -> list[dict[str, int]]:
        """The usage blocks sent to ``script``'s turns that were answered."""
        return [
            answer.usage
            for answer in self.answers
            if answer.script == script and answer.usage is not None and answer.status == 200
        ]

    # --- HTTP --------------------------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                keep_alive = await self._handle(request, writer)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            log.debug("model_server_connection_ended", error=str(exc))
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _handle(self, http: _Http, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; whether the connection stays open."""
        try:
            body = json.loads(http.body) if http.body else {}
        except ValueError:
            body = {"unparsed": http.body.decode(errors="replace")}
        if not isinstance(body, dict):
            body = {"unparsed": body}
        recorded = RecordedRequest(
            method=http.method,
            path=http.path,
            headers={name: value for name, value in http.headers.items() if name not in SECRET_HEADERS},
            body=body,
            received_at=time.time(),
        )
        self.requests.append(recorded)
        path = http.path.split("?", 1)[0]
        if http.method in ("GET", "HEAD") and path in HEALTH_PATHS:
            await _send_json(writer, 200, {}, head_only=http.method == "HEAD")
            return True
        if http.method != "POST" or path not in ("/v1/messages", "/v1/messages/count_tokens"):
            await _send_json(
                writer, 404, wire.error_body(404, f"no route {http.method} {path}"), head_only=http.method == "HEAD"
            )
            return True
        script = self._script_for(http.headers, body)
        recorded.script = script.name if script else None
        if path.endswith("/count_tokens"):
            recorded.kind = "count_tokens"
            count = wire.prompt_tokens(body)
            self.answers.append(
                SentAnswer(script=recorded.script, kind="count_tokens", turn=None, status=200, stream=False)
            )
            await _send_json(writer, 200, {"input_tokens": count})
            return True
        side = is_side_request(body)
        recorded.kind = "side" if side else "compact" if is_compaction_request(body) else "turn"
        recorded.turn = turn_index(body) if recorded.kind == "turn" else None
        return await self._answer_messages(writer, body, script, recorded)

    def _script_for(self, headers: Mapping[str, str], body: Mapping[str, Any]) -> Script | None:
        name = script_name(headers, body)
        if name is None:
            key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ").strip()
            name = self.keys.get(key, self.default)
        if name is None:
            return None
        script = self.scripts.get(name)
        if script is None:
            self._fail(f"no script named {name!r} (known: {sorted(self.scripts)})")
        return script

    def _count(self, key: tuple[object, ...]) -> int:
        """How many requests counted under ``key`` came before this one (and count this one)."""
        seen = self._attempts.get(key, 0)
        self._attempts[key] = seen + 1
        return seen

    def _fail(self, failure: str) -> None:
        log.warning("model_server_script_failure", failure=failure)
        self.failures.append(failure)

    async def _answer_messages(
        self, writer: asyncio.StreamWriter, body: Mapping[str, Any], script: Script | None, recorded: RecordedRequest
    ) -> bool:
        model = str(body.get("model") or (script.model if script else None) or "claude-scripted")
        stream = bool(body.get("stream"))
        turn: Turn | None = None
        if script is not None and recorded.kind == "turn" and recorded.turn is not None:
            turn = script.turns[recorded.turn] if recorded.turn < len(script.turns) else None
        # A session's faults count all its requests; a turn's count the requests for that turn they let through.
        fault = fault_for(script.faults, self._count((recorded.script,))) if script else None
        key = (recorded.script, recorded.kind, recorded.turn)
        attempt = self._count(key) if fault is None else self._attempts.get(key, 0)
        if fault is None and turn is not None:
            fault = fault_for(turn.faults, attempt)
        answer = SentAnswer(
            script=recorded.script, kind=recorded.kind, turn=recorded.turn, status=200, stream=stream, model=model
        )
        self.answers.append(answer)
        if fault is not None:
            answer.fault = fault.kind
            return await self._fault(writer, fault, answer, stream)
        blocks, text = self._reply(body, script, turn, recorded)
        if text is not None:
            blocks = [{"type": "text", "text": text}]
        total = wire.prompt_tokens(body)
        cache = wire.wants_cache(body) and recorded.kind in ("turn", "compact")
        cached_before = self._cached.get(recorded.script or "", 0) if cache else 0
        if cache:
            self._cached[recorded.script or ""] = max(cached_before, total)
        if turn is not None and turn.context_tokens is not None and text is None:
            total = max(total, turn.context_tokens)  # as if the conversation were that long (not cached for later)
        usage = wire.usage(total, cached_before, wire.estimate_tokens(blocks), cache=cache)
        answer.usage = usage
        full = wire.message(
            wire.message_id(recorded.script, recorded.kind, recorded.turn, attempt), model, blocks, usage
        )
        if not stream:
            await _send_json(writer, 200, full)
            return True
        await _send_stream(writer, wire.stream_events(full))
        return True

    def _reply(
        self, body: Mapping[str, Any], script: Script | None, turn: Turn | None, recorded: RecordedRequest
    ) -> tuple[list[dict[str, Any]], str | None]:
        """The content blocks answering a request, or a text replacing them (a side answer, a script failure)."""
        if recorded.kind == "side":
            return [], side_answer(body)
        if recorded.kind == "compact":
            return [], compaction_summary(script.name if script else "(none)", turn_index(body))
        if script is None:
            return [], "SCRIPT FAILURE: this request names no script (x-gt-model-script header, key, or marker)"
        index = recorded.turn or 0
        if turn is None:
            self._fail(f"{script.name}: asked for turn {index} but the script has {len(script.turns)} turns")
            return [], f"SCRIPT FAILURE: script {script.name} has no turn {index}"
        failures = check_results(script, index, body) + check_prompt(turn, body, index)
        if failures:
            for failure in failures:
                self._fail(f"{script.name}: {failure}")
            return [], "SCRIPT FAILURE: " + "; ".join(failures)
        return wire.content_blocks(turn, script.name, index), None

    async def _fault(self, writer: asyncio.StreamWriter, fault: Fault, answer: SentAnswer, stream: bool) -> bool:
        if fault.kind in _FAULT_STATUS:
            answer.status = _FAULT_STATUS[fault.kind]
            extra = {"retry-after": str(fault.retry_after_s)} if fault.kind == "rate_limited" else {}
            await _send_json(writer, answer.status, wire.error_body(answer.status, f"scripted {fault.kind}"), extra)
            return True
        answer.status = 0
        if fault.kind == "stall":
            self.stalled += 1
            try:
                await self._release.wait()
            finally:
                self.stalled -= 1
            return False
        # drop: half an answer, then the connection goes away without finishing the body.
        if stream:
            head = wire.stream_events(wire.message("msg_dropped", answer.model, [{"type": "text", "text": "..."}], {}))
            await _send_stream(writer, head[:3], finish=False)
        writer.transport.abort()
        return False


async def _read_request(reader: asyncio.StreamReader) -> _Http | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            body += await reader.readexactly(size)
            await reader.readexactly(2)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return _Http(method=method, path=path, headers=headers, body=body)


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _send_json(
    writer: asyncio.StreamWriter,
    status: int,
    payload: Any,
    extra: Mapping[str, str] | None = None,
    *,
    head_only: bool = False,
) -> None:
    """A JSON answer (``head_only``: its head alone, as a HEAD request is answered)."""
    data = json.dumps(payload).encode()
    headers = {"content-type": "application/json", "content-length": str(len(data)), "request-id": "req_scripted"}
    writer.write(_head(status, {**headers, **(extra or {})}) + (b"" if head_only else data))
    await writer.drain()


async def _send_stream(
    writer: asyncio.StreamWriter, events: list[tuple[str, dict[str, Any]]], *, finish: bool = True
) -> None:
    writer.write(
        _head(
            200,
            {
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                "transfer-encoding": "chunked",
                "request-id": "req_scripted",
            },
        )
    )
    for event, data in events:
        chunk = wire.encode_event(event, data)
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()
    if finish:
        writer.write(b"0\r\n\r\n")
        await writer.drain()
