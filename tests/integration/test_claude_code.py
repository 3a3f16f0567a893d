"""The real Claude Code CLI (the pinned npm package ``./dev setup`` installs) against the scripted model server:
print mode in a real git repository, the interactive TUI in a real tmux pane, and the model failing (429, 529, a
dropped stream, 401). The model server is the only fake."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import uuid
from pathlib import Path

import pytest

from gt.model_server import Fault, ModelServer, Script, bash, edit, say, use, write
from tests.claude_code import claude_binary, claude_env, claude_home
from tests.helpers import assert_eventually

RUN_DEADLINE_S = 90.0
FIRST_RUN_SCREENS = ("trust", "do you want to use this api key", "choose the text style", "select login method")
"""Text of the first-run screens (folder trust, custom key approval, onboarding): none may ever show."""


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    return path


async def _run_print(
    binary: Path, repo: Path, env: dict[str, str], prompt: str = "Do the scripted work."
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(binary),
        "-p",
        "--dangerously-skip-permissions",
        prompt,
        cwd=repo,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), RUN_DEADLINE_S)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        pytest.fail(f"claude -p did not finish within {RUN_DEADLINE_S}s: {out.decode()!r} {err.decode()!r}")
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_print_mode_runs_bash_write_and_edit_in_a_git_repo(tmp_path: Path) -> None:
    binary = claude_binary()
    repo = _git_repo(tmp_path / "repo")
    notes = repo / "notes.txt"
    script = Script(
        name="print-story",
        turns=(
            use(bash("git status", expect="On branch main"), text="Let me look at the repository."),
            use(write(str(notes), "hello\n"), text="Writing the notes."),
            use(edit(str(notes), "hello", "hello world", expect="updated successfully")),
            say("The notes say hello world."),
        ),
    )
    async with ModelServer([script]) as server:
        env = claude_env(claude_home(tmp_path, [repo]), server.base_url, script=script.name)
        code, out, err = await _run_print(binary, repo, env)

    assert server.failures == []
    assert code == 0, err
    assert "The notes say hello world." in out
    assert notes.read_text() == "hello world\n"
    turns = server.turns(script.name)
    assert [request.turn for request in turns] == [0, 1, 2, 3]
    # The tool results Claude Code sent back: the real git status, then its own Write and Edit confirmations.
    results = [request.body["messages"][-1]["content"][0] for request in turns[1:]]
    assert all(result["type"] == "tool_result" for result in results)
    assert "nothing to commit" in results[0]["content"]
    assert "notes.txt" in results[1]["content"]
    # Claude Code streams; every answer reported usage, and the conversation's prefix was read from the cache.
    assert all(request.body["stream"] is True for request in turns)
    assert all(answer.stream for answer in server.answers)
    usage = server.usage(script.name)
    assert len(usage) == 4
    assert usage[0]["cache_read_input_tokens"] == 0
    assert usage[0]["cache_creation_input_tokens"] > 1000  # Claude Code's system prompt and tool definitions
    assert all(later["cache_read_input_tokens"] > 0 for later in usage[1:])
    assert all(block["output_tokens"] > 0 for block in usage)
    first = turns[0]
    assert first.path.startswith("/v1/messages")
    assert first.headers["x-gt-model-script"] == script.name
    assert first.headers["user-agent"].startswith("claude-cli/")
    assert "x-api-key" not in first.headers
    assert {tool["name"] for tool in first.body["tools"]} >= {"Bash", "Read", "Edit", "Write"}


def _tmux(socket: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, check=True).stdout


async def test_the_interactive_tui_in_tmux_shows_no_first_run_screen_and_acts_on_a_typed_prompt(
    tmp_path: Path,
) -> None:
    binary = claude_binary()
    repo = _git_repo(tmp_path / "repo")
    typed = repo / "typed.txt"
    script = Script(
        name="tui-story",
        turns=(use(write(str(typed), "from the pane\n"), prompt="please write typed.txt"), say("Wrote typed.txt.")),
    )
    socket = f"gt-claude-{uuid.uuid4().hex[:8]}"
    async with ModelServer([script]) as server:
        # Non-essential traffic on, as an operator's default: its side requests must not disturb the script.
        env = claude_env(claude_home(tmp_path, [repo]), server.base_url, script=script.name, nonessential_traffic=True)
        command = "env -i " + " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        command += f" {shlex.quote(str(binary))} --dangerously-skip-permissions"
        _tmux(socket, "new-session", "-d", "-s", "claude", "-x", "160", "-y", "50", "-c", str(repo), command)
        try:

            def pane() -> str:
                return _tmux(socket, "capture-pane", "-p", "-t", "claude")

            def at_prompt() -> str:
                text = pane()
                for screen in FIRST_RUN_SCREENS:
                    assert screen not in text.lower(), f"a first-run screen ({screen!r}) shows:\n{text}"
                assert "bypass permissions on" in text, text
                assert "\N{HEAVY RIGHT-POINTING ANGLE QUOTATION MARK ORNAMENT}" in text, text  # the prompt
                return text

            ready = await assert_eventually(at_prompt, timeout=RUN_DEADLINE_S, interval=0.2)
            assert "Claude Code v" in ready
            _tmux(socket, "send-keys", "-t", "claude", "-l", "please write typed.txt")
            await assert_eventually(lambda: "please write typed.txt" in pane(), timeout=30)
            _tmux(socket, "send-keys", "-t", "claude", "Enter")
            await assert_eventually(lambda: "Wrote typed.txt." in pane(), timeout=RUN_DEADLINE_S, interval=0.2)
            final = pane()
        finally:
            subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)

    assert server.failures == []
    assert typed.read_text() == "from the pane\n"
    for screen in FIRST_RUN_SCREENS:
        assert screen not in final.lower()
    assert [request.turn for request in server.turns(script.name)] == [0, 1]
    # Claude Code named the session with a small model (JSON {"title": ...}); that consumed no turn.
    titles = [request for request in server.requests if request.kind == "side"]
    assert titles, [(request.method, request.path, request.kind) for request in server.requests]
    assert all("haiku" in request.body["model"] for request in titles)
    assert all(request.body["output_config"]["format"]["type"] == "json_schema" for request in titles)


async def test_claude_retries_rate_limits_overloads_and_a_dropped_stream_then_finishes(tmp_path: Path) -> None:
    binary = claude_binary()
    repo = _git_repo(tmp_path / "repo")
    script = Script(
        name="flaky",
        turns=(
            use(bash("echo survived", expect="survived"), faults=(Fault(kind="rate_limited", times=2),)),
            use(bash("echo again", expect="again"), faults=(Fault(kind="drop"),)),
            use(text="Finished despite the model's trouble.", faults=(Fault(kind="overloaded"),)),
        ),
    )
    async with ModelServer([script]) as server:
        env = claude_env(claude_home(tmp_path, [repo]), server.base_url, script=script.name)
        code, out, err = await _run_print(binary, repo, env)

    assert server.failures == []
    assert code == 0, err
    assert "Finished despite the model's trouble." in out
    assert [(answer.turn, answer.status, answer.fault) for answer in server.answers] == [
        (0, 429, "rate_limited"),
        (0, 429, "rate_limited"),
        (0, 200, None),
        (1, 0, "drop"),
        (1, 200, None),
        (2, 529, "overloaded"),
        (2, 200, None),
    ]


async def test_unauthorized_is_reported_as_an_authentication_error(tmp_path: Path) -> None:
    binary = claude_binary()
    repo = _git_repo(tmp_path / "repo")
    script = Script(name="revoked", turns=(say("never said"),), faults=(Fault(kind="unauthorized", times=None),))
    async with ModelServer([script]) as server:
        env = claude_env(claude_home(tmp_path, [repo]), server.base_url, script=script.name)
        # Claude Code retries a 401 like other errors (10 times by default, backing off): two keep the test short.
        env["CLAUDE_CODE_MAX_RETRIES"] = "2"
        code, out, err = await _run_print(binary, repo, env)

    assert code == 1
    assert "Failed to authenticate. API Error: 401" in out + err
    assert "never said" not in out
    assert {answer.status for answer in server.answers} == {401}
    assert len(server.answers) == 3  # the request and its two retries
