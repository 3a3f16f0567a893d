"""The scripts ``./dev demo`` serves (``python -m gt.model_server.demo_story WORKTREE``): they load as the model
server's command line loads scripts, and each story is the polecat-work molecule done, Claude Code's with its own
tools in the polecat's worktree, Codex CLI's with relative paths (whichever polecat works it)."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import msgspec

from gt.model_server.demo_story import main
from gt.model_server.script import Script

WORKTREE = "/town/rigs/docs/polecats/ace"


def test_the_demo_story_prints_scripts_the_model_server_loads() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main([WORKTREE]) == 0
    claude, codex = msgspec.json.decode(out.getvalue(), type=list[Script])
    assert (claude.name, codex.name) == ("demo-polecat", "demo-codex"), "the first is the server's default"
    tools = [tool for turn in claude.turns for tool in turn.tool_uses]
    assert [tool.name for tool in tools if tool.name != "Bash"] == ["Write", "Edit"], "Claude Code's own tools"
    assert {tool.input["file_path"] for tool in tools if tool.name != "Bash"} == {f"{WORKTREE}/USAGE.md"}
    codex_writes = [tool for turn in codex.turns for tool in turn.tool_uses if tool.name == "Write"]
    assert [tool.input["file_path"] for tool in codex_writes] == ["CHANGELOG.md"]
    for script in (claude, codex):
        tools = [tool for turn in script.turns for tool in turn.tool_uses]
        commands = " && ".join(str(tool.input["command"]) for tool in tools if tool.name == "Bash")
        assert commands.startswith("gt prime")
        for step in ("load-context", "implement", "commit", "self-review", "run-tests", "submit"):
            assert f"gt step done {step}" in commands
        assert commands.endswith("gt done")
        assert "git commit" in commands
        assert script.turns[-1].tool_uses == (), "it ends by saying so, not with a tool call"


def test_the_demo_story_needs_the_worktree() -> None:
    assert main([]) == 2
