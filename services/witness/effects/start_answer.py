"""The answer to a session's start hook, written before its pane starts (``START_ANSWER`` in its runtime dir) so
that the hook prints it without starting a `gt` client (``gt.start_hook``): `gt prime` as of the session's
request, in its runtime's words. Read from the town while the session's worktree is prepared. Best effort: without
it the hook asks the town itself, as it always could. Adapter: the town's queries and the session's files."""

from __future__ import annotations

import asyncio

import structlog

from services.witness.effects.toolkit import Toolkit
from services.witness.state import Session
from shared.host import safe_files
from shared.model import runtimes
from shared.model.prime import prime_text, read_prime

log = structlog.get_logger(__name__)

READ_TIMEOUT_S = 2.0
"""How long a start waits for the town's answers to the prime (milliseconds when it is well) before its pane starts
without the answer ready (its hook asks the town then)."""


async def text_for(kit: Toolkit, session: Session, runtime: runtimes.Runtime) -> str | None:
    """What ``session``'s start hook is to print, or None (logged) when the town did not tell in time."""
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            primed = await read_prime(kit.host.read, session.id)
    except Exception as exc:  # noqa: BLE001 - the hook's full way answers instead
        log.warning("start_answer_not_read", session=session.id, error=repr(exc))
        return None
    return runtime.hook_answer("session-start", prime_text(primed))


def write(kit: Toolkit, session: Session, text: str) -> None:
    """Leave ``text`` for the session's start hook, given to the agent's user (it takes the file), never through a
    link the agent left in its runtime dir."""
    owner = (kit.agent_user.uid, kit.agent_user.gid) if kit.agent_user is not None else None
    try:
        safe_files.replace_beneath(kit.session_dir(session), runtimes.START_ANSWER, text, owner=owner)
    except OSError as exc:  # the hook's full way answers instead
        log.warning("start_answer_not_written", session=session.id, error=repr(exc))
