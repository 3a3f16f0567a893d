"""The start hook's fast path (``gt.start_hook``): answered from the witness's file, recorded as the full path
records a start, the answer taken once; anything else left to the full path. Real files in a temporary runtime dir;
no town."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from gt import start_hook
from shared.model import runtimes
from shared.model.runtimes import HOOK_LOG, HOOK_MARK_SESSION_START, START_ANSWER, START_ANSWER_TAKEN

ANSWER = json.dumps({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": "# primed"}})
START = ["agent-hook", "--runtime", "codex", "session-start"]


class Stdin(io.StringIO):
    def isatty(self) -> bool:
        return False


@pytest.fixture
def session_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "session"
    folder.mkdir()
    monkeypatch.setenv(runtimes.SESSION_DIR_ENV, str(folder))
    monkeypatch.setenv("GT_SESSION", "hq-abc-1")
    for name in ("GT_BEAD", "GT_RIG", "GT_POLECAT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("sys.stdin", Stdin(json.dumps({"session_id": "x", "source": "startup"})))
    return folder


def test_a_written_answer_is_printed_recorded_and_taken_once(
    session_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (session_dir / START_ANSWER).write_text(ANSWER)
    assert start_hook.answer(list(START))
    assert capsys.readouterr().out == ANSWER
    [line] = (session_dir / HOOK_LOG).read_text().splitlines()
    assert line.split()[1:] == ["session-start", "startup"]
    assert (session_dir / HOOK_MARK_SESSION_START).read_text().strip() == line.split()[0]
    assert not (session_dir / START_ANSWER).exists(), "taken: a later start asks the town afresh"
    assert (session_dir / START_ANSWER_TAKEN).read_text() == ANSWER, "what the agent was told is kept"
    assert not start_hook.answer(list(START)), "the second start goes the full way"
    assert len((session_dir / HOOK_LOG).read_text().splitlines()) == 1, "the full way records that one"


@pytest.mark.parametrize(
    "argv",
    [
        ["agent-hook", "session-start"],
        ["agent-hook", "session-start", "--runtime", "gemini"],
        ["agent-hook", "--runtime=opencode", "session-start"],
    ],
)
def test_every_spelling_of_the_start_hook_is_answered(session_dir: Path, argv: list[str]) -> None:
    (session_dir / START_ANSWER).write_text(ANSWER)
    assert start_hook.answer(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["agent-hook", "stop"],
        ["agent-hook", "stop-failure"],
        ["agent-hook", "session-start", "--json"],
        ["agent-hook", "--runtime", "codex", "session-start", "extra"],
        ["prime"],
        ["bead", "agent-hook", "session-start"],
    ],
)
def test_any_other_call_goes_the_full_way_and_leaves_the_answer(session_dir: Path, argv: list[str]) -> None:
    (session_dir / START_ANSWER).write_text(ANSWER)
    assert not start_hook.answer(argv)
    assert (session_dir / START_ANSWER).read_text() == ANSWER
    assert not (session_dir / HOOK_LOG).exists(), "nothing recorded: the full way records it"


def test_without_an_answer_or_a_session_the_full_way_answers(
    session_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not start_hook.answer(list(START)), "not written yet"
    (session_dir / START_ANSWER).write_text(ANSWER)
    monkeypatch.delenv("GT_SESSION")
    assert not start_hook.answer(list(START)), "no session"
    monkeypatch.setenv("GT_SESSION", "hq-abc-1")
    monkeypatch.delenv(runtimes.SESSION_DIR_ENV)
    assert not start_hook.answer(list(START)), "no runtime dir"
    assert not (session_dir / HOOK_LOG).exists()


def test_an_answer_that_is_a_link_or_a_fifo_is_never_read(session_dir: Path, tmp_path: Path) -> None:
    """The agent owns its runtime dir: what it puts where the answer belongs is not followed or waited on."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("not the town's answer")
    (session_dir / START_ANSWER).symlink_to(elsewhere)
    assert not start_hook.answer(list(START))
    (session_dir / START_ANSWER).unlink()
    os.mkfifo(session_dir / START_ANSWER)
    assert not start_hook.answer(list(START)), "a FIFO is opened without blocking and read as nothing usable"


def test_a_start_without_input_is_recorded_without_a_source(session_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", Stdin(""))
    (session_dir / START_ANSWER).write_text(ANSWER)
    assert start_hook.answer(list(START))
    [line] = (session_dir / HOOK_LOG).read_text().splitlines()
    assert line.split()[1:] == ["session-start"]
