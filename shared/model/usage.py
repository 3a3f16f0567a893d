"""Token usage and its cost: Claude Code's transcripts and Codex CLI's rollouts read, usage totals folded, prices
applied. Pure: no I/O
(the witness's ``usage_watch`` reads the files, the CLI reads the price table's file).

Claude Code writes one JSONL transcript per conversation under its config home
(``<CLAUDE_CONFIG_DIR>/projects/<cwd slug>/<conversation id>.jsonl``). An assistant message is a line
``{"type": "assistant", "requestId": ..., "message": {"id": "msg_...", "model": ..., "usage": {...}}}``; a message
whose answer had several content blocks (text, then a tool use) is written once per block with the same
``message.id`` and the same usage, so a message counts once, by its id. Everything else (user lines, attachments,
``cost-state``, lines cut short by a crash mid-write) is skipped, never raised on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from shared.core.decoding import UNDECODABLE

COST_GROUPINGS = ("bead", "rig", "convoy", "day", "session")
"""What ``gt costs --by`` groups usage by."""
TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


class ModelUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens one model used (summed over messages)."""

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    messages: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


class ContextUse(msgspec.Struct, frozen=True, kw_only=True):
    """How full an agent's conversation is: the tokens its newest answer's request carried (input, cache reads and
    writes: the whole conversation the model read), and the model's context window when the runtime reports it (0:
    it does not; the runtime's default is used)."""

    tokens: int
    window: int = 0


