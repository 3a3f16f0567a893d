"""What the witness knows of any agent runtime (``Runtime``), the command-line runtimes, and the hook log every
runtime's hooks write (docs/agents.md, "Agent runtimes"). Pure."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

import msgspec

from shared.core.runtime_dir import (
    HOOK_LOG,
    SESSION_DIR_ENV,
)
from shared.model.usage import ContextUse, ModelUsage

CLAUDE = "claude"
GT_AGENT = "gt-agent"
COMMAND = "command"
"""The runtime of a rig whose ``--agent`` is a command line of its own."""

HOOK_MARK_ACTIVITY = "activity"
"""The file (in the session's runtime dir) the PostToolUse hook truncates after every tool call: its mtime is the
agent's last tool call, read by the witness (a shell redirection, no process started: docs/agents.md, Liveness)."""


CONTINUE_PROMPT = (
    "[gastown] Your conversation was {how}; you are still on your hook. Go on with your current step (the "
    "`gt prime` above says which); finish with `gt done`."
)
"""The nudge that sends a session on after its context was cleared or compacted while it waited for input."""
CONTEXT_PROMPT = (
    "[gastown] Your context is {used}% full. Hand off before it runs out: finish the step you are on and commit, "
    "then run `gt handoff --note '<what the next session should know>'`; a fresh session goes on from your "
    "current step."
)
"""The nudge that tells a session its conversation passed a share of its model's context window."""
RESTART_SOURCES = {"clear": "cleared", "compact": "compacted"}
"""SessionStart sources (code.claude.com/docs/en/hooks) of a session that goes on in the same process with a fresh
context, by the word the continue nudge uses for them."""


class UsageReader(Protocol):
    """Reads a runtime's usage files incrementally: ``offsets`` is where each file was read to (a cache), ``feed``
    takes a file's bytes from there, ``snapshot`` the running totals per model, ``context`` how full the
    conversation was at its newest answer (None: no answer yet)."""

    offsets: dict[str, int]

    def feed(self, path: str, data: bytes) -> None: ...

    def snapshot(self) -> tuple[ModelUsage, ...]: ...

    def context(self) -> ContextUse | None: ...


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


LOCAL_BINARIES = ".tools/npm/node_modules/.bin"
"""Where ``./dev setup`` installs the pinned agent CLIs, relative to the project's checkout."""


class RuntimeFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file the witness writes before a session's agent starts: ``path`` relative to the session's runtime dir
    (``in_worktree``: to its worktree, then listed in ``git_excludes``)."""

    path: str
    content: str
    in_worktree: bool = False
    mode: int = 0o600


class Runtime:
    """What the witness knows of an agent runtime. The defaults are those of a command line of the rig's own: it
    confirms nothing, shows only output in its pane, writes no usage, and a nudge is typed into it as a line."""

    binary_name: ClassVar[str] = ""
    """The executable it runs (empty: a command line of the rig's own, found by its shell)."""
    binary_setting: ClassVar[str] = ""
    """The witness's environment variable naming the binary to use (``GT_CLAUDE_BIN``)."""
    package: ClassVar[str] = ""
    """The npm package that installs it (for the message naming what to install)."""
    wants_version: ClassVar[bool] = False
    """Its ``files`` need the binary's version (asked once per witness: a node CLI takes seconds to answer)."""

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
    transcript_files: tuple[str, ...] = ()
    """Globs, relative to the session's runtime dir, of the transcripts it keeps (none: it keeps none); the newest
    one's last entries are recorded when the session is cleaned (``shared.model.transcripts``)."""
    reads_screen: bool = False
    """The witness reads its pane every patrol (for the screens below); False: never."""
    context_window: int = 0
    """The context window of the model it runs, in tokens, when its usage files do not say (0: unknown, and its
    session is never told its context is filling up)."""

    def command(self, beacon: str, binary: str) -> str:
        """The shell command line the tmux pane runs (``binary`` as found by the witness)."""
        raise NotImplementedError

    def usage_reader(self) -> UsageReader | None:
        """A fresh reader of its ``usage_files``; None when it writes none."""
        return None

    def transcript_entries(self, record: dict[str, Any]) -> list[str]:
        """One decoded line of its ``transcript_files`` as entries (``shared.model.transcripts``)."""
        return []

    def turn_mark(self, record: dict[str, Any]) -> tuple[str, str] | None:
        """One decoded line of its ``transcript_files`` as a prompt typed in or a turn's end
        (``transcripts.answer_to``); None: neither."""
        return None

    def find_binary(
        self, env: Mapping[str, str], on_path: Callable[[str], str | None], project_root: Path | None
    ) -> tuple[str | None, str]:
        """The binary to run and where it was looked for (for a message naming the places when it is missing).
        Its ``binary_setting`` wins (an operator's explicit choice, even when the file is missing: then it is
        reported), then ``PATH``, then the project-local install."""
        configured = env.get(self.binary_setting, "").strip()
        if configured:
            return (configured if Path(configured).is_file() else None), f"{self.binary_setting}={configured}"
        found = on_path(self.binary_name)
        if found:
            return found, "PATH"
        places = f"{self.binary_setting} (not set), PATH"
        if project_root is not None:
            local = project_root / LOCAL_BINARIES / self.binary_name
            places += f", {local}"
            if local.is_file():
                return str(local), places
        return None, places

    def unavailable(self, env: Mapping[str, str], *, logged_in: bool) -> str | None:
        """Why the runtime cannot run with ``env`` (the witness's environment; ``logged_in``: a login dir with
        its credentials is given), or None."""
        return None

    def env(self, witness_env: Mapping[str, str], *, session_dir: str, root: bool) -> dict[str, str]:
        """What the agent gets besides the session's own environment: its config home in the session's runtime
        dir (the operator's own is never read or changed), its settings from the witness's environment."""
        return {}

    def files(self, *, worktree: str, env: Mapping[str, str], version: str, gt: str) -> tuple[RuntimeFile, ...]:
        """Its config and first-run state and its hooks, written before it starts so that no dialog ever blocks
        its pane. ``env``: the witness's environment; ``version``: the binary's; ``gt``: the absolute path of the
        gt the hooks run (never what the agent made of PATH)."""
        return ()

    def login_files(self, env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
        """Credentials of a logged-in config dir the operator named, copied into the session's config home:
        (source path, destination relative to the session's runtime dir). Read, never written to."""
        return ()

    def git_excludes(self) -> tuple[str, ...]:
        """Worktree files the runtime adds that must never be committed (listed in the clone's ``info/exclude``)."""
        return ()

    def hook_answer(self, event: str, text: str | None) -> str:
        """What ``gt agent-hook EVENT`` prints for the runtime: for ``session-start`` the context it adds (``gt
        prime``); for a turn's end, ``text`` is why the agent must go on (None: it may stop)."""
        return text or ""

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


class TuiRuntime(Runtime):
    """A runtime in its own terminal UI whose hooks answer in JSON (Codex CLI, Gemini CLI): its screens are
    patterns (class data), its hooks print ``gt prime`` as SessionStart's ``additionalContext`` and a reason to go
    on as a block of the turn's end."""

    confirms_start = True
    pane_activity = False  # its status line redraws while it waits on a model that never answers
    reads_screen = True
    busy_screen: ClassVar[re.Pattern[str]] = re.compile(r"(?!)")
    """In its footer while a turn runs."""
    retry_screen: ClassVar[re.Pattern[str]] = re.compile(r"(?!)")
    """Its status while it waits out the model API's refusals (a sign of life while it changes)."""
    refusal_screen: ClassVar[re.Pattern[str]] = re.compile(r"(?!)")
    """What it shows for a refused key."""
    blocking_screens: ClassVar[tuple[tuple[str, re.Pattern[str]], ...]] = ()
    nothing_to_say: ClassVar[str] = ""
    """What a hook prints when it has nothing to say."""
    FOOTER_LINES: ClassVar[int] = 8

    def hook_answer(self, event: str, text: str | None) -> str:
        if not text:
            return self.nothing_to_say
        if event == "session-start":
            return json.dumps({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}})
        return json.dumps({"decision": "block", "reason": text})

    def idle(self, screen: str) -> bool:
        bottom = "\n".join([line for line in screen.splitlines() if line.strip()][-self.FOOTER_LINES :])
        return self.busy_screen.search(bottom) is None and self.blocking_screen(screen) is None

    def activity_on_screen(self, screen: str) -> str | None:
        found = self.retry_screen.search(screen)
        return found.group(0) if found is not None else None

    def blocking_screen(self, screen: str) -> str | None:
        for what, pattern in self.blocking_screens:
            found = pattern.search(screen)
            if found is not None:
                return f"{what} ({' '.join(found.group(0).split())[:200]!r})"
        return None

    def refusal(self, failure: Mapping[str, Any] | None, screen: str = "") -> str | None:
        found = self.refusal_screen.search(screen) if screen else None
        return f"the model API refused its credentials ({' '.join(found.group(0).split())[:300]})" if found else None


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


SESSION_TOWN_PATIENCE_S = 90.0
"""How long an agent's ``gt`` call waits for a town that does not answer (gt/cli/patience.py, ``GT_TOWN_PATIENCE``
unset): long enough for a town restart (``gt down`` and ``gt up`` take seconds, a NATS restart about one), and
shorter than Claude Code's Bash tool timeout (``BASH_DEFAULT_TIMEOUT_MS``, 2 minutes by default), so the call
either gets through or fails in its own words before the tool gives up on it."""
HOOK_MARGIN_S = 30
"""What a hook that calls ``gt`` is given beyond the patience (Python's start, the answer)."""


ACTIVITY_HOOK = f': > "${SESSION_DIR_ENV}/{HOOK_MARK_ACTIVITY}"'
"""The PostToolUse hook: one shell redirection (truncating an empty file sets its mtime), no Python, no fork
beyond the ``sh -c`` Claude Code runs it in; it fires after every tool call."""


def log_line_hook(event: str) -> str:
    """A hook that records ``event`` in the session's hook log with a shell builtin and ``date``: no Python."""
    return f'printf "%s {event}\\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >> "${SESSION_DIR_ENV}/{HOOK_LOG}"'


def continue_prompt(restart: Restart) -> str:
    """The nudge that sends a session on after ``restart``."""
    return CONTINUE_PROMPT.format(how=RESTART_SOURCES.get(restart.source, "restarted"))


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
