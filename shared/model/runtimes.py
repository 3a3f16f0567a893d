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
the files, read the panes and the files. Codex, Gemini or OpenCode are added the same way: a ``Runtime`` subclass
with these methods and an entry in ``RUNTIMES``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec

from shared.model.usage import ModelUsage, Transcript

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


CONTINUE_PROMPT = (
    "[gastown] Your conversation was {how}; you are still on your hook. Go on with your current step (the "
    "`gt prime` above says which); finish with `gt done`."
)
"""The nudge that sends a session on after its context was cleared or compacted while it waited for input."""
RESTART_SOURCES = {"clear": "cleared", "compact": "compacted"}
"""SessionStart sources (code.claude.com/docs/en/hooks) of a session that goes on in the same process with a fresh
context, by the word the continue nudge uses for them."""


class UsageReader(Protocol):
    """Reads a runtime's usage files incrementally: ``offsets`` is where each file was read to (a cache), ``feed``
    takes a file's bytes from there, ``snapshot`` the running totals per model."""

    offsets: dict[str, int]

    def feed(self, path: str, data: bytes) -> None: ...

    def snapshot(self) -> tuple[ModelUsage, ...]: ...


class NudgeTyping(msgspec.Struct, frozen=True, kw_only=True):
    """How a nudge is typed into a runtime's pane: ``text`` (the witness types it without control characters and
    checks it shows before it presses ``submit``); ``when_busy``: typed while the agent works (its input queues
    it), else held until the runtime says it is idle."""

    text: str
    submit: str = "Enter"
    when_busy: bool = True


class Restart(msgspec.Struct, frozen=True, kw_only=True):
    """The newest start of a session's agent, read from its hook log, when it was a restart in the same process
    with a fresh context (``/clear``, a compaction): after one the agent may wait for input."""

    number: int
    """Which start of the session it is (1: the first; each SessionStart hook counts), so a nudge for it is one."""
    source: str
    turn_ended_since: bool
    """A turn ended after it (the Stop hook ran): the agent went on by itself."""


class Runtime:
    """What the witness knows of an agent runtime. The defaults are those of a command line of the rig's own: it
    confirms nothing, shows only output in its pane, writes no usage, and a nudge is typed into it as a line."""

    name: str = ""
    confirms_start: bool = False
    """True: the agent tells the witness it started (a hook); a pane that stays silent past the start deadline is
    a failed start. False: a live pane process is all the witness knows."""
    pane_activity: bool = True
    """True: output in its tmux pane counts as a sign of life (the runtime shows no other). False for runtimes
    with better signs: Claude Code's spinner redraws the pane while it waits for a model that never answers."""
    activity_files: tuple[str, ...] = ()
    """Globs, relative to the session's runtime dir, of files whose mtime is the agent's last activity."""
    usage_files: tuple[str, ...] = ()
    """Globs, relative to the session's runtime dir, of the files its token usage is written to (none: it records
    no usage)."""
    reads_screen: bool = False
    """The witness reads its pane every patrol (for the screens below); False: never."""

    def command(self, beacon: str, binary: str) -> str:
        """The shell command line the tmux pane runs (``binary`` as found by the witness)."""
        raise NotImplementedError

    def usage_reader(self) -> UsageReader | None:
        """A fresh reader of its ``usage_files``; None when it writes none."""
        return None

    def idle(self, screen: str) -> bool | None:
        """Whether the pane ``screen`` shows the agent waiting for input; None: it cannot tell."""
        return None

    def activity_on_screen(self, screen: str) -> str | None:
        """What ``screen`` shows the agent doing that moves no file (waiting out a model API's refusals), or
        None. The witness counts it as a sign of life while it changes."""
        return None

    def blocking_screen(self, screen: str) -> str | None:
        """What ``screen`` shows when it is a screen waiting for input before the agent started (a first-run
        dialog nobody answers), or None."""
        return None

    def refusal(self, failure: Mapping[str, Any] | None, screen: str = "") -> str | None:
        """Why no session of the rig can work (the model API refused the credentials), from the agent's
        turn-failure record or its pane; None when it can, or the runtime records and shows nothing of the kind."""
        return None

    def nudge(self, message: str) -> NudgeTyping:
        """How ``message`` is typed into its pane: as a line, whenever (a process reading its terminal finds it
        there when it next reads)."""
        return NudgeTyping(text=message)

    def restart(self, hook_log: str) -> Restart | None:
        """The session's newest start when it restarted with a fresh context (its hook log, ``HOOK_LOG``), or
        None: it has no hooks, or its newest start was its first."""
        return None


