"""Context pressure: how full a session's conversation is, read from its runtime's usage files, and the plan's one
nudge per share of the window passed (``GT_CONTEXT_HANDOFF``) that tells it to hand off."""

from __future__ import annotations

import json
from datetime import timedelta

import msgspec
import pytest

from services.witness.effects.nudge import shows
from services.witness.plan import Policy, plan
from services.witness.plan.actions import WarnContext
from services.witness.settings import DEFAULT_CONTEXT_HANDOFF, context_shares, load
from services.witness.state import Nudge, UsageMark, WitnessState, context_nudge_id
from shared.model.runtimes import CONTEXT_PROMPT, RUNTIMES
from shared.model.usage import CodexRollouts, ContextUse, GeminiChats, OpenCodeUsage, Transcript
from tests.unit.test_runtimes import NOW, _observe, _town

POLICY = Policy(rigs_root="/gt/rigs", context_handoff_at=(0.6, 0.8))


def _using(tokens: int, window: int = 200_000, *, final: bool = False) -> WitnessState:
    state = _town("claude")
    usage = UsageMark(version=3, context_tokens=tokens, context_window=window, final=final)
    return msgspec.structs.replace(state, usage={"b1-1": usage})


def _told(state: WitnessState, share: float) -> WitnessState:
    nudge = Nudge(
        id=context_nudge_id("b1-1", share),
        rig="demo",
        polecat="ace",
        session="b1-1",
        message="hand off",
        queued_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        status="delivered",
        version=9,
    )
    return msgspec.structs.replace(state, nudges={nudge.id: nudge})


def test_a_session_is_told_to_hand_off_once_per_share_of_its_window_it_passes() -> None:
    obs = _observe(30, frozenset({"b1-1"}))
    assert plan(_using(100_000), obs, POLICY) == []
    assert plan(_using(125_000), obs, POLICY) == [WarnContext(session="b1-1", share=0.6, used=62)]
    assert plan(_told(_using(150_000), 0.6), obs, POLICY) == [], "told at 60%: nothing new below 80%"
    assert plan(_told(_using(170_000), 0.6), obs, POLICY) == [WarnContext(session="b1-1", share=0.8, used=85)]
    assert plan(_using(170_000), obs, POLICY) == [WarnContext(session="b1-1", share=0.8, used=85)], "once, the highest"
    assert plan(_told(_using(190_000), 0.8), obs, POLICY) == [], "told at 80%: once"


def test_no_warning_without_a_window_after_gt_done_for_an_ended_session_or_when_off() -> None:
    obs = _observe(30, frozenset({"b1-1"}))
    assert plan(_using(190_000, window=0), obs, POLICY) == [], "the window is unknown"
    assert plan(_using(190_000, final=True), obs, POLICY) == []
    done = _using(190_000)
    done.sessions["b1-1"] = msgspec.structs.replace(done.sessions["b1-1"], done_intent_at=NOW)
    assert plan(done, obs, POLICY) == [], "handing in its work already"
    assert plan(_using(190_000), obs, Policy(rigs_root="/gt/rigs")) == [], "GT_CONTEXT_HANDOFF=off"


def test_the_warning_names_the_share_used_and_the_way_to_hand_off() -> None:
    text = CONTEXT_PROMPT.format(used=85)
    assert "85% full" in text
    assert "gt handoff" in text
    assert "\n" not in text, "typed into a pane as one line"


def test_gt_context_handoff_takes_shares_or_off_and_refuses_anything_else() -> None:
    assert context_shares(None) == DEFAULT_CONTEXT_HANDOFF == (0.6, 0.8)
    assert context_shares("0.9, 0.5,0.9") == (0.5, 0.9)
    assert context_shares("off") == ()
    assert load({"GT_CONTEXT_HANDOFF": "0.7"}).context_handoff_at == (0.7,)
    for bad in ("80", "0", "1", "half", "0.5,,"):
        with pytest.raises(ValueError, match="GT_CONTEXT_HANDOFF"):
            context_shares(bad)


def test_each_runtimes_reader_says_how_full_its_newest_answers_conversation_was() -> None:
    claude = Transcript()
    for n, (inp, read) in enumerate(((10, 0), (5, 900))):
        usage = {"input_tokens": inp, "cache_read_input_tokens": read, "output_tokens": 3}
        line = {"type": "assistant", "message": {"id": f"m{n}", "model": "claude", "usage": usage}}
        claude.feed("t.jsonl", json.dumps(line).encode() + b"\n")
    assert claude.context() == ContextUse(tokens=905)

    codex = CodexRollouts()
    info = {
        "total_token_usage": {"input_tokens": 1000, "output_tokens": 5},
        "last_token_usage": {"input_tokens": 700, "cached_input_tokens": 600, "output_tokens": 5},
        "model_context_window": 258_400,
    }
    line = {"type": "event_msg", "payload": {"type": "token_count", "info": info}}
    codex.feed("r.jsonl", json.dumps(line).encode() + b"\n")
    assert codex.context() == ContextUse(tokens=700, window=258_400), "its input tokens include the cached"

    gemini = GeminiChats()
    line = {"id": "g1", "type": "gemini", "model": "gemini-3", "tokens": {"input": 4000, "cached": 3000, "output": 9}}
    gemini.feed("c.jsonl", json.dumps(line).encode() + b"\n")
    assert gemini.context() == ContextUse(tokens=4000)

    opencode = OpenCodeUsage()
    line = {"id": "o1", "model": "gpt-5.5", "tokens": {"input": 50, "output": 2, "cache": {"read": 950, "write": 10}}}
    opencode.feed("u.jsonl", json.dumps(line).encode() + b"\n")
    assert opencode.context() == ContextUse(tokens=1010)
    assert OpenCodeUsage().context() is None, "no answer yet"


def test_every_runtime_with_usage_knows_its_window_or_reads_it() -> None:
    windows = {name: factory().context_window for name, factory in RUNTIMES.items() if factory().usage_files}
    assert windows == {"claude": 200_000, "codex": 0, "gemini": 1_048_576, "opencode": 200_000}


def test_a_long_nudge_wrapped_inside_an_input_box_is_seen_as_typed_not_typed_again() -> None:
    text = CONTEXT_PROMPT.format(used=81)
    box = "\n".join(f"│ {'> ' if n == 0 else '  '}{text[n : n + 70]:<70} │" for n in range(0, len(text), 70))
    screen = f"╭{'─' * 74}╮\n{box}\n╰{'─' * 74}╯\n  esc to cancel"
    assert shows(screen, text[-60:])
    assert not shows(screen, "Your context is 80% full")
