"""The scripted model server: the model APIs of every agent runtime over HTTP/1.1 on a loopback port, served by
aiohttp.

Routes (``dialects``): Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), OpenAI's
Responses and Chat Completions APIs (``POST /v1/responses``, ``/v1/chat/completions``), Gemini's
(``POST /v1beta/models/<model>:generateContent``, ``:streamGenerateContent``, ``:countTokens``); each answered as
JSON, or as server-sent events when the request streams (chunked, so that a dropped connection is a visible error
to the client); anything else is recorded and answered 404 in an API's error shape. Connections are kept alive as
HTTP/1.1 clients expect. aiohttp's low-level server: one handler, ``_handle``, routes.

A request belongs to a session's script by (first match): the ``x-gt-model-script`` header, a
``[model-script:<name>]`` marker in the system prompt or a user message before the first answer, the API key
(``x-api-key``, ``x-goog-api-key``, a bearer token, a ``key`` query parameter) registered for a script, else the
default script. Requests without tools are side requests (titles, summaries, Gemini CLI's model routing, quota
checks): answered with a short text (or the JSON they ask for), recorded, never consuming a turn. The script's tool
uses are sent in the tools the request offers (``tools``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import structlog
from aiohttp import web

from gt.model_server import dialects, tokens
from gt.model_server.asked import Asked, Reply
from gt.model_server.script import (
    Fault,
    Script,
    Turn,
    check_prompt,
    check_results,
    compaction_summary,
    fault_for,
    script_name,
    side_answer,
)
from gt.model_server.script import reply as reply_for
from gt.model_server.tokens import estimate_tokens
from gt.model_server.turns import digest
from shared.host import http_server

log = structlog.get_logger(__name__)

NAMING = "an x-gt-model-script header, a [model-script:<name>] marker, or a key registered for one"
SECRET_HEADERS = frozenset({"x-api-key", "x-goog-api-key", "authorization"})
MAX_HEADER_BYTES = 64 * 1024
"""The longest request line or header accepted (aiohttp's default is 8 KiB)."""
SHUTDOWN_S = 5.0
"""How long ``close`` lets an answer being streamed finish."""
HEALTH_PATHS = frozenset({"/", "/api/hello"})
"""Answered 200: Claude Code's connectivity check (``HEAD /api/hello``) when non-essential traffic is on."""
_STATUS_TEXT = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 429: "Too Many Requests"}


