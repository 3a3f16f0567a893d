"""Agent runtimes: what a rig's ``--agent`` names, and everything the witness must know to start one in a polecat's
tmux pane (docs/agents.md, "Agent runtimes").

A rig's ``agent_command`` is either a runtime's name (``claude``, ``gt-agent``) or a command line of its own (run
with ``sh -c``, ``{beacon}`` replaced by the startup prompt, as before runtimes existed). A runtime says:

- how its binary is found (a setting naming a path, ``PATH``, a project-local install),
- the environment it needs besides the session's own (what it takes from the witness's, what it adds),
- its first-run state (written before it starts, so no dialog ever blocks a pane),
- the files it is given in the worktree (hooks) and which of them git must not see,
- the command line that starts it with the beacon,
- whether it confirms its start itself (a hook the witness waits for), and how a nudge is typed.

Pure: no I/O here. The witness's ``runtime_setup`` module finds binaries and writes the files. Codex, Gemini or
OpenCode are added the same way: a class with these methods and an entry in ``RUNTIMES``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

CLAUDE = "claude"
GT_AGENT = "gt-agent"
COMMAND = "command"
"""The runtime of a rig whose ``--agent`` is a command line of its own."""

HOOK_MARK_SESSION_START = "session-start"
"""The file (in the session's runtime dir) the SessionStart hook leaves: the witness's sign the agent started."""
HOOK_MARK_ACTIVITY = "activity"
"""The file (in the session's runtime dir) the PostToolUse hook truncates after every tool call: its mtime is the
agent's last tool call, read by the witness (a shell redirection, no process started: docs/agents.md, Liveness)."""
HOOK_LOG = "hooks.log"
"""One line per hook the runtime fired (``<iso time> <event>``), in the session's runtime dir."""
AGENT_FAILURE = "agent-failure"
"""The file (in the session's runtime dir) the agent's turn-failure hook leaves: JSON ``{"error", "details", "at"}``
of the newest turn that ended on an API error (Claude Code's StopFailure hook)."""
SESSION_DIR_ENV = "GT_SESSION_DIR"
"""Names the session's runtime dir (its config home, hook marks) in the agent's environment and its hooks'."""


class Runtime(Protocol):
    name: str
    confirms_start: bool
    """True: the agent tells the witness it started (a hook); a pane that stays silent past the start deadline is
    a failed start. False: a live pane process is all the witness knows."""
    pane_activity: bool
    """True: output in its tmux pane counts as a sign of life (the runtime shows no other). False for runtimes
    with better signs: Claude Code's spinner redraws the pane while it waits for a model that never answers."""
    activity_files: tuple[str, ...]
    """Globs, relative to the session's runtime dir, of files whose mtime is the agent's last activity."""

    def command(self, beacon: str, binary: str) -> str:
        """The shell command line the tmux pane runs (``binary`` as found by the witness)."""
        ...


class CommandRuntime:
    """A command line of the rig's own (``--agent "aider --yes {beacon}"``): run as it is, nothing prepared."""

    name = COMMAND
    confirms_start = False
    pane_activity = True
    activity_files: tuple[str, ...] = ()

    def __init__(self, template: str) -> None:
        self.template = template

    def command(self, beacon: str, binary: str = "") -> str:
        return self.template.replace("{beacon}", shlex.quote(beacon))


class GtAgentRuntime(CommandRuntime):
    """The bundled scripted agent (``gt-agent``, on the witness's PATH): it reads its beacon from ``GT_BEACON``."""

    name = GT_AGENT
    pane_activity = False  # it calls `gt` itself: heartbeats and step progress

    def __init__(self) -> None:
        super().__init__(GT_AGENT)


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
SETTINGS_LOCAL = ".claude/settings.local.json"
"""Where in the worktree the session's hooks go: Claude Code's local project settings (never committed)."""


class ClaudeRuntime:
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
    activity_files: tuple[str, ...] = (HOOK_MARK_ACTIVITY, HOOK_MARK_SESSION_START, "home/.claude/projects/*/*.jsonl")
    """The PostToolUse hook's mark, the SessionStart mark, and the transcripts Claude Code appends to with every
    message (``$CLAUDE_CONFIG_DIR/projects/<worktree slug>/<session uuid>.jsonl``)."""
    binary_name: ClassVar[str] = "claude"
    binary_setting: ClassVar[str] = "GT_CLAUDE_BIN"
    local_binary: ClassVar[str] = ".tools/npm/node_modules/.bin/claude"
    """Where ``./dev setup`` installs the pinned version, relative to the project's checkout."""

    def command(self, beacon: str, binary: str) -> str:
        # exec: the pane's process is claude itself, so the pid the witness records and watches is the agent's.
        return f"exec {shlex.quote(binary)} --dangerously-skip-permissions {shlex.quote(beacon)}"

    def find_binary(
        self, env: Mapping[str, str], on_path: Callable[[str], str | None], project_root: Path | None
    ) -> tuple[str | None, str]:
        """The binary to run and where it was looked for (for a message naming the places when it is missing).
        ``GT_CLAUDE_BIN`` wins (an operator's explicit choice, even when the file is missing: then it is
        reported), then ``PATH``, then the project-local install."""
        configured = env.get(self.binary_setting, "").strip()
        if configured:
            return (configured if Path(configured).is_file() else None), f"{self.binary_setting}={configured}"
        found = on_path(self.binary_name)
        if found:
            return found, "PATH"
        places = f"{self.binary_setting} (not set), PATH"
        if project_root is not None:
            local = project_root / self.local_binary
            places += f", {local}"
            if local.is_file():
                return str(local), places
        return None, places

    def unavailable(self, env: Mapping[str, str], *, login_dir_has_credentials: bool) -> str | None:
        """Why the runtime cannot run with ``env`` (the witness's environment), or None."""
        if any(env.get(name) for name in CLAUDE_CREDENTIALS) or login_dir_has_credentials:
            return None
        return (
            f"no credentials for Claude Code: set one of {', '.join(CLAUDE_CREDENTIALS)} in the witness's "
            f"environment, or {CLAUDE_LOGIN_DIR_ENV} to a config dir where `claude /login` was done"
        )

    def env(self, witness_env: Mapping[str, str], *, session_dir: str, root: bool) -> dict[str, str]:
        """What Claude Code gets besides the session's own environment: a HOME and ``CLAUDE_CONFIG_DIR`` of its own
        (the operator's ``~/.claude`` is never read or changed), its settings from the witness's environment,
        ``IS_SANDBOX=1`` as root (``--dangerously-skip-permissions`` refuses root otherwise)."""
        home = f"{session_dir}/home"
        env = {"HOME": home, "CLAUDE_CONFIG_DIR": f"{home}/.claude", SESSION_DIR_ENV: session_dir}
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
                "Stop": hook(f"{gt_q} agent-hook stop", 60),
                "StopFailure": hook(f"{gt_q} agent-hook stop-failure", 30),
                "PreCompact": hook(_log_line("PreCompact"), 10),
                "SessionEnd": hook(_log_line("SessionEnd"), 10),
            }
        }

    def refusal(self, failure: Mapping[str, Any]) -> str | None:
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


ACTIVITY_HOOK = f': > "${SESSION_DIR_ENV}/{HOOK_MARK_ACTIVITY}"'
"""The PostToolUse hook: one shell redirection (truncating an empty file sets its mtime), no Python, no fork
beyond the ``sh -c`` Claude Code runs it in; it fires after every tool call."""


def _log_line(event: str) -> str:
    """A hook that records ``event`` in the session's hook log with a shell builtin and ``date``: no Python."""
    return f'printf "%s {event}\\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "${SESSION_DIR_ENV}/{HOOK_LOG}"'


RUNTIMES: dict[str, Callable[[], Runtime]] = {CLAUDE: ClaudeRuntime, GT_AGENT: GtAgentRuntime}
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
    runtime = runtime_for(agent_command)
    if not isinstance(runtime, ClaudeRuntime):
        return None
    why = runtime.refusal(failure) if failure is not None else None
    return why or (runtime.refusal_on_screen(screen) if screen else None)