class CommandRuntime(Runtime):
    """A command line of the rig's own (``--agent "aider --yes {beacon}"``): run as it is, nothing prepared."""

    name = COMMAND

    def __init__(self, template: str) -> None:
        self.template = template

    def command(self, beacon: str, binary: str = "") -> str:
        return self.template.replace("{beacon}", shlex.quote(beacon))


class GtAgentRuntime(CommandRuntime):
    """The bundled scripted agent (``gt-agent``, on the witness's PATH): it reads its beacon from ``GT_BEACON`` and
    prints every line typed into its pane (a nudge) between steps."""

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
    "BASH_DEFAULT_TIMEOUT_MS",
    "BASH_MAX_TIMEOUT_MS",
    "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
)
"""Claude Code's settings (code.claude.com/docs/en/env-vars) a session takes from the witness's environment when
set, without ``GT_AGENT_ENV``."""
SESSION_TOWN_PATIENCE_S = 90.0
"""How long an agent's ``gt`` call waits for a town that does not answer (gt/cli/patience.py, ``GT_TOWN_PATIENCE``
unset): long enough for a town restart (``gt down`` and ``gt up`` take seconds, a NATS restart about one), and
shorter than Claude Code's Bash tool timeout (``BASH_DEFAULT_TIMEOUT_MS``, 2 minutes by default), so the call
either gets through or fails in its own words before the tool gives up on it."""
HOOK_MARGIN_S = 30
"""What a hook that calls ``gt`` is given beyond the patience (Python's start, the answer)."""
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
"""Claude Code's transcripts in the session's config home, one per conversation (a ``/clear`` starts another):
``$CLAUDE_CONFIG_DIR/projects/<worktree slug>/<conversation id>.jsonl``."""
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
    """Its transcripts: every assistant message with its ``usage`` (``shared.model.usage``)."""
    binary_name: ClassVar[str] = "claude"
    binary_setting: ClassVar[str] = "GT_CLAUDE_BIN"
    local_binary: ClassVar[str] = ".tools/npm/node_modules/.bin/claude"
    """Where ``./dev setup`` installs the pinned version, relative to the project's checkout."""

    def command(self, beacon: str, binary: str) -> str:
        # exec: the pane's reaper runs claude itself (no shell between), so the reaper ends the session the moment
        # claude exits.
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
                # It waits out a town restart (a session's `gt` does), then blocks the stop while steps are open:
                # what sets the agent working again once the town is back.
                "Stop": hook(f"{gt_q} agent-hook stop", int(SESSION_TOWN_PATIENCE_S) + HOOK_MARGIN_S),
                "StopFailure": hook(f"{gt_q} agent-hook stop-failure", 30),
                "PreCompact": hook(_log_line("PreCompact"), 10),
                "SessionEnd": hook(_log_line("SessionEnd"), 10),
            }
        }

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
    return runtime_for(agent_command).refusal(failure, screen)


def continue_prompt(restart: Restart) -> str:
    """The nudge that sends a session on after ``restart``."""
    return CONTINUE_PROMPT.format(how=RESTART_SOURCES.get(restart.source, "restarted"))


def hook_log_line(event: str, detail: str, stamp: str) -> str:
    """A line of the session's hook log (``HOOK_LOG``): ``<iso time> <event>[ <detail>]``."""
    return f"{stamp} {event}{' ' + detail if detail else ''}\n"


TURN_ENDS = ("stop", "stop-failure")
"""Hook log events that end a turn: the Stop hook, or StopFailure when the turn ended on an API error."""
DONE_MARK = "done"
"""The hook log line `gt done` writes once its session's done-intent is recorded (not a hook: its agent's turn
is still running, waiting for `gt done` to print its result)."""


def turn_ended_after_done(hook_log: str) -> bool:
    """Whether ``hook_log`` shows a turn that ended (``TURN_ENDS``) after `gt done` ran (``DONE_MARK``): the
    agent has read what `gt done` said and answered, so nothing is lost by ending its session now."""
    done = False
    for line in hook_log.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        if words[1] == DONE_MARK:
            done = True
        elif words[1] in TURN_ENDS and done:
            return True
    return False


def newest_restart(hook_log: str) -> Restart | None:
    """The newest SessionStart in ``hook_log`` when its source is a restart with a fresh context (``clear``,
    ``compact``), numbered among all the session's starts; whether a turn ended (``TURN_ENDS``) after it."""
    starts = 0
    newest: tuple[int, str] | None = None
    stopped = False
    for line in hook_log.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        if words[1] == "session-start":
            starts += 1
            newest = (starts, words[2] if len(words) > 2 else "")
            stopped = False
        elif words[1] in TURN_ENDS:
            stopped = True
    if newest is None or newest[1] not in RESTART_SOURCES:
        return None
    return Restart(number=newest[0], source=newest[1], turn_ended_since=stopped)
