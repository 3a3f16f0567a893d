"""The files of a session's runtime dir that the agent's hooks and the witness share, by name, and the hook log's
line. Built-in modules only: the start hook's fast path (``gt.start_hook``) imports this before any other."""

HOOK_MARK_SESSION_START = "session-start"
"""The file (in the session's runtime dir) the SessionStart hook leaves: the witness's sign the agent started."""
HOOK_LOG = "hooks.log"
"""One line per hook the runtime fired (``<iso time> <event>``), in the session's runtime dir."""
AGENT_FAILURE = "agent-failure"
"""The file (in the session's runtime dir) the agent's turn-failure hook leaves: JSON ``{"error", "details", "at"}``
of the newest turn that ended on an API error (Claude Code's StopFailure hook)."""
START_ANSWER = "start-answer"
"""The file (in the session's runtime dir) the witness writes once the session started: its SessionStart hook's
answer (``gt prime`` in the runtime's words), printed by the hook's fast path, so that the agent's first model
request does not wait for a `gt` client to start and ask the town (``gt.start_hook``)."""
START_ANSWER_TAKEN = "start-answer.taken"
"""``START_ANSWER`` once the hook printed it (renamed: a later start of the session asks the town afresh): what the
agent was told at its start, for whoever looks into the session."""
SESSION_DIR_ENV = "GT_SESSION_DIR"
"""Names the session's runtime dir (its config home, hook marks) in the agent's environment and its hooks'."""


def hook_log_line(event: str, detail: str, stamp: str) -> str:
    """A line of the session's hook log (``HOOK_LOG``): ``<iso time> <event>[ <detail>]``."""
    return f"{stamp} {event}{' ' + detail if detail else ''}\n"
