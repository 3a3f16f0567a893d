"""Agent runtimes: what a rig's ``--agent`` names, and everything the witness must know to start one in a polecat's
tmux pane and to watch it (docs/agents.md, "Agent runtimes").

A rig's ``agent_command`` is either a runtime's name (``claude``, ``gt-agent``) or a command line of its own (run
with ``sh -c``, ``{beacon}`` replaced by the startup prompt, as before runtimes existed). A runtime says:

- how its binary is found (a setting naming a path, ``PATH``, a project-local install),
- the environment it needs besides the session's own (what it takes from the witness's, what it adds),
- its first-run state (written before it starts, so no dialog ever blocks a pane),
- the files it is given in the worktree (hooks) and which of them git must not see,
- the command line that starts it with the beacon,
- whether it confirms its start itself (a hook the witness waits for), and what a screen that waits for input
  before it started looks like,
- what activity it shows (files it touches, its pane, a status it prints while it waits on its model),
- how to tell it is idle, how a nudge is typed into it, and whether it goes on by itself after its context was
  cleared or compacted,
- where its token usage is written and how it is read.

Pure: no I/O here. The witness's effects (``runtime_setup``, the executor, ``usage_watch``) find binaries, write
the files, read the panes and the files. Codex CLI, Gemini CLI and OpenCode were added the same way; another
runtime is a ``Runtime`` subclass with these methods and an entry in ``RUNTIMES``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from shared.core.runtime_dir import (
    AGENT_FAILURE,
    HOOK_LOG,
    HOOK_MARK_SESSION_START,
    SESSION_DIR_ENV,
    START_ANSWER,
    START_ANSWER_TAKEN,
    hook_log_line,
)
from shared.model.runtimes.base import (
    ACTIVITY_HOOK,
    CLAUDE,
    COMMAND,
    CONTEXT_PROMPT,
    CONTINUE_PROMPT,
    DONE_MARK,
    GT_AGENT,
    HOOK_MARGIN_S,
    HOOK_MARK_ACTIVITY,
    LOCAL_BINARIES,
    RESTART_SOURCES,
    SESSION_TOWN_PATIENCE_S,
    TURN_ENDS,
    CommandRuntime,
    GtAgentRuntime,
    NudgeTyping,
    Restart,
    Runtime,
    RuntimeFile,
    TuiRuntime,
    UsageReader,
    continue_prompt,
    log_line_hook,
    newest_restart,
    turn_ended_after_done,
)
from shared.model.runtimes.claude import (
    CLAUDE_BLOCKING_SCREENS,
    CLAUDE_BUSY,
    CLAUDE_CREDENTIALS,
    CLAUDE_CREDENTIALS_FILE,
    CLAUDE_FOOTER_LINES,
    CLAUDE_LOGIN_DIR_ENV,
    CLAUDE_PASSTHROUGH,
    CLAUDE_PASSTHROUGH_PREFIXES,
    CLAUDE_PROMPT,
    CLAUDE_REFUSAL_SCREENS,
    CLAUDE_REFUSALS,
    CLAUDE_RETRY_SCREEN,
    CLAUDE_TRANSCRIPTS,
    SETTINGS_LOCAL,
    ClaudeRuntime,
)
from shared.model.runtimes.codex import CODEX, CodexRuntime
from shared.model.runtimes.gemini import GEMINI, GeminiRuntime
from shared.model.runtimes.opencode import OPENCODE, OpenCodeRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    CLAUDE: ClaudeRuntime,
    CODEX: CodexRuntime,
    GEMINI: GeminiRuntime,
    OPENCODE: OpenCodeRuntime,
    GT_AGENT: GtAgentRuntime,
}
"""Runtimes by the name ``gt rig add --agent`` takes."""


def runtime_for(agent_command: str) -> Runtime:
    """The runtime a rig's ``agent_command`` names; a command line of its own otherwise."""
    factory = RUNTIMES.get(agent_command.strip())
    return factory() if factory is not None else CommandRuntime(agent_command)


def confirms_start(agent_command: str) -> bool:
    return runtime_for(agent_command).confirms_start


def pane_activity_counts(agent_command: str) -> bool:
    return runtime_for(agent_command).pane_activity


def refusal(agent_command: str, failure: Mapping[str, Any] | None, screen: str = "") -> str | None:
    """Why the rig's agent cannot work at all, from its runtime's turn-failure record or what its pane shows
    (None: it can, or the runtime records and shows nothing the witness knows)."""
    return runtime_for(agent_command).refusal(failure, screen)


__all__ = [
    "ACTIVITY_HOOK",
    "AGENT_FAILURE",
    "CLAUDE",
    "CLAUDE_BLOCKING_SCREENS",
    "CLAUDE_BUSY",
    "CLAUDE_CREDENTIALS",
    "CLAUDE_CREDENTIALS_FILE",
    "CLAUDE_FOOTER_LINES",
    "CLAUDE_LOGIN_DIR_ENV",
    "CLAUDE_PASSTHROUGH",
    "CLAUDE_PASSTHROUGH_PREFIXES",
    "CLAUDE_PROMPT",
    "CLAUDE_REFUSALS",
    "CLAUDE_REFUSAL_SCREENS",
    "CLAUDE_RETRY_SCREEN",
    "CLAUDE_TRANSCRIPTS",
    "CODEX",
    "COMMAND",
    "CONTEXT_PROMPT",
    "CONTINUE_PROMPT",
    "DONE_MARK",
    "GEMINI",
    "GT_AGENT",
    "HOOK_LOG",
    "HOOK_MARGIN_S",
    "HOOK_MARK_ACTIVITY",
    "HOOK_MARK_SESSION_START",
    "LOCAL_BINARIES",
    "OPENCODE",
    "RESTART_SOURCES",
    "RUNTIMES",
    "SESSION_DIR_ENV",
    "SESSION_TOWN_PATIENCE_S",
    "SETTINGS_LOCAL",
    "START_ANSWER",
    "START_ANSWER_TAKEN",
    "TURN_ENDS",
    "ClaudeRuntime",
    "CodexRuntime",
    "CommandRuntime",
    "GeminiRuntime",
    "GtAgentRuntime",
    "NudgeTyping",
    "OpenCodeRuntime",
    "Restart",
    "Runtime",
    "RuntimeFile",
    "TuiRuntime",
    "UsageReader",
    "confirms_start",
    "continue_prompt",
    "hook_log_line",
    "log_line_hook",
    "newest_restart",
    "pane_activity_counts",
    "refusal",
    "runtime_for",
    "turn_ended_after_done",
]