def context_of(usage: ModelUsage) -> int:
    """The conversation one answer's request carried: everything it sent the model, cached or not."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


class CostRow(msgspec.Struct, kw_only=True):
    """One group of ``gt.q.mayor.costs`` (a bead, rig, convoy, day or session): its sessions and what each model
    used."""

    key: str
    sessions: int
    """Sessions counted (0 for a day: a day's usage is counted from events, not sessions)."""
    models: list[ModelUsage] = []


class MessageUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One assistant message of a transcript: its id (the de-duplication key), model and usage."""

    id: str
    usage: ModelUsage


def _count(usage: Mapping[str, Any], name: str) -> int:
    value = usage.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_line(line: str | bytes) -> MessageUsage | None:
    """The assistant message a transcript line holds with its usage, or None (not one, or unreadable)."""
    try:
        record = json.loads(line)
    except UNDECODABLE:  # an agent's transcript: a line nested deep enough to exhaust the stack included
        return None
    if not isinstance(record, dict) or record.get("type") != "assistant":
        return None
    message = record.get("message")
    if not isinstance(message, dict):
        return None
    usage = message.get("usage")
    model = message.get("model")
    if not isinstance(usage, dict) or not isinstance(model, str) or not model:
        return None
    key = message.get("id") or record.get("requestId") or record.get("uuid")
    if not isinstance(key, str) or not key:
        return None
    counts = {name: _count(usage, name) for name in TOKEN_FIELDS}
    return MessageUsage(id=key, usage=ModelUsage(model=model, messages=1, **counts))


def add(a: ModelUsage, b: ModelUsage) -> ModelUsage:
    return ModelUsage(
        model=a.model,
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cache_creation_input_tokens=a.cache_creation_input_tokens + b.cache_creation_input_tokens,
        cache_read_input_tokens=a.cache_read_input_tokens + b.cache_read_input_tokens,
        messages=a.messages + b.messages,
    )


def subtract(a: ModelUsage, b: ModelUsage) -> ModelUsage:
    return ModelUsage(
        model=a.model,
        input_tokens=a.input_tokens - b.input_tokens,
        output_tokens=a.output_tokens - b.output_tokens,
        cache_creation_input_tokens=a.cache_creation_input_tokens - b.cache_creation_input_tokens,
        cache_read_input_tokens=a.cache_read_input_tokens - b.cache_read_input_tokens,
        messages=a.messages - b.messages,
    )


def merge(into: dict[str, ModelUsage], usages: Iterable[ModelUsage]) -> dict[str, ModelUsage]:
    """Adds ``usages`` into ``into`` by model (in place) and returns it."""
    for usage in usages:
        have = into.get(usage.model)
        into[usage.model] = usage if have is None else add(have, usage)
    return into


def difference(new: Iterable[ModelUsage], old: Iterable[ModelUsage]) -> list[ModelUsage]:
    """``new - old`` by model (a session's totals minus its previous totals: what it used in between)."""
    before = {u.model: u for u in old}
    return [subtract(u, before[u.model]) if u.model in before else u for u in new]


class Transcript:
    """A session's transcripts, read incrementally: the offset per file is only a cache (a fresh ``Transcript``
    reads from the start and reaches the same totals), and messages are counted once by id across files and
    re-reads. A line not yet ended by a newline is left for the next read (Claude Code may be mid-write)."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.seen: set[str] = set()
        self.totals: dict[str, ModelUsage] = {}
        self.newest: ContextUse | None = None

    def feed(self, path: str, data: bytes) -> None:
        """``data``: the file's bytes from ``self.offsets[path]`` (0 at first) to its end."""
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            message = parse_line(line)
            if message is None or message.id in self.seen:
                continue
            self.seen.add(message.id)
            merge(self.totals, [message.usage])
            self.newest = ContextUse(tokens=context_of(message.usage))
        self.offsets[path] = self.offsets.get(path, 0) + end

    def snapshot(self) -> tuple[ModelUsage, ...]:
        return tuple(sorted(self.totals.values(), key=lambda u: u.model))

    def context(self) -> ContextUse | None:
        return self.newest


# ---- prices -------------------------------------------------------------------------------------


class ModelPrice(msgspec.Struct, frozen=True, kw_only=True):
    """US dollars per million tokens. Cache prices default from the input price the way Anthropic prices them
    (a 5-minute cache write 1.25x, a cache read 0.1x)."""

    input: float
    output: float
    cache_write: float | None = None
    cache_read: float | None = None


PRICES_ENV = "GT_MODEL_PRICES"
"""The price table: JSON text, or the path of a JSON file (``{"<model>": {"input": 15, "output": 75}, ...}``)."""


def parse_prices(text: str) -> dict[str, ModelPrice]:
    """Raises ValueError naming what is wrong."""
    try:
        return msgspec.json.decode(text, type=dict[str, ModelPrice])
    except msgspec.DecodeError as exc:
        raise ValueError(
            f"{PRICES_ENV} must map model names to {{input, output[, cache_write, cache_read]}} "
            f"in dollars per million tokens: {exc}"
        ) from exc


def price_of(model: str, prices: Mapping[str, ModelPrice]) -> ModelPrice | None:
    """The model's price: an exact name, else the longest name that prefixes it (``claude-sonnet-4-5`` prices
    ``claude-sonnet-4-5-20250929``)."""
    if model in prices:
        return prices[model]
    prefixes = [name for name in prices if model.startswith(name)]
    return prices[max(prefixes, key=len)] if prefixes else None


def cost(usage: ModelUsage, prices: Mapping[str, ModelPrice]) -> float | None:
    """Dollars, or None when the model has no price (no tokens cost nothing, priced or not)."""
    if usage.tokens == 0:
        return 0.0
    price = price_of(usage.model, prices)
    if price is None:
        return None
    write = price.cache_write if price.cache_write is not None else price.input * 1.25
    read = price.cache_read if price.cache_read is not None else price.input * 0.1
    return (
        usage.input_tokens * price.input
        + usage.output_tokens * price.output
        + usage.cache_creation_input_tokens * write
        + usage.cache_read_input_tokens * read
    ) / 1_000_000


def total_cost(usages: Iterable[ModelUsage], prices: Mapping[str, ModelPrice]) -> float | None:
    """The sum over models whose price is known; a model that used no tokens costs $0, and so does a bead that
    used none. None when there are no prices at all, or when every model that used tokens has none."""
    if not prices:
        return None
    used = [u for u in usages if u.tokens]
    costs = [c for u in used if (c := cost(u, prices)) is not None]
    return sum(costs) if costs or not used else None


def priced_fully(usages: Iterable[ModelUsage], prices: Mapping[str, ModelPrice]) -> bool:
    """Every model that used tokens has a price (one that used none needs none)."""
    return all(price_of(u.model, prices) is not None for u in usages if u.tokens)


def _ended_records(data: bytes) -> tuple[list[Any], int]:
    """The JSON records of ``data``'s ended lines (an unreadable one skipped: the agent writes these files) and
    where the ended lines stop: a line not yet ended is left for the next read."""
    end = data.rfind(b"\n") + 1
    records = []
    for line in data[:end].splitlines():
        try:
            records.append(json.loads(line))
        except UNDECODABLE:
            continue
    return records, end


# ---- Codex CLI -----------------------------------------------------------------------------------


def _codex_usage(model: str, totals: Mapping[str, Any]) -> ModelUsage:
    """Codex's TokenUsage {input_tokens (cached included), cached_input_tokens, output_tokens (reasoning
    included), ...} in the four fields every runtime's usage is kept in."""
    cached = _count(totals, "cached_input_tokens")
    return ModelUsage(
        model=model,
        input_tokens=max(0, _count(totals, "input_tokens") - cached),
        cache_read_input_tokens=cached,
        output_tokens=_count(totals, "output_tokens"),
        messages=1,
    )


class CodexRollouts:
    """Codex CLI's rollouts (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``, one per thread), read
    incrementally. Each ``event_msg`` of type ``token_count`` carries the thread's running totals
    (``info.total_token_usage``) and the newest ``turn_context`` names the model: a thread's usage is its newest
    totals, so a re-read or a fresh reader reaches the same sums. A line not yet ended is left for the next read."""

    DEFAULT_MODEL = "codex"

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.models: dict[str, str] = {}
        self.threads: dict[str, Mapping[str, Any]] = {}
        self.answers: dict[str, int] = {}
        self.newest: ContextUse | None = None

    def feed(self, path: str, data: bytes) -> None:
        records, end = _ended_records(data)
        for record in records:
            payload = record.get("payload") if isinstance(record, dict) else None
            if not isinstance(payload, dict):
                continue
            if record.get("type") == "turn_context" and isinstance(payload.get("model"), str):
                self.models[path] = payload["model"]
            elif record.get("type") == "event_msg" and payload.get("type") == "token_count":
                info = payload.get("info")
                totals = info.get("total_token_usage") if isinstance(info, dict) else None
                if isinstance(totals, dict):
                    self.threads[path] = totals
                    self.answers[path] = self.answers.get(path, 0) + 1
                last = info.get("last_token_usage") if isinstance(info, dict) else None
                if isinstance(info, dict) and isinstance(last, dict):  # input_tokens include the cached ones
                    window = _count(info, "model_context_window")
                    self.newest = ContextUse(tokens=_count(last, "input_tokens"), window=window)
        self.offsets[path] = self.offsets.get(path, 0) + end

    def snapshot(self) -> tuple[ModelUsage, ...]:
        totals: dict[str, ModelUsage] = {}
        for path, thread in self.threads.items():
            usage = _codex_usage(self.models.get(path, self.DEFAULT_MODEL), thread)
            merge(totals, [msgspec.structs.replace(usage, messages=self.answers.get(path, 0))])
        return tuple(sorted(totals.values(), key=lambda u: u.model))

    def context(self) -> ContextUse | None:
        return self.newest


# ---- Gemini CLI ----------------------------------------------------------------------------------


class GeminiChats:
    """Gemini CLI's chat records (``$GEMINI_CLI_HOME/.gemini/tmp/<project>/chats/session-*.jsonl``), read
    incrementally: a model message is a record ``{"id", "type": "gemini", "model", "tokens": {input (cached
    included), output, cached, thoughts, tool, total}}``, written again with the same id when it is updated (the
    newest wins). Metadata and ``$set`` lines are skipped. A line not yet ended is left for the next read."""

    DEFAULT_MODEL = "gemini"

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.messages: dict[tuple[str, str], ModelUsage] = {}
        self.newest: ContextUse | None = None

    def feed(self, path: str, data: bytes) -> None:
        records, end = _ended_records(data)
        for record in records:
            if not isinstance(record, dict) or record.get("type") != "gemini":
                continue
            tokens, key = record.get("tokens"), record.get("id")
            if not isinstance(tokens, dict) or not isinstance(key, str):
                continue
            model = record.get("model") if isinstance(record.get("model"), str) and record.get("model") else None
            cached = _count(tokens, "cached")
            self.messages[(path, key)] = usage = ModelUsage(
                model=model or self.DEFAULT_MODEL,
                input_tokens=max(0, _count(tokens, "input") - cached),
                cache_read_input_tokens=cached,
                output_tokens=_count(tokens, "output") + _count(tokens, "thoughts"),
                messages=1,
            )
            self.newest = ContextUse(tokens=context_of(usage))
        self.offsets[path] = self.offsets.get(path, 0) + end

    def snapshot(self) -> tuple[ModelUsage, ...]:
        return tuple(sorted(merge({}, self.messages.values()).values(), key=lambda u: u.model))

    def context(self) -> ContextUse | None:
        return self.newest


# ---- OpenCode ------------------------------------------------------------------------------------


class OpenCodeUsage:
    """OpenCode's answers as its gastown plugin records them (``opencode-usage.jsonl`` in the session's runtime
    dir), read incrementally: a line ``{"id", "model", "provider", "tokens": {input (cache excluded), output,
    reasoning, cache: {read, write}}}`` per update of an assistant message, the newest of an id winning. A line not
    yet ended is left for the next read."""

    DEFAULT_MODEL = "opencode"

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.messages: dict[str, ModelUsage] = {}
        self.newest: ContextUse | None = None

    def feed(self, path: str, data: bytes) -> None:
        records, end = _ended_records(data)
        for record in records:
            if not isinstance(record, dict):
                continue
            tokens, key, model = record.get("tokens"), record.get("id"), record.get("model")
            if not isinstance(tokens, dict) or not isinstance(key, str) or not key:
                continue
            cache = tokens.get("cache")
            cache = cache if isinstance(cache, dict) else {}
            self.messages[key] = usage = ModelUsage(
                model=model if isinstance(model, str) and model else self.DEFAULT_MODEL,
                input_tokens=_count(tokens, "input"),
                output_tokens=_count(tokens, "output") + _count(tokens, "reasoning"),
                cache_read_input_tokens=_count(cache, "read"),
                cache_creation_input_tokens=_count(cache, "write"),
                messages=1,
            )
            self.newest = ContextUse(tokens=context_of(usage))
        self.offsets[path] = self.offsets.get(path, 0) + end

    def snapshot(self) -> tuple[ModelUsage, ...]:
        return tuple(sorted(merge({}, self.messages.values()).values(), key=lambda u: u.model))

    def context(self) -> ContextUse | None:
        return self.newest
