"""The SessionStart hook's fast path: ``gt agent-hook [--runtime R] session-start`` answered from the file the
witness wrote for it, with built-in modules only.

A runtime waits for its start hook before its first model request (Claude Code, Codex CLI, OpenCode), so the
hook's time is the session's. Through the client, the hook pays a Python start, the client's imports (or a
client helper's start: the session's first `gt` call) and three queries: half a second to a second on two cores,
contending with the agent's own start. The witness wrote the same answer before it started the pane
(``start_answer``: ``gt prime`` in the runtime's words, ``START_ANSWER`` in the session's runtime dir); the hook
records itself as the full path does (the hook log's line and the session-start mark the witness waits for),
prints that answer and renames it ``START_ANSWER_TAKEN`` (a later start of the same session, after ``/clear`` or a
compaction, asks the town afresh). It starts nothing: the witness claimed the bead for the polecat when it started
the pane.

Anything else (another event, another option, no answer written yet, no session dir) goes the full way
(``gt.cli.polecats``), which answers every start correctly, only later.
"""

import os
import sys
import time

from shared.core.runtime_dir import (
    HOOK_LOG,
    HOOK_MARK_SESSION_START,
    SESSION_DIR_ENV,
    START_ANSWER,
    START_ANSWER_TAKEN,
    hook_log_line,
)

SESSION_START = "session-start"
HOOK_INPUT_CAP = 1 << 20
S_IFMT, S_IFREG = 0o170000, 0o100000
"""``stat``'s, without its import."""


def answer(argv: list[str]) -> bool:
    """Answer ``gt <argv>`` here when it is a session's start hook whose answer the witness wrote: True when
    answered (printed, recorded), False to run the call the full way."""
    if not _is_start_hook(argv):
        return False
    folder = os.environ.get(SESSION_DIR_ENV, "")
    if not folder or not os.environ.get("GT_SESSION"):
        return False
    path = os.path.join(folder, START_ANSWER)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False  # not written yet (or not a file): the full way asks the town
    try:
        with os.fdopen(fd, "rb") as file:
            if os.fstat(fd).st_mode & S_IFMT != S_IFREG:
                return False  # the agent's doing, not the witness's: never read
            text = file.read().decode()
        # One start answered from it: the next one (after a /clear) asks the town afresh.
        os.rename(path, os.path.join(folder, START_ANSWER_TAKEN))
    except (OSError, UnicodeDecodeError):
        return False
    record(folder, SESSION_START, _start_source())
    sys.stdout.write(text)
    sys.stdout.flush()
    return True


def _is_start_hook(argv: list[str]) -> bool:
    """``agent-hook session-start`` with at most ``--runtime R`` (either order, ``--runtime=R`` too)."""
    if argv[:1] != ["agent-hook"]:
        return False
    rest = argv[1:]
    if SESSION_START not in rest:
        return False
    rest.remove(SESSION_START)
    if not rest:
        return True
    if len(rest) == 1:
        return rest[0].startswith("--runtime=")
    return len(rest) == 2 and rest[0] == "--runtime"


def stamp() -> str:
    """Now, as the hook log writes it (UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def record(folder: str, event: str, detail: str, at: str | None = None) -> str:
    """Add ``event`` to the session's hook log (and, for a start, leave the session-start mark): the witness's
    sign of what the agent did. Returns the stamp written."""
    at = at or stamp()
    with open(os.path.join(folder, HOOK_LOG), "a") as out:
        out.write(hook_log_line(event, detail, at))
    if event == SESSION_START:
        with open(os.path.join(folder, HOOK_MARK_SESSION_START), "w") as out:
            out.write(at + "\n")
    return at


def hook_input() -> dict[str, object]:
    """The JSON object the runtime gave its hook on standard input (a start's ``source``, a failure's ``error``),
    or {} (none, or not an object). The full way's hooks read it here too."""
    if sys.stdin is None or sys.stdin.isatty():
        return {}
    try:
        raw = sys.stdin.read(HOOK_INPUT_CAP)
    except (OSError, ValueError):
        return {}
    if not raw.strip():
        return {}
    import json  # only when there is input: 2 ms

    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _start_source() -> str:
    """The start's ``source`` from the hook's input (startup, resume, clear, compact), or "" (none given)."""
    source = hook_input().get("source")
    return source if isinstance(source, str) else ""
