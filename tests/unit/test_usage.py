"""Token usage: Claude Code's transcript parsed (lines captured from a real ``claude -p`` run against the scripted
model server, in tests/fixtures/claude_transcript.jsonl), usage totals folded per bead, rig, convoy and day, and
the price table applied."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gt.cli import town_view
from gt.cli.costs import load_prices, money, priced
from gt.dashboard import view
from gt.narration import describe
from services.mayor.projection import fold_usage
from services.mayor.queries.costs import costs
from services.mayor.state import UsageBook
from shared.core.errors import QueryError
from shared.model.events import SessionRequested, encode_event
from shared.model.events.usage import SessionUsage
from shared.model.usage import CostRow, ModelPrice, ModelUsage, Transcript, cost, parse_line, parse_prices, price_of

FIXTURE = Path(__file__).parent.parent / "fixtures" / "claude_transcript.jsonl"
MODEL = "claude-opus-5-5"


def _fixture() -> bytes:
    return FIXTURE.read_bytes()


def _claude_code_own_totals() -> dict[str, int]:
    """Claude Code's own sum of the same conversation (its ``cost-state`` line), to check ours against."""
    for line in _fixture().splitlines():
        record = json.loads(line)
        if record.get("type") == "cost-state":
            usage: dict[str, int] = record["modelUsage"][MODEL]
            return usage
    raise AssertionError("the fixture has no cost-state line")


def test_a_real_transcript_counts_each_assistant_message_once_and_matches_claude_codes_own_sum() -> None:
    transcript = Transcript()
    transcript.feed("t.jsonl", _fixture())
    [usage] = transcript.snapshot()
    own = _claude_code_own_totals()
    # 4 assistant lines, 3 messages: the first answer (text, then a tool use) is written once per content block.
    assert _fixture().count(b'"type":"assistant"') == 4
    assert usage == ModelUsage(
        model=MODEL,
        input_tokens=own["inputTokens"],
        output_tokens=own["outputTokens"],
        cache_creation_input_tokens=own["cacheCreationInputTokens"],
        cache_read_input_tokens=own["cacheReadInputTokens"],
        messages=3,
    )
    assert usage == ModelUsage(
        model=MODEL,
        input_tokens=9,
        output_tokens=78,
        cache_creation_input_tokens=12683,
        cache_read_input_tokens=25065,
        messages=3,
    )


