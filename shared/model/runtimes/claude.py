"""Claude Code (``@anthropic-ai/claude-code``) as a runtime. Pure."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from shared.core.runtime_dir import HOOK_MARK_SESSION_START, SESSION_DIR_ENV
from shared.model import transcripts
from shared.model.runtimes.base import (
    ACTIVITY_HOOK,
    CLAUDE,
    HOOK_MARGIN_S,
    HOOK_MARK_ACTIVITY,
    SESSION_TOWN_PATIENCE_S,
    NudgeTyping,
    Restart,
    Runtime,
    RuntimeFile,
    UsageReader,
    log_line_hook,
    newest_restart,
)
from shared.model.usage import Transcript

CLAUDE_PASSTHROUGH = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_MODEL",
    "ANTHROPIC_SMALL_FAST_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL",
    "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_HAIKU_MODEL",
    "ANTHROPIC_CUSTOM_HEADERS",
    "API_TIMEOUT_MS",
    "BASH_DEFAULT_TIMEOUT_MS",
    "BASH_MAX_TIMEOUT_MS",
    "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
)
"""Claude Code's settings (code.claude.com/docs/en/env-vars) a session takes from the witness's environment when
set, without ``GT_AGENT_ENV``."""
CLAUDE_PASSTHROUGH_PREFIXES = ("CLAUDE_CODE_", "DISABLE_")
"""And every ``CLAUDE_CODE_*`` (``CLAUDE_CODE_OAUTH_TOKEN``, ``CLAUDE_CODE_MAX_RETRIES``, ...) and ``DISABLE_*``
(``DISABLE_TELEMETRY``, ``DISABLE_AUTOUPDATER``, ...)."""
CLAUDE_CREDENTIALS = ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN")
"""Any one of these lets Claude Code talk to the model without a login; else a logged-in config home is needed."""
CLAUDE_LOGIN_DIR_ENV = "GT_CLAUDE_CONFIG_DIR"
"""A logged-in Claude Code config dir (``claude /login`` ran with it): its ``.credentials.json`` is copied into
each session's config home. Never written to."""
CLAUDE_CREDENTIALS_FILE = ".credentials.json"
CLAUDE_REFUSALS = ("authentication_failed", "oauth_org_not_allowed", "account_on_hold", "billing_error")
"""StopFailure ``error`` values (code.claude.com/docs/en/hooks) that a fresh session would meet again: the rig is
parked and the operator told, instead of sessions started and refused in a loop."""
CLAUDE_REFUSAL_SCREENS = (
    re.compile(r"\b401\b[^\n]*· retrying in \d+s · attempt \d+/\d+"),
    re.compile(r"Please run /login · API Error: 401[^\n]*"),
)
"""What Claude Code's TUI shows for a refused key (observed with 2.1.332): while it retries, a status line
``401 <message> · retrying in 3s · attempt 3/10``; when it gave up, ``Please run /login · API Error: 401 ...``."""
CLAUDE_RETRY_SCREEN = re.compile(r"\b(?:429|5\d\d)\b[^\n]*· retrying in \d+s · attempt \d+/\d+")
"""Claude Code's status line while it waits out the model API's refusals (observed with 2.1.332 against a server
answering 529 and 429: ``✻ 529 <message> · retrying in 7s · attempt 6/10``, the count going down every second,
the backoff doubling with each attempt up to ``CLAUDE_CODE_MAX_RETRIES``, 10 by default). Only an HTTP status
the API answered with counts (429, 5xx): a request that got no answer at all is no sign of a live model."""
CLAUDE_BLOCKING_SCREENS = (
    ("its custom API key question", re.compile(r"Do you want to use this API key\?")),
    ("its folder trust dialog", re.compile(r"Yes, I trust this folder|Is this a project you created or one you trust")),
    ("its onboarding (text style)", re.compile(r"Choose the text style")),
    ("its login method question", re.compile(r"Select login method")),
    ("its bypass-permissions warning", re.compile(r"Bypass Permissions mode[\s\S]*Yes, I accept")),
    ("a dialog", re.compile(r"Enter to confirm · Esc to cancel|Press Enter to continue")),
)
"""Screens Claude Code waits at for someone to answer (observed with 2.1.332 by leaving out each part of the
first-run state, and by a ``settings.json`` whose ``env`` names another API key): the most specific first, then
its dialogs' common footer."""
CLAUDE_BUSY = "esc to interrupt"
"""In Claude Code's footer while a turn runs (generating, running a tool, retrying); gone when it waits at its
prompt (observed with 2.1.332)."""
CLAUDE_FOOTER_LINES = 6
"""The last non-blank lines of its pane that hold its input box and footer (and a dialog's options, when one is up)."""
CLAUDE_PROMPT = re.compile("^\N{HEAVY RIGHT-POINTING ANGLE QUOTATION MARK ORNAMENT}", re.MULTILINE)
"""Its input prompt, at the start of a line (a dialog's selection marker is indented)."""
CLAUDE_TRANSCRIPTS = "home/.claude/projects/*/*.jsonl"
CLAUDE_CONTEXT_WINDOW = 200_000
"""Claude's context window unless a model's is larger (its transcripts do not say; a 1M-token window is told to
hand off early, which loses nothing)."""
"""Claude Code's transcripts in the session's config home, one per conversation (a ``/clear`` starts another):
``$CLAUDE_CONFIG_DIR/projects/<worktree slug>/<conversation id>.jsonl``."""
HOME_DIR = "home"
"""The agent's HOME, in the session's runtime dir."""
CONFIG_DIR = f"{HOME_DIR}/.claude"
"""Its ``CLAUDE_CONFIG_DIR``."""
SETTINGS_LOCAL = ".claude/settings.local.json"
"""Where in the worktree the session's hooks go: Claude Code's local project settings (never committed)."""


