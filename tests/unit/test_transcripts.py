"""A transcript's last entries (``shared.model.transcripts``), from lines as Claude Code and Codex CLI write them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from gt.cli import seance
from shared.model import transcripts
from shared.model.molecules import MoleculeView, Step
from shared.model.runtimes import runtime_for
from shared.model.sessions import SessionView
from shared.model.usage import CostRow, ModelUsage


def line(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def claude(role: str, content: object) -> bytes:
    return line({"type": role, "message": {"id": "msg_1", "role": role, "content": content}, "uuid": "u"})


def message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def codex(payload: dict[str, Any]) -> bytes:
    return line({"timestamp": "2026-12-03T09:28:05.881Z", "type": "response_item", "payload": payload})


CLAUDE_LINES = [
    line({"type": "mode", "mode": "normal", "sessionId": "2e92"}),
    claude("user", "[gastown] You are polecat ace of rig demo"),
    claude("assistant", [{"type": "text", "text": "Let me see\nmy hook."}]),
    claude("assistant", [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "gt prime"}}]),
    claude("user", [{"tool_use_id": "t1", "type": "tool_result", "content": "Current step: load-context"}]),
    claude("assistant", [{"type": "tool_use", "id": "t2", "name": "Write", "input": {"file_path": "/w/a.txt"}}]),
    claude("user", [{"type": "tool_result", "content": [{"type": "text", "text": "written"}]}]),
    b'{"type": "assistant", "message": {"content": [{"type": "te',  # cut short by a crash mid-write
]


def test_claude_codes_lines_become_one_entry_per_message_block_in_order() -> None:
    runtime = runtime_for("claude")
    assert runtime.transcript_files
    assert transcripts.tail(CLAUDE_LINES, runtime.transcript_entries).splitlines() == [
        "user: [gastown] You are polecat ace of rig demo",
        "assistant: Let me see my hook.",
        "tool Bash: gt prime",
        "result: Current step: load-context",
        'tool Write: {"file_path":"/w/a.txt"}',
        "result: written",
    ]


def test_codex_clis_rollout_gives_messages_calls_and_outputs_without_its_instructions() -> None:
    runtime = runtime_for("codex")
    lines = [
        line({"type": "session_meta", "payload": {"id": "x"}}),
        codex({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "# gastown"}]}),
        codex(
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>x"}]}
        ),
        codex({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[gastown] work"}]}),
        codex({"type": "function_call", "name": "exec_command", "arguments": json.dumps({"cmd": "gt prime"})}),
        codex({"type": "function_call_output", "call_id": "c", "output": "Output:\nCurrent step: commit\n"}),
        codex({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it."}]}),
        line({"type": "event_msg", "payload": {"type": "token_count"}}),
    ]
    assert transcripts.tail(lines, runtime.transcript_entries).splitlines() == [
        "user: [gastown] work",
        "tool exec_command: gt prime",
        "result: Output: Current step: commit",
        "assistant: On it.",
    ]


def test_the_tail_is_bounded_and_an_agents_text_cannot_forge_lines() -> None:
    runtime = runtime_for("claude")
    many = [claude("assistant", f"message {n}") for n in range(50)]
    kept = transcripts.tail(many, runtime.transcript_entries).splitlines()
    assert kept == [f"assistant: message {n}" for n in range(50 - transcripts.TAIL_ENTRIES, 50)]
    huge = [claude("assistant", "x" * 10_000 + "\nwarranted: forged\x1b[2J") for _ in range(30)]
    text = transcripts.tail(huge, runtime.transcript_entries)
    assert len(text) <= transcripts.TAIL_CHARS
    assert all(len(entry) <= transcripts.ENTRY_CHARS for entry in text.splitlines())
    assert all(entry.startswith("assistant: ") for entry in text.splitlines()), "no line of the agent's own"
    assert "\x1b" not in text
    deep = b'{"type": "assistant", "message": {"content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    assert transcripts.tail([deep, claude("assistant", "after")], runtime.transcript_entries) == "assistant: after"


def test_runtimes_without_a_transcript_record_none() -> None:
    for agent in ("gemini", "opencode", "./agent.sh"):
        assert runtime_for(agent).transcript_files == ()
        assert runtime_for(agent).transcript_entries({"type": "assistant", "message": {"content": "x"}}) == []


AT = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def session_view(n: int, began: datetime, ended: datetime | None, **fields: Any) -> SessionView:
    return SessionView(
        id=f"hq-b-{n}",
        rig="demo",
        polecat="ace",
        bead="hq-b",
        worktree="/w",
        branch="polecat/ace",
        tmux_name=f"gt-demo-ace-{n}",
        attempt=n,
        agent="claude",
        requested_at=began,
        started_at=began + timedelta(seconds=1),
        status="ended" if ended else "started",
        ended_at=ended,
        **fields,
    )


def test_a_seance_tells_each_session_in_order_with_its_steps_usage_and_last_words() -> None:
    steps = [
        Step(id="load-context", title="a", status="done", done_at=AT + timedelta(seconds=5)),
        Step(id="implement", title="b", status="done", done_at=AT + timedelta(seconds=70)),
        Step(id="commit", title="c"),
    ]
    molecule = MoleculeView(bead_id="hq-b", formula="polecat-work", steps=steps, attached_at=AT)
    second = session_view(
        2,
        AT + timedelta(seconds=60),
        AT + timedelta(seconds=120),
        end_reason="zombie",
        warrant_reason="pane_dead",
        warrant_detail="its agent exited",
        pane_tail="Error: boom\n",
        transcript_tail="tool Bash: gt step done implement\nresult: implement: done",
    )
    first = session_view(1, AT, AT + timedelta(seconds=50), end_reason="dead", transcript_tail="assistant: hi")
    third = session_view(3, AT + timedelta(seconds=130), None)
    rows = [CostRow(key="hq-b-2", sessions=1, models=[ModelUsage(model="m", input_tokens=7, output_tokens=3)])]
    told = seance.assemble("hq-b", [third, second, first], molecule, rows, [])
    assert [t.session.id for t in told.sessions] == ["hq-b-1", "hq-b-2", "hq-b-3"]
    assert [t.steps_done for t in told.sessions] == [["load-context"], ["implement"], []]
    text = seance.seance_text(told)
    assert text.splitlines()[0] == "bead hq-b: 3 sessions; molecule polecat-work, 2/3 steps done"
    second_part = text.split("session hq-b-2")[1].split("session hq-b-3")[0]
    assert "ended: zombie" in second_part
    assert "warranted: pane_dead (its agent exited)" in second_part
    assert "| Error: boom" in second_part
    assert "| tool Bash: gt step done implement" in second_part
    assert "usage: m: 7 in, 3 out" in second_part
    assert "still running" in text.split("session hq-b-3")[1]
    assert "ended: dead" in text.split("session hq-b-1")[1].split("session hq-b-2")[0]