def test_unreadable_lines_are_skipped_never_raised_on() -> None:
    good = next(line for line in _fixture().splitlines() if b'"type":"assistant"' in line)
    record = json.loads(good)
    no_usage = {**record, "message": {**record["message"], "id": "msg_x", "usage": None}}
    bad_counts = {
        **record,
        "message": {**record["message"], "id": "msg_y", "usage": {"input_tokens": "many", "output_tokens": -4}},
    }
    lines = [
        b"not json at all",
        b'{"type": "assistant", "message": "a string"}',
        b"[1, 2, 3]",
        b"\xff\xfe broken bytes",
        json.dumps(no_usage).encode(),
        json.dumps({**record, "message": {**record["message"], "model": 7}}).encode(),
        good[: len(good) // 2],  # a line cut short by a crash mid-write
        json.dumps(bad_counts).encode(),
        good,
        good,
    ]
    assert [parse_line(line) for line in lines[:7]] == [None] * 7
    parsed = parse_line(json.dumps(bad_counts))
    assert parsed is not None
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (0, 0), "counts it cannot read are 0"
    transcript = Transcript()
    transcript.feed("t.jsonl", b"\n".join(lines) + b"\n")
    [usage] = transcript.snapshot()
    assert usage.messages == 2  # the good message once, the bad counts as zeros
    assert usage.cache_creation_input_tokens == json.loads(good)["message"]["usage"]["cache_creation_input_tokens"]


def test_fed_in_pieces_a_transcript_reaches_the_same_totals_and_a_half_written_line_waits() -> None:
    data = _fixture()
    whole = Transcript()
    whole.feed("t.jsonl", data)
    pieces = Transcript()
    for cut in range(997, len(data), 997):  # a file read while it grows, cutting lines anywhere
        pieces.feed("t.jsonl", data[pieces.offsets.get("t.jsonl", 0) : cut])
        assert data[: pieces.offsets["t.jsonl"]].endswith(b"\n") or pieces.offsets["t.jsonl"] == 0
    pieces.feed("t.jsonl", data[pieces.offsets["t.jsonl"] :])
    assert pieces.snapshot() == whole.snapshot()
    assert pieces.offsets["t.jsonl"] == len(data)


def _event(session: str, bead: str, rig: str = "demo", *, tokens: int, final: bool = False) -> SessionUsage:
    usage = ModelUsage(model=MODEL, input_tokens=tokens, output_tokens=tokens * 2, messages=tokens)
    return SessionUsage(session_id=session, rig=rig, bead=bead, models=(usage,), final=final)


def cost_rows(*rows: dict[str, Any]) -> list[CostRow]:
    """``gt.q.mayor.costs`` rows as the mayor's answer carries them."""
    return msgspec.convert(rows, list[CostRow])


def test_the_fold_keeps_running_totals_so_a_repeated_event_counts_once() -> None:
    book = UsageBook()
    day1 = datetime(2026, 11, 24, 23, 59, tzinfo=UTC)
    day2 = datetime(2026, 11, 25, 0, 1, tzinfo=UTC)
    fold_usage(book, _event("s1", "gt-a", tokens=10), day1)
    fold_usage(book, _event("s1", "gt-a", tokens=10), day1)  # a witness restart recorded the same totals again
    fold_usage(book, _event("s1", "gt-a", tokens=30, final=True), day2)
    fold_usage(book, _event("s2", "gt-b", "other", tokens=5), day2)
    by_bead = {r.key: r for r in costs(book, "bead", {})}
    assert by_bead["gt-a"].models[0].input_tokens == 30
    assert by_bead["gt-a"].models[0].output_tokens == 60
    assert by_bead["gt-b"].models[0].input_tokens == 5
    by_day = {r.key: r.models[0].input_tokens for r in costs(book, "day", {})}
    assert by_day == {"2026-11-24": 10, "2026-11-25": 25}
    by_rig = {r.key: r.models[0].input_tokens for r in costs(book, "rig", {})}
    assert by_rig == {"demo": 30, "other": 5}
    by_convoy = {r.key: r.models[0].input_tokens for r in costs(book, "convoy", {"gt-a": ["hq-c1"]})}
    assert by_convoy == {"hq-c1": 30, "(none)": 5}
    with pytest.raises(QueryError, match="`by` must be one of"):
        costs(book, "week", {})


def test_prices_give_money_only_for_priced_models() -> None:
    prices = parse_prices(
        '{"claude-opus-4-5": {"input": 5, "output": 25}, "claude-haiku-4-5": {"input": 1, '
        '"output": 5, "cache_write": 1.25, "cache_read": 0.1}}'
    )
    usage = ModelUsage(
        model="claude-opus-4-5-20251101",
        input_tokens=1_000_000,
        output_tokens=1_000_000,
        cache_creation_input_tokens=1_000_000,
        cache_read_input_tokens=1_000_000,
    )
    assert price_of("claude-opus-4-5-20251101", prices) == ModelPrice(input=5, output=25)
    assert cost(usage, prices) == pytest.approx(5 + 25 + 6.25 + 0.5)
    assert cost(ModelUsage(model="claude-scripted-model", input_tokens=10), prices) is None
    rows = cost_rows(
        {"key": "gt-a", "sessions": 1, "models": [{"model": "claude-haiku-4-5", "output_tokens": 2_000_000}]},
        {"key": "gt-b", "sessions": 1, "models": [{"model": "mystery", "input_tokens": 7}]},
    )
    shown = priced(rows, prices)
    assert [r.cost_usd for r in shown.rows] == [pytest.approx(10.0), None]
    assert shown.total.tokens == 2_000_007
    assert shown.total.cost_usd == pytest.approx(10.0)
    assert shown.total.priced is False
    with pytest.raises(ValueError, match="GT_MODEL_PRICES must map"):
        parse_prices('{"claude-opus-4-5": {"input": "cheap"}}')


def test_the_price_table_comes_from_json_text_or_a_file(tmp_path: Path) -> None:
    table = '{"claude-sonnet-4-5": {"input": 3, "output": 15}}'
    assert load_prices({"GT_MODEL_PRICES": table}) == {"claude-sonnet-4-5": ModelPrice(input=3, output=15)}
    path = tmp_path / "prices.json"
    path.write_text(table)
    assert load_prices({"GT_MODEL_PRICES": str(path)}) == load_prices({"GT_MODEL_PRICES": table})
    assert load_prices({}) == {}


def test_usage_events_are_narrated() -> None:
    event = _event("s1", "gt-a", tokens=10, final=True)
    text, _ = describe(event.TYPE, msgspec.to_builtins(event))
    assert text == f"session s1 has used 30 tokens of {MODEL} on bead gt-a (final)"


def test_the_dashboard_shows_each_sessions_tokens() -> None:
    state = view.DashboardState()
    at = datetime(2026, 11, 25, tzinfo=UTC)
    requested = SessionRequested(
        session_id="s1", rig="demo", polecat="ace", bead="gt-a", worktree="/w", branch="b", tmux_name="t", attempt=1
    )
    for seq, event in enumerate((requested, _event("s1", "gt-a", tokens=10), _event("s1", "gt-a", tokens=20)), 1):
        view.apply(state, seq, encode_event(event, event_id=f"ev-{seq}", ts=at, actor="witness"))
    [shown] = view.render(state)["polecats"]["active"]
    assert shown["tokens"] == 60, "the newest totals, not their sum"


def test_gt_status_shows_each_rigs_tokens_and_cost_where_priced() -> None:
    rows = cost_rows(
        {"key": "demo", "sessions": 2, "models": [{"model": "claude-opus-4-5", "output_tokens": 400_000}]},
        {"key": "web", "sessions": 1, "models": [{"model": "unpriced", "input_tokens": 7}]},
    )
    priced_rows = {r.key: r for r in priced(rows, parse_prices('{"claude-opus-4-5": {"input": 5, "output": 25}}')).rows}
    snap = town_view.snapshot(
        now=datetime(2026, 11, 25, tzinfo=UTC),
        stream_last_seq=1,
        statuses={},
        rigs=[
            {"name": "demo", "max_polecats": 2},
            {"name": "web", "max_polecats": 1},
            {"name": "idle", "max_polecats": 1},
        ],
        sessions=[],
        heartbeats={},
        steps={},
        mrs=[],
        convoys=[],
        escalations=[],
        costs=priced_rows,
    )
    table = town_view.render(snap).split("Rigs\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split() for line in table] == [
        ["RIG", "POLECATS", "WAITING", "TOKENS", "COST"],
        ["demo", "0/2", "0", "400000", "$10.00"],
        ["idle", "0/1", "0", "0", "-"],
        ["web", "0/1", "0", "7", "-"],
    ]


def test_a_bead_that_used_no_tokens_costs_nothing_and_leaves_the_total_fully_priced() -> None:
    prices = parse_prices('{"claude-opus-4-5": {"input": 5, "output": 25}}')
    rows = cost_rows(
        {"key": "gt-a", "sessions": 1, "models": [{"model": "claude-opus-4-5", "output_tokens": 40_000}]},
        {"key": "gt-b", "sessions": 1, "models": [{"model": "<synthetic>"}]},
        {"key": "gt-c", "sessions": 1, "models": []},
    )
    shown = priced(rows, prices)
    assert [(r.cost_usd, r.priced) for r in shown.rows] == [
        (pytest.approx(1.0), True),
        (0.0, True),
        (0.0, True),
    ]
    assert [money(r) for r in shown.rows] == ["$1.0000", "$0.0000", "$0.0000"]
    assert money(shown.total) == "$1.0000", "no `+`: nothing that used tokens is unpriced"
    unpriced = priced(rows, {})
    assert {money(r) for r in [*unpriced.rows, unpriced.total]} == {"-"}, "no price table: no dollars"