class ClaudeRuntime(Runtime):
    """Claude Code (``@anthropic-ai/claude-code``), interactive in its pane with the beacon as its first prompt.

    Hooks (code.claude.com/docs/en/hooks) in the worktree's ``.claude/settings.local.json``: SessionStart runs
    ``gt agent-hook session-start`` (marks the start for the witness; prints ``gt prime``, which Claude Code adds
    to the session's context), Stop runs ``gt agent-hook stop`` (blocks the stop while the session's steps are
    open), PostToolUse marks the agent's activity (every tool call), StopFailure runs ``gt agent-hook
    stop-failure`` (leaves the turn's API error for the witness), PreCompact and SessionEnd append to the
    session's hook log."""

    name = CLAUDE
    confirms_start = True
    pane_activity = False
    reads_screen = True
    activity_files: tuple[str, ...] = (HOOK_MARK_ACTIVITY, HOOK_MARK_SESSION_START, CLAUDE_TRANSCRIPTS)
    """The PostToolUse hook's mark, the SessionStart mark, and the transcripts Claude Code appends to with every
    message."""
    usage_files: tuple[str, ...] = (CLAUDE_TRANSCRIPTS,)
    transcript_files: tuple[str, ...] = (CLAUDE_TRANSCRIPTS,)
    """Its transcripts: every assistant message with its ``usage`` (``shared.model.usage``)."""
    context_window = CLAUDE_CONTEXT_WINDOW
    binary_name: ClassVar[str] = "claude"
    binary_setting: ClassVar[str] = "GT_CLAUDE_BIN"
    package: ClassVar[str] = "@anthropic-ai/claude-code"
    wants_version: ClassVar[bool] = True  # its first-run state names the version onboarded

    def command(self, beacon: str, binary: str) -> str:
        # exec: the pane's reaper runs claude itself (no shell between), so the reaper ends the session the moment
        # claude exits.
        return f"exec {shlex.quote(binary)} --dangerously-skip-permissions {shlex.quote(beacon)}"

    def unavailable(self, env: Mapping[str, str], *, logged_in: bool) -> str | None:
        if any(env.get(name) for name in CLAUDE_CREDENTIALS) or logged_in:
            return None
        return (
            f"no credentials for Claude Code: set one of {', '.join(CLAUDE_CREDENTIALS)} in the witness's "
            f"environment, or {CLAUDE_LOGIN_DIR_ENV} to a config dir where `claude /login` was done"
        )

    def env(self, witness_env: Mapping[str, str], *, session_dir: str, root: bool) -> dict[str, str]:
        """What Claude Code gets besides the session's own environment: a HOME and ``CLAUDE_CONFIG_DIR`` of its own
        (the operator's ``~/.claude`` is never read or changed), its settings from the witness's environment,
        ``IS_SANDBOX=1`` as root (``--dangerously-skip-permissions`` refuses root otherwise)."""
        env = {"HOME": f"{session_dir}/{HOME_DIR}", "CLAUDE_CONFIG_DIR": f"{session_dir}/{CONFIG_DIR}"}
        env[SESSION_DIR_ENV] = session_dir
        for name, value in witness_env.items():
            if name in CLAUDE_PASSTHROUGH or name.startswith(CLAUDE_PASSTHROUGH_PREFIXES):
                env[name] = value
        if root:
            env["IS_SANDBOX"] = "1"
        return env

    def first_run_state(self, worktree: str, env: Mapping[str, str], version: str) -> dict[str, Any]:
        """The config home's ``.claude.json``: every first-run screen answered before it is shown (onboarding, the
        custom API key approved by its last 20 characters, the worktree's folder trusted, bypass-permissions
        accepted), so the pane reaches its prompt with nobody at the keyboard."""
        key = env.get("ANTHROPIC_API_KEY", "")
        state: dict[str, Any] = {
            "hasCompletedOnboarding": True,
            "bypassPermissionsModeAccepted": True,
            "customApiKeyResponses": {"approved": [key[-20:]] if key else [], "rejected": []},
            "projects": {
                worktree: {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True, "allowedTools": []}
            },
        }
        if version:
            state["lastOnboardingVersion"] = version
            state["lastReleaseNotesSeen"] = version
        return state

    def files(self, *, worktree: str, env: Mapping[str, str], version: str, gt: str) -> tuple[RuntimeFile, ...]:
        """The first-run state where the version at hand reads it with ``CLAUDE_CONFIG_DIR`` set (inside it), and
        HOME's for older ones; the worktree's hooks."""
        state = json.dumps(self.first_run_state(worktree, env, version), indent=2)
        return (
            RuntimeFile(path=f"{CONFIG_DIR}/.claude.json", content=state),
            RuntimeFile(path=f"{HOME_DIR}/.claude.json", content=state),
            RuntimeFile(
                path=SETTINGS_LOCAL,
                content=json.dumps(self.settings_local(gt), indent=2) + "\n",
                in_worktree=True,
                mode=0o644,
            ),
        )

    def login_files(self, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """``GT_CLAUDE_CONFIG_DIR``'s ``.credentials.json`` (``claude /login`` ran with it)."""
        login_dir = env.get(CLAUDE_LOGIN_DIR_ENV, "").strip()
        if not login_dir:
            return ()
        source = str(Path(login_dir).expanduser() / CLAUDE_CREDENTIALS_FILE)
        return ((source, f"{CONFIG_DIR}/{CLAUDE_CREDENTIALS_FILE}"),)

    def settings_local(self, gt: str) -> dict[str, Any]:
        """The worktree's ``.claude/settings.local.json``: the session's hooks. ``gt`` is the gt command to run
        (an absolute path: the hooks must not depend on what the agent did to PATH)."""
        gt_q = shlex.quote(gt)

        def hook(command: str, timeout: int = 60) -> list[dict[str, Any]]:
            return [{"hooks": [{"type": "command", "command": command, "timeout": timeout}]}]

        return {
            "hooks": {
                "SessionStart": hook(f"{gt_q} agent-hook session-start", 120),
                "PostToolUse": [{"matcher": "*", "hooks": [{"type": "command", "command": ACTIVITY_HOOK}]}],
                # It waits out a town restart (a session's `gt` does), then blocks the stop while steps are open:
                # what sets the agent working again once the town is back.
                "Stop": hook(f"{gt_q} agent-hook stop", int(SESSION_TOWN_PATIENCE_S) + HOOK_MARGIN_S),
                "StopFailure": hook(f"{gt_q} agent-hook stop-failure", 30),
                "PreCompact": hook(log_line_hook("PreCompact"), 10),
                "SessionEnd": hook(log_line_hook("SessionEnd"), 10),
            }
        }

    def hook_answer(self, event: str, text: str | None) -> str:
        """SessionStart's stdout is added to the context as it is; a Stop hook blocks the stop with JSON
        (code.claude.com/docs/en/hooks)."""
        if event == "session-start" or not text:
            return text or ""
        return json.dumps({"decision": "block", "reason": text})

    def refusal(self, failure: Mapping[str, Any] | None, screen: str = "") -> str | None:
        why = self.refusal_recorded(failure) if failure is not None else None
        return why or (self.refusal_on_screen(screen) if screen else None)

    def refusal_recorded(self, failure: Mapping[str, Any]) -> str | None:
        """What a turn failure (``AGENT_FAILURE``'s content) says when no new session of the rig can work either
        (the credentials were refused), or None: Claude Code retries everything else itself (429, 529, a dropped
        connection) and a turn that still failed is the liveness checks' to judge."""
        error = str(failure.get("error", ""))
        if error not in CLAUDE_REFUSALS:
            return None
        details = " ".join(str(failure.get("details", "")).split())[:300]
        return f"the model API refused its credentials ({error}{': ' + details if details else ''})"

    def refusal_on_screen(self, screen: str) -> str | None:
        """The same, read from the pane while Claude Code is still retrying the refused request (it retries a 401
        ``CLAUDE_CODE_MAX_RETRIES`` times, minutes in all, before the StopFailure hook fires), or once it gave
        up: the refusal is known at the first retry shown."""
        for pattern in CLAUDE_REFUSAL_SCREENS:
            found = pattern.search(screen)
            if found is not None:
                return f"the model API refused its credentials ({' '.join(found.group(0).split())[:300]})"
        return None

    def git_excludes(self) -> tuple[str, ...]:
        """Worktree files the runtime adds that must never be committed (listed in the clone's ``info/exclude``)."""
        return (f"/{SETTINGS_LOCAL}",)

    def usage_reader(self) -> UsageReader:
        return Transcript()

    def transcript_entries(self, record: dict[str, Any]) -> list[str]:
        return transcripts.claude_entries(record)

    def turn_mark(self, record: dict[str, Any]) -> tuple[str, str] | None:
        return transcripts.claude_mark(record)

    def idle(self, screen: str) -> bool:
        """At its prompt with no turn running: at the bottom of the pane (``CLAUDE_FOOTER_LINES``; what the agent
        printed above does not count) the prompt shows, the footer does not offer to interrupt a turn, and no
        dialog is up. Claude Code's Stop hook records the end of each turn too (``restart`` reads it)."""
        bottom = "\n".join([line for line in screen.splitlines() if line.strip()][-CLAUDE_FOOTER_LINES:])
        return (
            CLAUDE_PROMPT.search(bottom) is not None
            and CLAUDE_BUSY not in bottom
            and self.blocking_screen(bottom) is None
        )

    def activity_on_screen(self, screen: str) -> str | None:
        """The status line of a request Claude Code retries after the model API refused it for now (429, 529):
        it is alive and will go on by itself, however long the storm; its transcript and hooks stay still."""
        found = CLAUDE_RETRY_SCREEN.search(screen)
        return " ".join(found.group(0).split()) if found is not None else None

    def blocking_screen(self, screen: str) -> str | None:
        for what, pattern in CLAUDE_BLOCKING_SCREENS:
            found = pattern.search(screen)
            if found is not None:
                line = " ".join(found.group(0).split())[:200]
                return f"{what} ({line!r})"
        return None

    def nudge(self, message: str) -> NudgeTyping:
        """Typed as a prompt, even while a turn runs: its TUI queues what is typed then and sends it with its next
        request, once (``test_a_nudge_typed_while_claude_generates_arrives_once_intact_at_the_next_turn``)."""
        return NudgeTyping(text=message, when_busy=True)

    def restart(self, hook_log: str) -> Restart | None:
        """After ``/clear`` Claude Code runs its SessionStart hook (source ``clear``) and waits at its prompt; after
        a compaction (source ``compact``) it goes on with the turn that compacted, or waits when the compaction
        was typed (``/compact``). The witness sends it on when it waits (``continue_prompt``)."""
        return newest_restart(hook_log)