class RecordedRequest(msgspec.Struct, kw_only=True):
    """A request as it arrived (its key headers left out), and how it was classified."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    script: str | None = None
    kind: str = "other"
    """turn, side, compact, count_tokens or other."""
    dialect: str = ""
    """The model API it was in (``dialects``); empty for other routes."""
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
    dialect: str = ""
    usage: dict[str, int] | None = None
    fault: str | None = None


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
        self._runner: web.ServerRunner | None = None
        self._port: int | None = None

    # --- life cycle --------------------------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> ModelServer:
        server = web.Server(
            self._handle,
            access_log=None,
            logger=http_server.SERVER_LOG,
            max_line_size=MAX_HEADER_BYTES,
            max_field_size=MAX_HEADER_BYTES,
        )
        self._runner = web.ServerRunner(server, shutdown_timeout=SHUTDOWN_S)
        self._port = await http_server.start(self._runner, host, port)
        return self

    @property
    def port(self) -> int:
        assert self._port is not None, "the model server is not started"
        return self._port

    @property
    def base_url(self) -> str:
        """What ``ANTHROPIC_BASE_URL`` is set to."""
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        self._release.set()  # stalled requests are dropped
        if self._runner is not None:
            await self._runner.cleanup()

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

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        raw = await request.content.read()  # to its end, however long the conversation (no size limit here)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"unparsed": raw.decode(errors="replace")}
        if not isinstance(body, dict):
            body = {"unparsed": body}
        headers = {name.lower(): value for name, value in request.headers.items()}
        recorded = RecordedRequest(
            method=request.method,
            path=request.raw_path,
            headers={name: value for name, value in headers.items() if name not in SECRET_HEADERS},
            body=body,
            received_at=time.time(),
        )
        self.requests.append(recorded)
        path = request.raw_path.split("?", 1)[0]
        if request.method in ("GET", "HEAD") and path in HEALTH_PATHS:
            return _json(200, {})  # aiohttp sends a HEAD answer's head alone
        dialect = dialects.dialect_for(path) if request.method == "POST" else None
        count = dialects.counting(path) if request.method == "POST" else None
        if count is not None:
            recorded.kind = "count_tokens"
            self.answers.append(SentAnswer(script=None, kind="count_tokens", turn=None, status=200, stream=False))
            return _json(200, count(body))
        if dialect is None:
            return _json(404, dialects.unrouted_error(path)(404, f"no route {request.method} {path}"))
        asked = dialect.read(path, body)
        script = self._script_for(headers, request.query.get("key", ""), asked)
        recorded.script = script.name if script else None
        recorded.dialect = dialect.name
        recorded.kind = "side" if asked.side else "compact" if asked.compaction else "turn"
        recorded.turn = asked.turn if recorded.kind == "turn" else None
        return await self._answer(request, dialect, asked, script, recorded)

    def _script_for(self, headers: Mapping[str, str], query_key: str, asked: Asked) -> Script | None:
        name = script_name(headers, asked)
        if name is None:
            key = (
                headers.get("x-api-key")
                or headers.get("x-goog-api-key")
                or headers.get("authorization", "").removeprefix("Bearer ").strip()
                or query_key
            )
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

    async def _answer(
        self,
        request: web.BaseRequest,
        dialect: dialects.Dialect,
        asked: Asked,
        script: Script | None,
        recorded: RecordedRequest,
    ) -> web.StreamResponse:
        model = asked.model or (script.model if script else None) or "scripted"
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
            script=recorded.script,
            kind=recorded.kind,
            turn=recorded.turn,
            status=200,
            stream=asked.stream,
            model=model,
            dialect=dialect.name,
        )
        self.answers.append(answer)
        if fault is not None:
            answer.fault = fault.kind
            return await self._fault(request, dialect, fault, answer)
        reply, scripted = self._reply(dialect, asked, script, turn, recorded)
        total = estimate_tokens(asked.size)
        cache = asked.cache and recorded.kind in ("turn", "compact")
        cached_before = self._cached.get(recorded.script or "", 0) if cache else 0
        if cache:
            self._cached[recorded.script or ""] = max(cached_before, total)
        if scripted and turn is not None and turn.context_tokens is not None:
            total = max(total, turn.context_tokens)  # as if the conversation were that long (not cached for later)
        usage = tokens.usage(total, cached_before, estimate_tokens(msgspec.to_builtins(reply)), cache=cache)
        answer.usage = usage
        answer_id = digest(recorded.script, recorded.kind, recorded.turn, attempt)
        if not asked.stream:
            return _json(200, dialect.answer(reply, model=model, usage=usage, answer_id=answer_id))
        return await _stream(request, dialect.stream(reply, model=model, usage=usage, answer_id=answer_id))

    def _reply(
        self,
        dialect: dialects.Dialect,
        asked: Asked,
        script: Script | None,
        turn: Turn | None,
        recorded: RecordedRequest,
    ) -> tuple[Reply, bool]:
        """The answer to a request, and whether it is the script's turn (not a side answer, a summary, or the
        text of a script failure)."""
        if recorded.kind == "side":
            return Reply(text=side_answer(asked)), False
        if recorded.kind == "compact":
            return Reply(text=compaction_summary(script.name if script else "(none)", asked.turn)), False
        if script is None:
            return Reply(text=f"SCRIPT FAILURE: this request names no script ({NAMING})"), False
        index = recorded.turn or 0
        if turn is None:
            self._fail(f"{script.name}: asked for turn {index} but the script has {len(script.turns)} turns")
            return Reply(text=f"SCRIPT FAILURE: script {script.name} has no turn {index}"), False
        failures = check_results(script, index, asked, dialect.id_prefix) + check_prompt(turn, asked, index)
        if failures:
            for failure in failures:
                self._fail(f"{script.name}: {failure}")
            return Reply(text="SCRIPT FAILURE: " + "; ".join(failures)), False
        return reply_for(script, index, asked.tools, dialect.id_prefix), True

    async def _fault(
        self, request: web.BaseRequest, dialect: dialects.Dialect, fault: Fault, answer: SentAnswer
    ) -> web.StreamResponse:
        status = {"rate_limited": 429, "overloaded": dialect.overloaded, "unauthorized": 401}.get(fault.kind)
        if status is not None:
            answer.status = status
            extra = {"retry-after": str(fault.retry_after_s)} if fault.kind == "rate_limited" else {}
            return _json(status, dialect.error(status, f"scripted {fault.kind}"), extra)
        answer.status = 0
        if fault.kind == "stall":
            self.stalled += 1
            try:
                await self._release.wait()
            finally:
                self.stalled -= 1
            return _dropped(request)
        # drop: half an answer, then the connection goes away without finishing the body.
        if answer.stream:
            return _dropped(request, await _stream(request, dialect.dropped_head(answer.model), finish=False))
        return _dropped(request)


def _json(status: int, payload: Any, extra: Mapping[str, str] | None = None) -> web.Response:
    """A JSON answer (to a HEAD request, aiohttp sends its head alone)."""
    headers = {"content-type": "application/json", "request-id": "req_scripted", **(extra or {})}
    return web.Response(
        status=status, reason=_STATUS_TEXT.get(status, "Error"), body=json.dumps(payload).encode(), headers=headers
    )


async def _stream(request: web.BaseRequest, records: list[bytes], *, finish: bool = True) -> web.StreamResponse:
    """Server-sent events, each in a chunk of its own as it is written."""
    answer = web.StreamResponse(
        status=200,
        reason="OK",
        headers={
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "request-id": "req_scripted",
        },
    )
    answer.enable_chunked_encoding()
    await answer.prepare(request)
    for record in records:
        await answer.write(record)
    if finish:
        await answer.write_eof()
    return answer


def _dropped(request: web.BaseRequest, answer: web.StreamResponse | None = None) -> web.StreamResponse:
    """The connection closed under the request (its answer, if begun, unfinished): the client sees a network
    error. aiohttp's attempt to finish the answer then meets a closed connection, which it expects."""
    if request.transport is not None:
        request.transport.abort()
    return answer if answer is not None else web.Response(status=500)
